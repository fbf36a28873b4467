"""Every discrete sampler runs on a model whose sequence holds fixed tokens among the codes (a row end after every
row, a head ending the prompt: :class:`~vgen.models.mllm.LayoutLM`), seeing codes only: greedy speculative sampling
equals greedy AR token for token, guided by each row's own negative prompt or not, on the eager, static and
compiled paths; the lossless samplers draw whole images from the law of a plain forward pass over the full sequence
(a chi-square test whose windows cross a row end), and the same counts reject the law of the same weights without
row ends and a lossy rule's; stats and acceptance maps count codes."""

from __future__ import annotations

import itertools

import pytest
import torch

from vgen.models.conditioning import PrefixCondition
from vgen.samplers import SamplingParams, build_processors, get_sampler
from vgen.samplers import ar as ar_module
from vgen.samplers.logits import apply_cfg
from vgen.samplers.speculative import sampler as sampler_module

GRID = (3, 4)  # 12 codes, rows of 4 then a row end
DISCRETE = ["ar", "sjd", "mcsjd", "lantern", "gsd", "speculative"]
GREEDY = {"greedy": SamplingParams(temperature=0.0), "greedy-cfg": SamplingParams(temperature=0.0, cfg_scale=3.0)}
SPECULATIVE = [("sjd", dict(window=4)), ("mcsjd", dict(window=6)), ("speculative", dict(accept="match", window=5))]


class Codebook(torch.nn.Module):
    """A tokenizer's code vectors, all LANTERN reads."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.vectors = torch.randn(vocab_size, 4, generator=torch.Generator().manual_seed(0))

    def codebook(self) -> torch.Tensor:
        return self.vectors


@pytest.fixture(scope="module")
def model(tiny_layout_lm):
    return tiny_layout_lm(GRID, qk_norm=True)


@pytest.fixture(scope="module")
def cond(model, layout_prompts) -> PrefixCondition:
    """Two prompts of different lengths, each with a negative prompt of its own length."""
    prompts = layout_prompts(model, (4, 1))
    return PrefixCondition(prompts.values, prompts.mask, layout_prompts(model, (2, 5), seed=3))


@pytest.mark.parametrize("name", DISCRETE)
def test_every_discrete_sampler_fills_the_codes_only(model, cond, run_sampler, sampling_table, name) -> None:
    out = run_sampler(name, model, cond, sampling_table["sampled-cfg"], tokenizer=Codebook(model.vocab_size))
    assert out.tokens.shape == (2, 12) and int(out.tokens.min()) >= 0 and int(out.tokens.max()) < model.vocab_size
    assert out.stats.tokens == 2 * 12 and out.stats.accept_step.shape == (2, 12)
    assert 1 <= out.stats.forward_passes <= 12 and bool((out.stats.accept_step.diff(dim=1) >= 0).all())


@pytest.mark.parametrize("params", GREEDY.values(), ids=GREEDY.keys())
@pytest.mark.parametrize(("name", "kwargs"), SPECULATIVE)
def test_greedy_speculative_equals_greedy_ar(model, cond, run_sampler, params, name, kwargs) -> None:
    expected = run_sampler("ar", model, cond, params).tokens
    out = run_sampler(get_sampler(name, **kwargs), model, cond, params)
    assert torch.equal(out.tokens, expected)
    assert out.stats.forward_passes < 12  # windows were accepted across row ends


@pytest.mark.parametrize("mode", [True, "reduce-overhead"])
def test_the_static_paths_equal_greedy_ar(model, cond, run_sampler, monkeypatch, mode) -> None:
    """What compiled runs compute, run eagerly: the static verify pass (attending up to the rows' last window, or
    the whole cache) and the CUDA-graph AR step (the code and its row end, always)."""
    monkeypatch.setattr(sampler_module, "compile_step", lambda step, mode, config=None: step)
    monkeypatch.setattr(ar_module, "compiled_step", lambda mode: ar_module._decode_step)
    params = GREEDY["greedy-cfg"]
    expected = run_sampler("ar", model, cond, params).tokens
    if mode == "reduce-overhead":
        assert torch.equal(run_sampler(get_sampler("ar", compile=mode), model, cond, params).tokens, expected)
    for name, kwargs in SPECULATIVE:
        assert torch.equal(run_sampler(get_sampler(name, compile=mode, **kwargs), model, cond, params).tokens,
                           expected)


@pytest.mark.slow
@torch.no_grad()
def test_a_compiled_ar_run_equals_the_eager_one(model, cond, run_sampler) -> None:
    """torch.compile of the decode step: two graphs (a code inside a row, a code and its row end)."""
    from torch._dynamo.utils import counters

    params = GREEDY["greedy-cfg"]
    counters.clear()
    compiled = run_sampler(get_sampler("ar", compile=True), model, cond, params).tokens
    assert torch.equal(compiled, run_sampler("ar", model, cond, params).tokens)
    assert counters["stats"]["unique_graphs"] == 2


# ---- lossless: whole-image law on a 2x2 grid of 4 codes, one prompt -------------------------------------------
ALL_IMAGES = torch.tensor(list(itertools.product(range(4), repeat=4)))  # 256 x 4
LOSSLESS_PARAMS = {"plain": SamplingParams(), "cfg-topk-temp": SamplingParams(cfg_scale=2.0, top_k=3,
                                                                               temperature=0.7)}


@pytest.fixture(scope="module")
def small(tiny_layout_lm, layout_prompts):
    """A 2x2 model of 4 codes (a row end after each row of 2) and one prompt with its negative prompt."""
    model = tiny_layout_lm((2, 2), vocab_size=4, seed=2)
    prompt = layout_prompts(model, (3,))
    return model, PrefixCondition(prompt.values, prompt.mask, layout_prompts(model, (1,), seed=4))


def exact_law(model, cond: PrefixCondition, params: SamplingParams, reference) -> torch.Tensor:
    """P(image) [256] from the reference forward over every image, under guidance, temperature and top-k as the
    samplers apply them."""
    rows = [cond, cond.null] if params.guided else [cond]
    logits = torch.cat([reference(model, c.values[0][c.mask[0]], ALL_IMAGES) for c in rows])
    probs = build_processors(params)(apply_cfg(logits, params, torch.arange(4))).softmax(-1)
    return probs.gather(-1, ALL_IMAGES[..., None])[..., 0].prod(-1)


def image_counts(run_sampler, model, cond: PrefixCondition, sampler, params: SamplingParams,
                 images: int = 2000) -> torch.Tensor:
    tokens = run_sampler(sampler, model, cond[torch.zeros(images, dtype=torch.long)], params).tokens
    return torch.bincount((tokens * torch.tensor([64, 16, 4, 1])).sum(-1), minlength=256).float()


@pytest.mark.parametrize("params", LOSSLESS_PARAMS.values(), ids=LOSSLESS_PARAMS.keys())
@pytest.mark.parametrize(("sampler", "kwargs"), [("ar", {}), ("mcsjd", dict(window=4))])
def test_lossless_samplers_draw_the_full_sequence_law(chi_square_p, small, run_sampler, layout_reference, params,
                                                      sampler, kwargs) -> None:
    model, cond = small
    probs = exact_law(model, cond, params, layout_reference)
    torch.testing.assert_close(probs.sum(), torch.tensor(1.0))
    counts = image_counts(run_sampler, model, cond, get_sampler(sampler, **kwargs), params)
    assert chi_square_p(counts, probs) > 1e-3
    # the test has power: the same weights without row ends give another law, which the counts reject
    plain = type(model)(type(model.config)(**{**model.config.to_dict(), "row_end": []})).eval()
    plain.load_state_dict(model.state_dict())
    assert chi_square_p(counts, exact_law(plain, cond, params, layout_reference)) < 1e-6


def test_the_law_test_catches_a_lossy_rule(chi_square_p, small, run_sampler, layout_reference) -> None:
    """GSD with thresholds that group everything accepts nearly any draft and fails the test."""
    model, cond = small
    params = SamplingParams()
    lossy = get_sampler("gsd", window=3, gsd_p_threshold=1.0, gsd_dist_threshold=2**16)
    counts = image_counts(run_sampler, model, cond, lossy, params)
    assert chi_square_p(counts, exact_law(model, cond, params, layout_reference)) < 1e-6
