"""CSpD's acceptance-plus-residual step returns the target's distribution (statistical oracles, fixed seeds)."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from vgen.samplers.continuous_rules import acceptance_log_ratio, gaussian_log_density, sample_residual


def speculative_step(mean_q, std_q, mean_p, std_p, gen, inner_temperature=1.0, max_tries=4096):
    """Draft x ~ q, keep it with prob min(1, p/q), else a residual sample: the rule CSpD applies per token."""
    x = mean_q + std_q * torch.randn(mean_q.shape, generator=gen, dtype=mean_q.dtype)
    keep = torch.rand(x.shape[0], generator=gen, dtype=x.dtype).log() < acceptance_log_ratio(
        x, mean_q, std_q, mean_p, std_p, inner_temperature)
    fallback = mean_p + std_p * torch.randn(mean_p.shape, generator=gen, dtype=mean_p.dtype)
    residual, fell = sample_residual(mean_p, std_p, mean_q, std_q, fallback, gen, max_tries)
    return torch.where(keep[:, None], x, residual), keep, fell


def full(n, *values):
    return torch.tensor([values], dtype=torch.float64).expand(n, -1)


def test_gaussian_log_density_matches_torch():
    x, m, s = torch.randn(5, 3), torch.randn(5, 3), torch.rand(5, 3) + 0.1
    ref = torch.distributions.Normal(m, s).log_prob(x).sum(-1)
    assert torch.allclose(gaussian_log_density(x, m, s), ref, atol=1e-5)


@pytest.mark.parametrize("target", [(0.5, 1.0), (-0.3, 0.5), (0.0, 1.2)])
def test_one_dimensional_output_is_the_target_gaussian(target):
    n, gen = 20000, torch.Generator().manual_seed(0)
    mp, sp = target
    out, keep, fell = speculative_step(full(n, 0.0), full(n, 0.8), full(n, mp), full(n, sp), gen)
    assert not fell[~keep].any()
    assert 0.05 < keep.double().mean() < 1.0  # both branches are exercised
    assert stats.kstest(out[:, 0].numpy(), "norm", args=(mp, sp)).pvalue > 1e-3
    assert out.mean().item() == pytest.approx(mp, abs=5 * sp / math.sqrt(n))
    assert out.var().item() == pytest.approx(sp ** 2, rel=0.05)


def test_the_draft_alone_would_fail_the_same_test():
    """Guard against a test that cannot fail: the draft's samples are rejected by the KS test."""
    n, gen = 20000, torch.Generator().manual_seed(0)
    draft = 0.0 + 0.8 * torch.randn(n, generator=gen, dtype=torch.float64)
    assert stats.kstest(draft.numpy(), "norm", args=(0.5, 1.0)).pvalue < 1e-6


def test_two_dimensional_output_is_the_target_gaussian_in_every_direction():
    n, gen = 20000, torch.Generator().manual_seed(1)
    mp, sp = (0.4, -0.6), (0.7, 1.2)
    out, _, _ = speculative_step(full(n, 0.0, 0.0), full(n, 1.0, 1.0), full(n, *mp), full(n, *sp), gen)
    for d in range(2):
        assert stats.kstest(out[:, d].numpy(), "norm", args=(mp[d], sp[d])).pvalue > 1e-3
    proj = (out[:, 0] + out[:, 1]).numpy()  # independence shows in the variance of a projection
    assert stats.kstest(proj, "norm", args=(sum(mp), math.hypot(*sp))).pvalue > 1e-3


def test_shared_latent_noise_gives_the_target_mixture():
    """Trajectory alignment: draft and target share a latent (the trajectory noise) and are Gaussian given it;
    the marginal output must be the target's mixture over that latent."""
    n, gen = 30000, torch.Generator().manual_seed(2)
    comp = torch.randint(0, 3, (n,), generator=gen)
    mq, sq = torch.tensor([-1.0, 0.0, 2.0], dtype=torch.float64), torch.tensor([0.5, 0.3, 0.6], dtype=torch.float64)
    mp, sp = torch.tensor([-0.8, 0.3, 1.5], dtype=torch.float64), torch.tensor([0.6, 0.3, 0.4], dtype=torch.float64)
    out, keep, _ = speculative_step(mq[comp, None], sq[comp, None], mp[comp, None], sp[comp, None], gen)
    weights = np.bincount(comp.numpy(), minlength=3) / n

    def mixture_cdf(x):
        return sum(w * stats.norm.cdf(x, m, s) for w, m, s in zip(weights, mp.numpy(), sp.numpy()))

    assert 0.1 < keep.double().mean() < 0.95
    assert stats.kstest(out[:, 0].numpy(), mixture_cdf).pvalue > 1e-3
    for k in range(3):  # and each component on its own
        assert stats.kstest(out[comp == k, 0].numpy(), "norm", args=(mp[k].item(), sp[k].item())).pvalue > 1e-3


def test_residual_sampler_draws_the_normalised_positive_part_of_p_minus_q():
    n, gen = 20000, torch.Generator().manual_seed(3)
    mp, sp, mq, sq = 0.5, 1.0, 0.0, 1.0
    out, fell = sample_residual(full(n, mp), full(n, sp), full(n, mq), full(n, sq), torch.zeros(n, 1), gen)
    assert not fell.any()
    grid = np.linspace(-8, 10, 20001)
    density = np.maximum(stats.norm.pdf(grid, mp, sp) - stats.norm.pdf(grid, mq, sq), 0)
    cdf = np.cumsum(density)
    cdf /= cdf[-1]
    assert stats.kstest(out[:, 0].numpy(), lambda x: np.interp(x, grid, cdf)).pvalue > 1e-3
    assert (out[:, 0] > 0.25).double().mean() > 0.99  # p > q only right of the midpoint 0.25


def test_exhausted_residual_rows_take_the_fallback_and_are_reported():
    n, gen = 200, torch.Generator().manual_seed(4)
    # p and q almost equal: the residual has tiny mass and a single try nearly always fails
    out, fell = sample_residual(full(n, 0.0), full(n, 1.0), full(n, 1e-3), full(n, 1.0), torch.full((n, 1), 7.0),
                                gen, max_tries=1)
    assert fell.double().mean() > 0.9
    assert torch.all(out[fell] == 7.0) and torch.all(out[~fell] != 7.0)
    with pytest.raises(ValueError, match="max_tries"):
        sample_residual(full(1, 0.0), full(1, 1.0), full(1, 0.0), full(1, 1.0), torch.zeros(1, 1), max_tries=0)


def test_inner_temperature_loosens_acceptance_and_biases_the_output():
    n, gen = 20000, torch.Generator().manual_seed(5)
    args = (full(n, 0.0), full(n, 0.1), full(n, 0.3), full(n, 0.1))
    exact, keep1, _ = speculative_step(*args, gen)
    loose, keep42, _ = speculative_step(*args, gen, inner_temperature=42.0)
    assert keep42.double().mean() > 0.95 > keep1.double().mean()
    assert loose.mean().item() < 0.1  # mostly the draft's mean 0.0, not the target's 0.3
    assert exact.mean().item() == pytest.approx(0.3, abs=0.01)
