"""Target-only and CSpD sampling of continuous-token AR models: CSpD is lossless against the target."""

import copy
import dataclasses
import re

import pytest
import torch
from scipy import stats
from torch._dynamo.utils import counters

from vgen.models.llamagen import GPTConfig, LlamaGenGPT
from vgen.models.mar import ContinuousAR, MARConfig
from vgen.samplers import ContinuousARSampler, CSpD, SamplingParams
from vgen.samplers.continuous import chain_draws

CLASS_MEANS = torch.tensor([[-1.0, 0.5], [0.0, -0.5], [1.0, 1.0]])


def toy_batch(n, gen, shift=0.0):
    """Four 2-channel tokens per sample: a class mean plus a random walk, so later tokens depend on earlier."""
    cls = torch.randint(0, 3, (n,), generator=gen)
    walk = torch.cumsum(0.3 * torch.randn(n, 4, 2, generator=gen), 1)
    return cls, CLASS_MEANS[cls][:, None] + shift + walk


def train_toy(seed, shift=0.0, steps=150, **overrides):
    torch.manual_seed(seed)
    cfg = MARConfig(**{**dict(token_channels=2, grid_size=2, dim=32, n_layer=2, n_head=2, num_classes=3,
                                head_width=64, head_depth=2, num_sampling_steps=20, clip_x0=4.0, dropout_p=0.0),
                       **overrides})
    model = ContinuousAR(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        cls, x = toy_batch(128, gen, shift)
        loss = model.loss(cls, x)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def target():
    return train_toy(0)


@pytest.fixture(scope="module")
def draft():
    return train_toy(1, shift=0.6, steps=100, dim=16, head_width=32)


def test_target_only_sampling_learns_the_toy_distribution(run_sampler, target):
    out = run_sampler("continuous-ar", target, torch.arange(3).repeat(200), SamplingParams(), 0)
    assert out.tokens.shape == (600, 4, 2) and out.stats.forward_passes == 4
    for k in range(3):
        mean = out.tokens[k::3, 0].mean(0)
        assert torch.allclose(mean, CLASS_MEANS[k], atol=0.15)


@pytest.mark.parametrize("schedule", ["constant", "linear"])
def test_cspd_with_the_target_as_draft_reproduces_target_sampling_and_keeps_every_draft(run_sampler, target,
                                                                                       schedule):
    """Under either guidance schedule: the draft guides each position as the target does."""
    classes = torch.tensor([0, 1, 2, 1])
    for params in (SamplingParams(), SamplingParams(cfg_scale=2.0)):
        ref = run_sampler(ContinuousARSampler(cfg_schedule=schedule), target, classes, params, 3)
        out = run_sampler(CSpD(draft_length=2, prefill_ratio=0.0, cfg_schedule=schedule), target, classes, params,
                          3, draft_head=copy.deepcopy(target))
        assert torch.allclose(out.tokens, ref.tokens, atol=1e-3)
        # 1 prefill token, then one verification gives 2 drafts + 1 bonus = the remaining 3 tokens
        assert out.stats.forward_passes == 2 and out.stats.accepted_lengths == [3] * 4
        assert out.stats.details["median_draft_gap_in_target_stds"] < 0.05


def test_the_linear_schedule_ramps_guidance_over_the_tokens_to_the_scale(run_sampler, target, monkeypatch):
    """MAR's ``cfg_schedule="linear"``: token i of n is guided at 1 + (s - 1)(i + 1) / n, the last at s; the
    constant schedule guides every token at s."""
    scales = []
    sample = target.head.sample

    def recording(z, noise, temperature, cfg_scale, num_steps, guided, steps):
        scales.append(float(cfg_scale))
        return sample(z, noise, temperature, cfg_scale, num_steps, guided, steps)

    monkeypatch.setattr(target.head, "sample", recording)
    params = SamplingParams(cfg_scale=4.0)
    linear = run_sampler(ContinuousARSampler(cfg_schedule="linear"), target, torch.tensor([1]), params, 0)
    assert scales == pytest.approx([1.75, 2.5, 3.25, 4.0])
    scales.clear()
    constant = run_sampler(ContinuousARSampler(), target, torch.tensor([1]), params, 0)
    assert scales == [4.0] * 4
    assert not torch.equal(linear.tokens, constant.tokens)


def test_head_steps_shorten_the_target_s_chain_for_both_samplers(run_sampler, target):
    """5 of the toy head's 20 steps: other tokens than the full chain's, still near the class means, and CSpD
    with the target as its own draft reproduces them."""
    classes = torch.arange(3).repeat(100)
    params = SamplingParams()
    full = run_sampler("continuous-ar", target, classes, params, 3)
    short = run_sampler(ContinuousARSampler(head_steps=5), target, classes, params, 3)
    assert not torch.allclose(short.tokens, full.tokens, atol=1e-2)
    for k in range(3):
        assert torch.allclose(short.tokens[k::3, 0].mean(0), CLASS_MEANS[k], atol=0.25)
    out = run_sampler(CSpD(draft_length=3, prefill_ratio=0.0, head_steps=5), target, classes, params, 3,
                      draft_head=copy.deepcopy(target))
    assert torch.allclose(out.tokens, short.tokens, atol=1e-3)
    assert out.stats.details["draft_steps"] == 5
    with pytest.raises(ValueError, match="head_steps"):
        ContinuousARSampler(head_steps=-1)
    with pytest.raises(ValueError, match=r"head_steps must be at most 1000 \(the head.s training timesteps\)"):
        run_sampler(ContinuousARSampler(head_steps=1001), target, classes[:1], params, 0)


def test_cspd_drafts_verifies_and_resamples_only_positions_inside_the_image(run_sampler, target):
    """The target as its own draft, with more drafts than the 3 tokens left after the prefill: each row keeps the
    3 drafts inside the image and is done, with no residual sample (nor a fallback) for a position past its end."""
    classes = torch.arange(3).repeat(67)[:200]
    params = SamplingParams()
    ref = run_sampler("continuous-ar", target, classes, params, 4)
    out = run_sampler(CSpD(draft_length=4, prefill_ratio=0.0), target, classes, params, 4,
                      draft_head=copy.deepcopy(target))
    assert out.stats.details["residual_fallbacks"] == 0
    assert torch.allclose(out.tokens, ref.tokens, atol=1e-3)
    assert out.stats.forward_passes == 2 and out.stats.accepted_lengths == [3] * 200
    assert out.stats.draft_forward_passes == 2 + 2  # prefill and prefix, then a pass between 3 drafts
    assert out.stats.details["draft_head_chains"] == 3


def test_cspd_at_temperature_zero_equals_target_only_sampling(run_sampler, target, draft):
    classes = torch.tensor([0, 1, 2])
    params = SamplingParams(temperature=0.0)
    ref = run_sampler("continuous-ar", target, classes, params, 0)
    out = run_sampler("cspd", target, classes, params, 0, draft_head=draft)  # same seed: the initial noise x_T
    # equal up to float rounding: the target denoises a verified window as one batch, target-only one token
    assert torch.allclose(out.tokens, ref.tokens, atol=1e-3)


def test_cspd_output_distribution_equals_the_target_s(run_sampler, target, draft):
    """Two-sample KS per token and channel: CSpD with a visibly different draft against target-only sampling
    on other seeds; the draft's own samples fail the same test (so it can fail)."""
    classes = torch.arange(3).repeat(300)
    params = SamplingParams()
    ref = run_sampler("continuous-ar", target, classes, params, 11).tokens
    out = run_sampler(CSpD(draft_length=3, prefill_ratio=0.0), target, classes, params, 12,
                      draft_head=draft)
    own = run_sampler("continuous-ar", draft, classes, params, 13).tokens
    pvalues = [stats.ks_2samp(out.tokens[:, n, c], ref[:, n, c]).pvalue for n in range(4) for c in range(2)]
    assert min(pvalues) > 1e-3 / 8
    assert min(stats.ks_2samp(own[:, n, c], ref[:, n, c]).pvalue for n in range(4) for c in range(2)) < 1e-6
    assert out.stats.details["residual_fallbacks"] == 0
    assert out.stats.details["median_draft_gap_in_target_stds"] > 1  # a different draft: far apart


def test_a_short_draft_chain_reads_the_first_and_last_of_the_target_s_draws():
    assert chain_draws(20, 20).tolist() == list(range(21))
    assert chain_draws(20, 5).tolist() == [0, 4, 8, 12, 16, 20]
    draws = chain_draws(100, 7)
    assert len(draws) == 8 and draws[0] == 0 and draws[-1] == 100 and bool((draws.diff() > 0).all())
    for bad in (0, 21):
        with pytest.raises(ValueError, match="1 to 20 steps"):
            chain_draws(20, bad)


def test_cspd_with_a_short_draft_chain_keeps_the_target_s_distribution(run_sampler, target, draft):
    """The shifted draft's head chain cut to 5 of the target's 20 steps: CSpD's samples still pass the KS test
    against target-only sampling on other seeds (the draft's own samples fail it: see the test above)."""
    classes = torch.arange(3).repeat(300)
    params = SamplingParams()
    ref = run_sampler("continuous-ar", target, classes, params, 11).tokens
    out = run_sampler(CSpD(draft_length=3, prefill_ratio=0.0, draft_steps=5), target, classes, params, 12,
                      draft_head=draft)
    pvalues = [stats.ks_2samp(out.tokens[:, n, c], ref[:, n, c]).pvalue for n in range(4) for c in range(2)]
    assert min(pvalues) > 1e-3 / 8
    assert out.stats.details["draft_steps"] == 5 and out.stats.details["residual_fallbacks"] == 0


def test_inner_temperature_trades_fidelity_for_acceptance(run_sampler, target, draft):
    classes = torch.arange(3).repeat(100)
    exact = run_sampler("cspd", target, classes, SamplingParams(), 5, draft_head=draft)
    loose = run_sampler(CSpD(inner_temperature=42.0), target, classes, SamplingParams(), 5,
                        draft_head=draft)
    def mean_accepted(out):
        return sum(out.stats.accepted_lengths) / len(out.stats.accepted_lengths)

    assert mean_accepted(loose) > mean_accepted(exact) + 0.5


def test_stats_count_passes_and_tokens(run_sampler, target, draft):
    out = run_sampler("cspd", target, torch.tensor([0, 2]), SamplingParams(), 0, draft_head=draft)
    st = out.stats
    assert st.tokens == 8 and st.batch_size == 2
    assert st.accept_step.shape == (2, 4) and int(st.accept_step.max()) == st.forward_passes
    assert sum(st.accepted_lengths) + 2 * st.details["prefill_tokens"] == 8
    assert st.draft_forward_passes > 0


def test_bad_input_is_refused(run_sampler, target, draft):
    params = SamplingParams()
    with pytest.raises(ValueError, match="latents differ"):
        run_sampler("cspd", target, torch.tensor([0]), params, 0, draft_head=train_toy(2, steps=0, grid_size=4))
    with pytest.raises(ValueError, match="needs a draft"):
        run_sampler("cspd", target, torch.tensor([0]), params, 0)
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match="prefill_ratio"):
            CSpD(prefill_ratio=bad)
    with pytest.raises(ValueError, match="inner_temperature"):
        CSpD(inner_temperature=0.5)
    with pytest.raises(ValueError, match="draft's head chain must take 1 to 20 steps"):
        run_sampler(CSpD(draft_steps=21), target, torch.tensor([0]), params, 0, draft_head=draft)
    with pytest.raises(ValueError, match="top-k"):
        run_sampler("cspd", target, torch.tensor([0]), SamplingParams(top_k=5), 0, draft_head=draft)
    with pytest.raises(ValueError, match="out of range"):
        run_sampler("continuous-ar", target, torch.tensor([3]), params, 0)
    discrete = LlamaGenGPT(GPTConfig(vocab_size=16, dim=32, n_layer=1, n_head=2, num_classes=3, block_size=4)).eval()
    with pytest.raises(ValueError, match=re.escape("sampler 'cspd' does not fit LlamaGenGPT (raster tokens); samplers "
                                                   "that do: ar, gsd, lantern, mcsjd, mcsjd-tree, sjd, speculative")):
        run_sampler("cspd", discrete, torch.tensor([0]), params, 0, draft_head=draft)


@pytest.mark.slow
def test_compiled_samplers_draw_the_eager_tokens(run_sampler, target, draft):
    """``compile=True`` compiles the decode step and the head chains; in fp32 on a CPU the tokens match the eager
    run's for the same seed, guided (a scale per token under the linear schedule, a chain of 7 steps: one call of
    5 and one of 2) or not, and CSpD keeps the same drafts."""
    classes = torch.tensor([0, 2, 1])
    for sampler, params, inputs in (
            (ContinuousARSampler(head_steps=7, cfg_schedule="linear"), SamplingParams(cfg_scale=2.0), {}),
            (CSpD(draft_length=2), SamplingParams(), {"draft_head": draft})):
        eager = run_sampler(sampler, target, classes, params, 5, **inputs)
        graphs = counters["stats"]["unique_graphs"]
        compiled = run_sampler(dataclasses.replace(sampler, compile=True), target, classes, params, 5, **inputs)
        assert counters["stats"]["unique_graphs"] > graphs  # it did compile
        assert torch.allclose(compiled.tokens, eager.tokens, atol=1e-4)
        assert compiled.stats.forward_passes == eager.stats.forward_passes


def test_compile_takes_a_mode_without_cuda_graphs():
    assert ContinuousARSampler(compile="max-autotune-no-cudagraphs").compile == "max-autotune-no-cudagraphs"
    for sampler in (ContinuousARSampler, CSpD):
        with pytest.raises(ValueError, match="compile without CUDA graphs; use compile=True"):
            sampler(compile="reduce-overhead")
        with pytest.raises(ValueError, match="compile must be a bool"):
            sampler(compile="fast")


@pytest.mark.parametrize("name", ["ar", "sjd", "nar", "nbp"])
def test_a_sampler_of_another_order_names_the_samplers_that_fit(run_sampler, target, name):
    with pytest.raises(ValueError, match=re.escape(f"sampler '{name}' does not fit ContinuousAR (continuous tokens); "
                                                   f"samplers that do: continuous-ar, cspd")):
        run_sampler(name, target, torch.tensor([0]), SamplingParams(), 0)
