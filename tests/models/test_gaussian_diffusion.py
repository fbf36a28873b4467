"""The diffusion schedule, loss and reverse chain of the continuous-token head, against closed forms."""

import math

import pytest
import torch

from vgen.models.gaussian_diffusion import (
    DiffusionSchedule,
    cosine_alpha_bar,
    gaussian_nll,
    normal_kl,
    reverse_step,
    sampling_timesteps,
    training_loss,
)


def test_cosine_alpha_bar_follows_the_cosine_formula():
    ab = cosine_alpha_bar(1000)
    f = lambda t: math.cos((t / 1000 + 0.008) / 1.008 * math.pi / 2) ** 2  # noqa: E731
    for t in (0, 10, 500, 900):
        assert ab[t].item() == pytest.approx(f(t + 1) / f(0), rel=1e-6)
    assert torch.all(ab[1:] < ab[:-1])


def test_respacing_keeps_both_ends_and_the_requested_count():
    steps = sampling_timesteps(1000, 100)
    assert len(steps) == 100 and steps[0] == 0 and steps[-1] == 999
    with pytest.raises(ValueError, match="num_sampling_steps"):
        sampling_timesteps(1000, 0)


def test_one_step_keeps_the_noisiest_timestep_and_a_finite_variance():
    """A one-step chain starts from pure noise, so its one step is the last training timestep; its posterior
    variance (0: it lands on the clean token) is clipped to 1 - alpha_bar[0], which a two-step schedule's last step
    comes to as well."""
    ab = cosine_alpha_bar(1000)
    assert sampling_timesteps(1000, 1) == [999] and sampling_timesteps(1000, 2) == [0, 999]
    one, two = (DiffusionSchedule(ab, sampling_timesteps(1000, n)) for n in (1, 2))
    assert one.posterior_log_var.item() == pytest.approx(math.log(1 - ab[0].item()))
    assert two.posterior_log_var[0].item() == pytest.approx(one.posterior_log_var.item(), rel=1e-3)
    assert one.coefficients("cpu").shape == (1, 6) and bool(one.coefficients("cpu").isfinite().all())


def test_respaced_betas_compose_to_the_same_alpha_bar():
    ab = cosine_alpha_bar(1000)
    s = DiffusionSchedule(ab, sampling_timesteps(1000, 25))
    assert torch.allclose(torch.cumprod(1 - s.betas, 0), s.alpha_bar)


def test_true_noise_gives_the_exact_posterior_and_recovers_x0():
    s = DiffusionSchedule(cosine_alpha_bar(1000), range(1000))
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(64, 4, generator=g, dtype=torch.float64)
    noise = torch.randn(64, 4, generator=g, dtype=torch.float64)
    index = torch.randint(0, 1000, (64,), generator=g)
    xt = s.q_sample(x0, index, noise)
    mean, logvar = s.p_mean_logvar(noise, -torch.ones_like(x0), xt, index)
    true_mean, true_logvar = s.posterior(x0, xt, index)
    assert torch.allclose(mean, true_mean, atol=1e-6) and torch.allclose(logvar, true_logvar)
    # v = +1 selects log beta
    _, logvar_hi = s.p_mean_logvar(noise, torch.ones_like(x0), xt, index)
    assert torch.allclose(logvar_hi, s.log_betas[index][:, None].expand_as(x0))


def test_kl_and_nll_closed_forms():
    m1, lv1, m2, lv2 = torch.tensor(0.3), torch.tensor(-0.5), torch.tensor(-0.2), torch.tensor(0.4)
    expected = math.log(math.exp(0.2) / math.exp(-0.25)) + (math.exp(-0.5) + 0.25) / (2 * math.exp(0.4)) - 0.5
    assert normal_kl(m1, lv1, m2, lv2).item() == pytest.approx(expected, rel=1e-5)
    assert normal_kl(m1, lv1, m1, lv1).item() == pytest.approx(0.0, abs=1e-7)
    dist = torch.distributions.Normal(m2, torch.exp(0.5 * lv2))
    assert gaussian_nll(m1, m2, lv2).item() == pytest.approx(-dist.log_prob(m1).item(), rel=1e-5)


def test_reverse_chain_with_the_optimal_denoiser_samples_the_data_distribution():
    """For data N(m, s^2) the optimal noise prediction is closed-form; 100 respaced steps must reproduce it."""
    m, sd = 0.7, 0.4
    ab_all = cosine_alpha_bar(1000)
    s = DiffusionSchedule(ab_all, sampling_timesteps(1000, 100))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(20000, 1, generator=g, dtype=torch.float64)
    for i in reversed(range(len(s))):
        ab = s.alpha_bar[i]
        eps = (1 - ab).sqrt() * (x - ab.sqrt() * m) / (ab * sd ** 2 + 1 - ab)
        noise = torch.randn(x.shape, generator=g, dtype=x.dtype)
        x, mean, std = reverse_step(eps, -torch.ones_like(x), x, s.coefficients("cpu", x.dtype)[i], noise, 1.0)
    assert x.mean().item() == pytest.approx(m, abs=0.02)
    assert x.std().item() == pytest.approx(sd, abs=0.02)
    assert torch.all(std > 0)  # the last step keeps its noise: every token has a Gaussian density


def test_a_one_step_chain_lands_on_the_optimal_estimate_of_the_clean_token():
    """From pure noise, the one step of the optimal denoiser for data N(m, s^2) estimates x0 as about m (the
    noise says next to nothing about x0 at the last timestep), and keeps a small Gaussian of std
    sqrt(1 - alpha_bar[0]) around it when the variance output picks the posterior's (v = -1)."""
    m, sd = 0.7, 0.4
    ab_all = cosine_alpha_bar(1000)
    s = DiffusionSchedule(ab_all, sampling_timesteps(1000, 1))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(20000, 1, generator=g, dtype=torch.float64)
    ab = s.alpha_bar[0]
    eps = (1 - ab).sqrt() * (x - ab.sqrt() * m) / (ab * sd ** 2 + 1 - ab)
    noise = torch.randn(x.shape, generator=g, dtype=x.dtype)
    x, mean, std = reverse_step(eps, -torch.ones_like(x), x, s.coefficients("cpu", x.dtype)[0], noise, 1.0)
    assert mean.mean().item() == pytest.approx(m, abs=1e-3) and mean.std().item() < 1e-3
    assert torch.allclose(std, (1 - ab_all[0]).sqrt().expand_as(std))
    assert x.mean().item() == pytest.approx(m, abs=1e-3)


def test_training_loss_is_small_for_the_optimal_denoiser_and_large_for_a_wrong_one():
    s = DiffusionSchedule(cosine_alpha_bar(1000), range(1000))
    x0 = torch.full((512, 2), 0.5)

    def oracle(xt, t, cond):
        ab = s.alpha_bar[t].float()[:, None]
        eps = (xt - ab.sqrt() * 0.5) / (1 - ab).sqrt()
        return torch.cat([eps, -torch.ones_like(eps)], -1)

    def zero(xt, t, cond):
        return torch.zeros(xt.shape[0], 4)

    g = torch.Generator().manual_seed(0)
    good = training_loss(oracle, s, x0, torch.zeros(512, 1), g)
    bad = training_loss(zero, s, x0, torch.zeros(512, 1), torch.Generator().manual_seed(0))
    assert good.shape == (512,)
    assert good.mean() < 0.05 * bad.mean()
