"""Every discrete sampler runs on Janus-Pro (a tiny random checkpoint, prompts of different lengths in one batch):
greedy speculative sampling equals greedy AR token for token, and the lossless samplers draw whole images from the
law ``transformers``' own forward pass gives, guidance included (a chi-square test, as for LlamaGen)."""

from __future__ import annotations

import itertools

import pytest
import torch

from vgen.models.conditioning import PrefixCondition
from vgen.samplers import SamplingParams, available_samplers, build_processors, get_sampler
from vgen.samplers.logits import apply_cfg
from vgen.samplers.speculative import sampler as sampler_module
from vgen.samplers.speculative.drafters import Drafter

transformers = pytest.importorskip("transformers", reason="Janus needs transformers (pip install -e '.[t2i]')")

from vgen.models.janus import LoadedJanus, load_janus  # noqa: E402

PROMPTS = ["a red cat", "a big blue dog on the moon under the rain"]
DISCRETE = ["ar", "sjd", "mcsjd", "lantern", "gsd", "speculative"]


@pytest.fixture(scope="module")
def janus(tiny_janus_dir) -> LoadedJanus:
    return load_janus(tiny_janus_dir)


def test_the_discrete_samplers_are_the_raster_ones() -> None:
    assert set(DISCRETE) <= set(available_samplers("raster"))


@pytest.mark.parametrize("name", DISCRETE)
@pytest.mark.parametrize("params", ["greedy-cfg", "sampled-cfg", "filtered-cfg", "interval"])
def test_every_discrete_sampler_runs_on_janus(janus, run_sampler, sampling_table, name, params) -> None:
    model = janus.model
    out = run_sampler(name, model, janus.condition(PROMPTS), sampling_table[params], tokenizer=janus.tokenizer)
    assert out.tokens.shape == (2, model.num_tokens) and out.tokens.dtype == torch.long
    assert int(out.tokens.min()) >= 0 and int(out.tokens.max()) < model.vocab_size
    stats = out.stats
    assert stats.tokens == 2 * model.num_tokens and stats.accept_step.shape == (2, model.num_tokens)
    assert 1 <= stats.forward_passes <= model.num_tokens
    assert bool((stats.accept_step.diff(dim=1) >= 0).all())  # the acceptance map grows along the raster
    images = janus.tokenizer.decode_code(out.tokens, model.grid)
    assert images.shape == (2, 3, 8, 8) and torch.isfinite(images).all()


GREEDY = {"greedy": SamplingParams(temperature=0.0), "greedy-cfg": SamplingParams(temperature=0.0, cfg_scale=5.0),
          "greedy-cfg-interval": SamplingParams(temperature=0.0, cfg_scale=5.0, cfg_interval=5)}


@pytest.mark.parametrize("params", GREEDY.values(), ids=GREEDY.keys())
@pytest.mark.parametrize(("name", "kwargs"), [("sjd", dict(window=4)), ("mcsjd", dict(window=6)),
                                              ("speculative", dict(accept="match", window=5)),
                                              ("lantern", dict(window=4)), ("gsd", dict(window=4))])
def test_greedy_speculative_equals_greedy_ar_on_janus(janus, run_sampler, params, name, kwargs) -> None:
    cond = janus.condition(PROMPTS)
    expected = run_sampler("ar", janus.model, cond, params).tokens
    out = run_sampler(get_sampler(name, **kwargs), janus.model, cond, params, tokenizer=janus.tokenizer)
    assert torch.equal(out.tokens, expected)
    assert out.stats.forward_passes <= janus.model.num_tokens


class Oracle(Drafter):
    """Drafts the greedy AR tokens, each replaced by a wrong one with probability 0.2: long accepted runs, rejections
    mid-window and bonus tokens all happen, in rows that advance apart."""

    name = "oracle"

    def __init__(self, answer: torch.Tensor, vocab_size: int) -> None:
        super().__init__()
        self.answer, self.vocab_size = answer, vocab_size
        self.generator = torch.Generator().manual_seed(123)

    def propose(self, tokens, pos, count, generator):
        drafts = self.answer.gather(1, (pos[:, None] + torch.arange(count)).clamp(max=self.answer.shape[1] - 1))
        wrong = torch.rand(drafts.shape, generator=self.generator) < 0.2
        drafts = torch.where(wrong, (drafts + 1) % self.vocab_size, drafts)
        return drafts, torch.nn.functional.one_hot(drafts, self.vocab_size).float()


@pytest.mark.parametrize("params", GREEDY.values(), ids=GREEDY.keys())
@pytest.mark.parametrize("accept", ["exact", "lantern", "gsd"])
def test_multi_token_verification_on_janus_equals_greedy_ar(janus, run_sampler, params, accept, monkeypatch) -> None:
    cond = janus.condition(PROMPTS)
    expected = run_sampler("ar", janus.model, cond, params).tokens
    oracle = Oracle(expected, janus.model.vocab_size)
    monkeypatch.setattr(sampler_module, "build_drafter", lambda name, options, model, context: oracle)
    out = run_sampler(get_sampler("speculative", accept=accept, window=5), janus.model, cond, params,
                      tokenizer=janus.tokenizer)
    assert torch.equal(out.tokens, expected)
    lengths = out.stats.accepted_lengths
    assert out.stats.forward_passes < janus.model.num_tokens / 2 and max(lengths) == 5 and min(lengths) < 3


# ---- lossless: whole-image law on a 2x2 grid of 4 codes, one prompt -------------------------------------------
ALL_IMAGES = torch.tensor(list(itertools.product(range(4), repeat=4)))  # 256 x 4
LOSSLESS_PARAMS = {"plain": SamplingParams(), "cfg-topk-temp": SamplingParams(cfg_scale=2.0, top_k=3,
                                                                               temperature=0.7)}


@pytest.fixture(scope="module")
def small_janus(tmp_path_factory, tiny_janus_factory) -> tuple[LoadedJanus, torch.nn.Module]:
    folder = tiny_janus_factory(tmp_path_factory.mktemp("janus-small") / "tiny", seed=1, num_embeddings=4, side=2)
    hf = transformers.JanusForConditionalGeneration.from_pretrained(folder, local_files_only=True).eval()
    return load_janus(folder, max_prompt_tokens=16), hf


@torch.no_grad()
def exact_law(hf, cond: PrefixCondition, null: PrefixCondition, params: SamplingParams) -> torch.Tensor:
    """P(image) [256] from ``transformers``' forward pass over the prompt and every image (teacher-forced), under
    guidance, temperature and top-k as the samplers apply them."""
    n, length = len(ALL_IMAGES), cond.length
    rows = [cond, null] if params.guided else [cond]
    text = hf.get_input_embeddings()(torch.cat([c.values.expand(n, -1) for c in rows]))
    images = hf.prepare_embeddings_for_image_generation(ALL_IMAGES[:, :-1]).repeat(len(rows), 1, 1)
    hidden = hf.model.language_model(inputs_embeds=torch.cat([text, images], dim=1)).last_hidden_state
    logits = apply_cfg(hf.model.generation_head(hidden[:, length - 1:]).float(), params, torch.arange(4))
    probs = build_processors(params)(logits).softmax(-1)
    return probs.gather(-1, ALL_IMAGES[..., None])[..., 0].prod(-1)


def image_counts(run_sampler, janus: LoadedJanus, sampler, params: SamplingParams, batches: int = 4,
                 batch: int = 2000) -> torch.Tensor:
    cond = janus.condition(["a red cat"])
    cond = PrefixCondition(cond.values.expand(batch, -1).clone(), cond.mask.expand(batch, -1).clone())
    counts = torch.zeros(256)
    for seed in range(batches):
        tokens = run_sampler(sampler, janus.model, cond, params, seed=seed, tokenizer=janus.tokenizer).tokens
        counts += torch.bincount((tokens * torch.tensor([64, 16, 4, 1])).sum(-1), minlength=256)
    return counts


@pytest.mark.parametrize("params", LOSSLESS_PARAMS.values(), ids=LOSSLESS_PARAMS.keys())
@pytest.mark.parametrize(("sampler", "kwargs"), [("ar", {}), ("mcsjd", dict(window=4))])
def test_lossless_samplers_match_transformers_law_on_janus(chi_square_p, small_janus, run_sampler, params, sampler,
                                                           kwargs) -> None:
    janus, hf = small_janus
    cond = janus.condition(["a red cat"])
    probs = exact_law(hf, cond, janus.model.null_condition(cond), params)
    torch.testing.assert_close(probs.sum(), torch.tensor(1.0))
    counts = image_counts(run_sampler, janus, get_sampler(sampler, **kwargs), params)
    assert chi_square_p(counts, probs) > 1e-3


def test_the_law_test_catches_a_lossy_rule_on_janus(chi_square_p, small_janus, run_sampler) -> None:
    """Power check: GSD with thresholds that group everything accepts nearly any draft and fails the test."""
    janus, hf = small_janus
    params = SamplingParams()
    cond = janus.condition(["a red cat"])
    lossy = get_sampler("gsd", window=3, gsd_p_threshold=1.0, gsd_dist_threshold=2**16)
    counts = image_counts(run_sampler, janus, lossy, params, batches=2)
    assert chi_square_p(counts, exact_law(hf, cond, janus.model.null_condition(cond), params)) < 1e-6
