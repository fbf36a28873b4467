"""Every discrete sampler runs on Emu3 (a tiny random checkpoint, prompts of different lengths in one batch, the
docs' negative prompt): greedy speculative sampling equals greedy AR code for code, and the lossless samplers draw
whole images from the law ``transformers`` gives (its forward pass over the prompt and the image with its row ends,
guided as ``UnbatchedClassifierFreeGuidanceLogitsProcessor`` guides, masked to the visual tokens as the docs'
``prefix_allowed_tokens_fn`` masks, then temperature and top-k): a chi-square test on a 2x2 image of 4 codes."""

from __future__ import annotations

import itertools

import pytest
import torch

from vgen.models.conditioning import PrefixCondition
from vgen.samplers import SamplingParams, get_sampler

transformers = pytest.importorskip("transformers", reason="Emu3 needs transformers (pip install -e '.[t2i]')")

from vgen.models.emu3 import LoadedEmu3, load_emu3  # noqa: E402

PROMPTS = ["a red star", "a big blue dog on the moon under the rain"]


@pytest.fixture(scope="module")
def emu3(tiny_emu3_dir) -> LoadedEmu3:
    return load_emu3(tiny_emu3_dir, image_area=576)  # 3 x 3 codes of 64


DISCRETE = ["ar", "sjd", "mcsjd", "lantern", "gsd", "speculative"]


@pytest.mark.parametrize("name", DISCRETE)
def test_every_discrete_sampler_runs_on_emu3(emu3, run_sampler, name) -> None:
    """Codes only (the row ends stay inside the model), LANTERN's codebook and GSD's code embeddings included."""
    out = run_sampler(name, emu3.model, emu3.condition(PROMPTS), SamplingParams(cfg_scale=3.0, top_k=20),
                      tokenizer=emu3.tokenizer)
    assert out.tokens.shape == (2, 9) and int(out.tokens.min()) >= 0 and int(out.tokens.max()) < 64
    assert out.stats.tokens == 2 * 9 and out.stats.accept_step.shape == (2, 9)
    assert 1 <= out.stats.forward_passes <= 9


GREEDY = {"greedy": SamplingParams(temperature=0.0), "greedy-cfg": SamplingParams(temperature=0.0, cfg_scale=3.0)}


@pytest.mark.parametrize("params", GREEDY.values(), ids=GREEDY.keys())
@pytest.mark.parametrize(("name", "kwargs"), [("sjd", dict(window=4)), ("mcsjd", dict(window=5)),
                                              ("speculative", dict(accept="match", window=4))])
def test_greedy_speculative_equals_greedy_ar_on_emu3(emu3, run_sampler, params, name, kwargs) -> None:
    cond = emu3.condition(PROMPTS)
    expected = run_sampler("ar", emu3.model, cond, params).tokens
    out = run_sampler(get_sampler(name, **kwargs), emu3.model, cond, params, tokenizer=emu3.tokenizer)
    assert torch.equal(out.tokens, expected)
    assert out.stats.tokens == 2 * 9 and out.stats.accept_step.shape == (2, 9)
    assert out.stats.forward_passes <= emu3.model.num_tokens


# ---- lossless: whole-image law on a 2x2 grid of 4 codes, one prompt (a short negative prompt: a fast prefill) ------
NEGATIVE = "lowres, blurry."
ALL_IMAGES = torch.tensor(list(itertools.product(range(4), repeat=4)))  # 256 x 4
LOSSLESS_PARAMS = {"plain": SamplingParams(), "cfg-topk-temp": SamplingParams(cfg_scale=3.0, top_k=3,
                                                                               temperature=1.2)}


@pytest.fixture(scope="module")
def small_emu3(tmp_path_factory, tiny_emu3_factory) -> tuple[LoadedEmu3, torch.nn.Module]:
    folder = tiny_emu3_factory(tmp_path_factory.mktemp("emu3-small") / "tiny", seed=1, codebook_size=4)
    hf = transformers.Emu3ForConditionalGeneration.from_pretrained(folder, local_files_only=True).eval()
    return load_emu3(folder, image_area=256, max_prompt_tokens=16), hf  # 2 x 2 codes


@torch.no_grad()
def transformers_law(hf, emu3: LoadedEmu3, cond: PrefixCondition, params: SamplingParams) -> torch.Tensor:
    """P(image) [256]: ``transformers``' logits over prompt + image (row ends in place) at the positions that
    predict codes, guided on the log-softmax of the whole vocabulary, masked to the visual tokens, tempered and
    top-k filtered as ``generate``'s processors do, then the product of each code's probability."""
    layout, code_ids = emu3.model.config.layout, emu3.model.code_ids
    image = layout.sequence(code_ids[ALL_IMAGES])
    slots = layout.code_slots()

    def logits(prompt: torch.Tensor) -> torch.Tensor:
        ids = torch.cat([prompt.expand(len(image), -1), image], dim=1)
        return hf(ids).logits[:, prompt.shape[1] - 1 + slots].log_softmax(-1)

    scores = logits(cond.values)
    if params.guided:
        unconditional = logits(cond.null.values)
        scores = params.cfg_scale * (scores - unconditional) + unconditional
    allowed = torch.full_like(scores, float("-inf"))
    allowed[..., code_ids] = 0
    scores = (scores + allowed).flatten(0, 1)
    warpers = [transformers.TemperatureLogitsWarper(params.temperature)]
    if params.top_k:
        warpers.append(transformers.TopKLogitsWarper(params.top_k))
    for warp in warpers:
        scores = warp(None, scores)
    probs = scores.softmax(-1).view(len(image), len(slots), -1)[..., code_ids]
    return probs.gather(-1, ALL_IMAGES[..., None])[..., 0].prod(-1)


def image_counts(run_sampler, emu3: LoadedEmu3, sampler, params: SamplingParams, batches: int = 2,
                 batch: int = 2000) -> torch.Tensor:
    cond = emu3.condition(["a red star"], NEGATIVE)
    cond = PrefixCondition(cond.values.expand(batch, -1).clone(), cond.mask.expand(batch, -1).clone(),
                           PrefixCondition(cond.null.values.expand(batch, -1).clone(),
                                           cond.null.mask.expand(batch, -1).clone()))
    counts = torch.zeros(256)
    for seed in range(batches):
        tokens = run_sampler(sampler, emu3.model, cond, params, seed=seed, tokenizer=emu3.tokenizer).tokens
        counts += torch.bincount((tokens * torch.tensor([64, 16, 4, 1])).sum(-1), minlength=256)
    return counts


@pytest.mark.parametrize("params", LOSSLESS_PARAMS.values(), ids=LOSSLESS_PARAMS.keys())
@pytest.mark.parametrize(("sampler", "kwargs"), [("ar", {}), ("mcsjd", dict(window=4))])
def test_lossless_samplers_match_transformers_law_on_emu3(chi_square_p, small_emu3, run_sampler, params, sampler,
                                                          kwargs) -> None:
    emu3, hf = small_emu3
    probs = transformers_law(hf, emu3, emu3.condition(["a red star"], NEGATIVE), params)
    torch.testing.assert_close(probs.sum(), torch.tensor(1.0))
    assert probs.max() < 0.5  # a spread law, not one image that any sampler would hit
    counts = image_counts(run_sampler, emu3, get_sampler(sampler, **kwargs), params)
    assert chi_square_p(counts, probs) > 1e-3


def test_the_law_test_catches_a_lossy_rule_on_emu3(chi_square_p, small_emu3, run_sampler) -> None:
    """Power check: GSD with thresholds that group everything accepts nearly any draft and fails the test."""
    emu3, hf = small_emu3
    params = SamplingParams()
    lossy = get_sampler("gsd", window=3, gsd_p_threshold=1.0, gsd_dist_threshold=2**16)
    counts = image_counts(run_sampler, emu3, lossy, params)
    assert chi_square_p(counts, transformers_law(hf, emu3, emu3.condition(["a red star"], NEGATIVE), params)) < 1e-6
