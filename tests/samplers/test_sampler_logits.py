"""Logits processors against a row-by-row re-implementation of LlamaGen's sample() / top_k_top_p_filtering."""

import itertools
import re

import pytest
import torch
import torch.nn.functional as F

from vgen.samplers import (
    LogitsProcessorList,
    SamplingParams,
    Temperature,
    TopK,
    TopP,
    apply_cfg,
    build_processors,
    cfg_merge,
    sample_logits,
    sample_probs,
)
from vgen.samplers.logits import inverse_cdf, target_probs


def reference_filter(row: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """LlamaGen on one row [V]: logits / T, then HF top-k and nucleus filtering, written out step by step."""
    row = row / temperature
    v = row.shape[0]
    if top_k > 0:
        kth = sorted(row.tolist(), reverse=True)[min(top_k, v) - 1]
        row = torch.where(row < kth, torch.tensor(-torch.inf), row)
    if top_p < 1.0:
        sorted_logits, order = torch.sort(row, descending=True)
        probs = F.softmax(sorted_logits, dim=-1).tolist()
        keep = torch.zeros(v, dtype=torch.bool)
        mass = 0.0
        for j in range(v):
            keep[order[j]] = j == 0 or mass <= top_p  # dropped once the mass before it exceeds top_p
            mass += probs[j]
        row = torch.where(keep, row, torch.tensor(-torch.inf))
    return row


@pytest.mark.parametrize("temperature,top_k,top_p", list(itertools.product(
    [0.7, 1.0, 1.6], [0, 1, 7, 50, 64], [1.0, 0.9, 0.5, 0.01])))
def test_chain_matches_llamagen_reference(temperature: float, top_k: int, top_p: float) -> None:
    logits = torch.randn(2, 3, 50, generator=torch.Generator().manual_seed(0)) * 3
    out = build_processors(SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))(logits)
    ref = torch.stack([reference_filter(r, temperature, top_k, top_p) for r in logits.reshape(-1, 50)])
    ref = ref.view_as(logits)
    assert torch.equal(torch.isinf(out), torch.isinf(ref))
    torch.testing.assert_close(out[~torch.isinf(out)], ref[~torch.isinf(ref)], rtol=1e-6, atol=1e-6)


def test_processors_do_not_modify_their_input() -> None:
    logits = torch.randn(4, 30)
    before = logits.clone()
    build_processors(SamplingParams(temperature=0.5, top_k=5, top_p=0.5))(logits)
    assert torch.equal(logits, before)


def test_top_k_keeps_every_tie_of_the_kth_value() -> None:
    logits = torch.tensor([5.0, 4.0, 4.0, 1.0, 4.0, 0.0])
    out = TopK(2)(logits)
    assert torch.isinf(out).tolist() == [False, False, False, True, False, True]


def test_top_p_keeps_the_smallest_prefix_reaching_the_mass() -> None:
    logits = torch.tensor([0.15, 0.5, 0.1, 0.25]).log()  # sorted masses: .5, .75, .9, 1
    kept = {p: (~torch.isinf(TopP(p)(logits))).nonzero().flatten().tolist() for p in (0.4, 0.7, 0.8, 0.95)}
    assert kept == {0.4: [1], 0.7: [1, 3], 0.8: [0, 1, 3], 0.95: [0, 1, 2, 3]}


def test_top_p_ranks_equal_logits_in_vocabulary_order() -> None:
    logits = torch.tensor([0.0, 0.0, 0.0, 0.0, -9.0])  # four ties of ~.25; the masses before them: 0, .25, .5, .75
    assert (~torch.isinf(TopP(0.5)(logits))).tolist() == [True, True, True, False, False]
    assert (~torch.isinf(TopP(0.5)(logits.flip(0)))).tolist() == [False, True, True, True, False]


def test_top_p_always_keeps_the_most_likely_token() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 0.0]])
    out = TopP(1e-9)(logits)
    assert (~torch.isinf(out)).tolist() == [[False, True, False], [True, False, False]]


@pytest.mark.parametrize("processor", [TopK(0), TopK(16), TopK(100), TopP(1.0), Temperature(1.0)],
                         ids=["top_k=0", "top_k=V", "top_k>V", "top_p=1", "temperature=1"])
def test_neutral_settings_change_nothing(processor) -> None:
    logits = torch.randn(3, 16)
    assert torch.equal(processor(logits), logits)


def test_neutral_params_build_an_empty_chain_and_greedy_skips_temperature() -> None:
    assert build_processors(SamplingParams()) == []
    assert build_processors(SamplingParams(temperature=0.0)) == []
    chain = build_processors(SamplingParams(temperature=0.5, top_k=3, top_p=0.9))
    assert [type(p) for p in chain] == [Temperature, TopK, TopP]


def test_processors_are_vectorised_over_leading_dims() -> None:
    logits = torch.randn(2, 5, 3, 40)
    chain = LogitsProcessorList([Temperature(0.8), TopK(9), TopP(0.6)])
    rows = torch.stack([chain(r) for r in logits.reshape(-1, 40)]).view_as(logits)
    assert torch.equal(chain(logits), rows)


@pytest.mark.parametrize("make,message", [
    (lambda: Temperature(0.0),
     "Temperature needs temperature > 0, got 0.0 (temperature 0 means greedy and is not a processor)"),
    (lambda: Temperature(-1.5), "Temperature needs temperature > 0, got -1.5"),
    (lambda: Temperature(float("nan")), "Temperature needs temperature > 0, got nan"),
    (lambda: TopK(-1), "TopK needs an integer top_k >= 0 (0 = off), got -1"),
    (lambda: TopK(2.5), "TopK needs an integer top_k >= 0 (0 = off), got 2.5"),
    (lambda: TopK(True), "TopK needs an integer top_k >= 0 (0 = off), got True"),
    (lambda: TopP(0.0), "TopP needs top_p in (0, 1] (1 = off), got 0.0"),
    (lambda: TopP(1.2), "TopP needs top_p in (0, 1] (1 = off), got 1.2"),
    (lambda: TopP(float("nan")), "TopP needs top_p in (0, 1] (1 = off), got nan"),
])
def test_bad_processor_arguments_raise(make, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        make()


def test_cfg_merge_is_llamagen_guidance() -> None:
    cond, uncond = torch.randn(2, 10), torch.randn(2, 10)
    torch.testing.assert_close(cfg_merge(cond, uncond, 4.0), uncond + 4.0 * (cond - uncond))
    torch.testing.assert_close(cfg_merge(cond, uncond, 1.0), cond)


def test_apply_cfg_splits_the_doubled_batch() -> None:
    cond, uncond = torch.randn(2, 10), torch.randn(2, 10)
    both = torch.cat([cond, uncond])
    assert torch.equal(apply_cfg(both, SamplingParams(cfg_scale=1.0), 0), both)  # no guidance: untouched
    guided = apply_cfg(both, SamplingParams(cfg_scale=3.0), 7)
    torch.testing.assert_close(guided, cfg_merge(cond, uncond, 3.0))
    assert torch.equal(apply_cfg(both, SamplingParams(cfg_scale=3.0, cfg_interval=2), 4), cond)


def test_apply_cfg_on_a_window_switches_per_position() -> None:
    cond, uncond = torch.randn(2, 6, 10), torch.randn(2, 6, 10)
    params = SamplingParams(cfg_scale=2.0, cfg_interval=1)  # tokens 0..2 guided, 3.. conditional only
    out = apply_cfg(torch.cat([cond, uncond]), params, torch.arange(1, 7))  # the window predicts tokens 1..6
    torch.testing.assert_close(out[:, :2], cfg_merge(cond, uncond, 2.0)[:, :2])
    assert torch.equal(out[:, 2:], cond[:, 2:])


def test_greedy_takes_the_argmax_without_drawing() -> None:
    logits = torch.randn(3, 4, 20)
    g = torch.Generator().manual_seed(3)
    state = g.get_state()
    tokens, probs = sample_logits(logits, greedy=True, generator=g)
    assert torch.equal(tokens, logits.argmax(-1))
    assert torch.equal(probs, F.one_hot(tokens, 20).float())
    assert torch.equal(g.get_state(), state)


def test_sampling_is_a_seeded_multinomial_draw() -> None:
    logits = torch.randn(5, 20)
    tokens, probs = sample_logits(logits, generator=torch.Generator().manual_seed(11))
    expected = torch.multinomial(logits.softmax(-1), 1, generator=torch.Generator().manual_seed(11))[:, 0]
    assert torch.equal(tokens, expected)
    torch.testing.assert_close(probs, logits.softmax(-1))


def test_sample_probs_follows_the_distribution_over_any_leading_shape() -> None:
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4]).expand(200, 100, 4)
    tokens = sample_probs(probs, torch.Generator().manual_seed(0))
    assert tokens.shape == (200, 100)
    freq = torch.bincount(tokens.flatten(), minlength=4).float() / tokens.numel()
    torch.testing.assert_close(freq, probs[0, 0], atol=0.015, rtol=0)  # 20000 draws: 4 standard errors


def test_target_probs_is_the_guided_processed_softmax() -> None:
    logits = torch.randn(4, 3, 30, generator=torch.Generator().manual_seed(0)) * 2
    params = SamplingParams(temperature=0.8, top_k=10, top_p=0.9, cfg_scale=2.0, cfg_interval=3)
    index = torch.arange(3, 6)
    expected = build_processors(params)(apply_cfg(logits, params, index)).softmax(-1)
    torch.testing.assert_close(target_probs(logits, params, index), expected)
    greedy = target_probs(logits, SamplingParams(temperature=0.0), 0)
    assert torch.equal(greedy, F.one_hot(logits.argmax(-1), 30).float())


def test_inverse_cdf_takes_the_first_token_whose_running_mass_exceeds_the_draw() -> None:
    probs = torch.tensor([0.0, 0.25, 0.0, 0.25, 0.5, 0.0])  # running mass .25, .5, 1 at tokens 1, 3, 4 (exact)
    draws = torch.tensor([0.0, 0.24, 0.25, 0.49, 0.5, 0.99, 1 - 2 ** -24])
    assert inverse_cdf(probs.expand(7, 6), draws).tolist() == [1, 1, 3, 3, 4, 4, 4]
    assert inverse_cdf(probs * 3, draws).tolist() == [1, 1, 3, 3, 4, 4, 4]  # unnormalised weights, same law
    assert inverse_cdf(probs.expand(7, 6), draws, torch.float32).tolist() == [1, 1, 3, 3, 4, 4, 4]


def test_inverse_cdf_of_uniform_draws_follows_the_distribution() -> None:
    probs = torch.tensor([0.1, 0.0, 0.2, 0.3, 0.4])
    tokens = inverse_cdf(probs.expand(20000, 5), torch.rand(20000, generator=torch.Generator().manual_seed(0)))
    freq = torch.bincount(tokens, minlength=5).float() / tokens.numel()
    torch.testing.assert_close(freq, probs, atol=0.015, rtol=0)  # 20000 draws: 4 standard errors


def test_inverse_cdf_at_uniform_draws_follows_the_distribution_over_any_leading_shape() -> None:
    probs = torch.tensor([0.1, 0.0, 0.2, 0.3, 0.4]).expand(200, 100, 5)
    tokens = inverse_cdf(probs, torch.rand(200, 100, generator=torch.Generator().manual_seed(0)), torch.float32)
    assert tokens.shape == (200, 100)
    freq = torch.bincount(tokens.flatten(), minlength=5).float() / tokens.numel()
    torch.testing.assert_close(freq, probs[0, 0], atol=0.015, rtol=0)  # 20000 draws: 4 standard errors
