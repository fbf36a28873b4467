"""The verify loop: greedy output equals vanilla AR token for token, exact acceptance is lossless under sampling
(a chi-square test against the model's exact joint distribution), and the stats describe what happened; on
class-conditional models and on a text-conditional one (LlamaGen-T2I), every discrete sampler."""

import itertools
import json
import math
import weakref
from collections.abc import Callable

import pytest
import torch

from vgen.models.conditioning import Condition, PrefixCondition, cat_conditions
from vgen.models.draft_head import DraftHead, DraftHeadConfig
from vgen.models.llamagen import GPTConfig
from vgen.samplers import ARSampler, Sampler, SamplingParams, build_processors, compiling, get_sampler
from vgen.samplers import ar as ar_module
from vgen.samplers.logits import apply_cfg
from vgen.samplers.speculative import sampler as sampler_module
from vgen.samplers.speculative.drafters import Drafter
from vgen.samplers.speculative.neighbour import NeighbourDrafter

GRID_GPT = GPTConfig(vocab_size=64, dim=64, n_layer=2, n_head=4, num_classes=5, block_size=36)
CLASSES = torch.tensor([0, 3, 1])


def ar_tokens(model, params: SamplingParams, classes: torch.Tensor = CLASSES) -> torch.Tensor:
    return ARSampler().sample(model, classes, params, generator=torch.Generator().manual_seed(0)).tokens


def random_head(model, seed: int = 0) -> DraftHead:
    """An untrained draft head with noisy weights: its drafts are poor, which losslessness must not notice."""
    torch.manual_seed(seed)
    head = DraftHead(DraftHeadConfig.for_target(model.config))
    with torch.no_grad():
        for p in head.parameters():
            if p.ndim > 1:
                p.normal_(std=0.2)
    return head.eval()


class NoisyOracle(Drafter):
    """Proposes the greedy AR tokens, each replaced by a wrong one with probability ``noise``: drafts are often
    right, so long accepted runs, rejections mid-window and bonus tokens all happen."""

    name = "oracle"

    def __init__(self, answer: torch.Tensor, vocab_size: int, noise: float) -> None:
        super().__init__()
        self.answer, self.vocab_size, self.noise = answer, vocab_size, noise
        self.generator = torch.Generator().manual_seed(123)

    def propose(self, tokens, pos, count, generator):
        index = (pos[:, None] + torch.arange(count)).clamp(max=self.answer.shape[1] - 1)
        drafts = self.answer.gather(1, index)
        wrong = torch.rand(drafts.shape, generator=self.generator) < self.noise
        drafts = torch.where(wrong, (drafts + 1) % self.vocab_size, drafts)
        return drafts, torch.nn.functional.one_hot(drafts, self.vocab_size).float()


PARAMS = {"greedy": SamplingParams(temperature=0.0), "greedy-cfg": SamplingParams(temperature=0.0, cfg_scale=3.0),
          "greedy-cfg-interval": SamplingParams(temperature=0.0, cfg_scale=3.0, cfg_interval=10)}


@pytest.mark.parametrize("params", PARAMS.values(), ids=PARAMS.keys())
@pytest.mark.parametrize("window", [2, 5, 16])
@pytest.mark.parametrize("accept", ["exact", "match", "lantern", "gsd"])
def test_greedy_speculative_equals_greedy_ar(params, window, accept, tiny_gpt_factory, monkeypatch) -> None:
    """Every rule is exact under greedy decoding (the target distribution is one-hot), whatever the drafts."""
    model = tiny_gpt_factory(GRID_GPT)
    expected = ar_tokens(model, params)
    oracle = NoisyOracle(expected, GRID_GPT.vocab_size, noise=0.2)
    monkeypatch.setattr(sampler_module, "build_drafter", lambda name, options, model, context: oracle)
    tokenizer = FakeTokenizer(torch.randn(GRID_GPT.vocab_size, 4, generator=torch.Generator().manual_seed(0)))
    out = get_sampler("speculative", accept=accept, window=window).sample(
        model, CLASSES, params, generator=torch.Generator().manual_seed(0), tokenizer=tokenizer)
    assert torch.equal(out.tokens, expected)
    if window > 2:
        assert out.stats.forward_passes < GRID_GPT.block_size / 2  # the drafts were used
    if window <= 5:
        assert max(out.stats.accepted_lengths) == window  # some windows were accepted whole, with a bonus token
    assert min(out.stats.accepted_lengths) < min(3, window)  # and some rejected early


@pytest.mark.parametrize("params", PARAMS.values(), ids=PARAMS.keys())
@pytest.mark.parametrize(("init", "coupling"), [("random", "none"), ("left", "none"), ("vertical", "none"),
                                                ("random", "maximal"), ("vertical", "gumbel")])
def test_greedy_sjd_with_jacobi_drafts_equals_greedy_ar(run_sampler, params, init, coupling, tiny_gpt_factory) -> None:
    model = tiny_gpt_factory(GRID_GPT)
    sampler = get_sampler("sjd", draft_init=init, draft_coupling=coupling, window=6)
    out = run_sampler(sampler, model, CLASSES, params)
    assert torch.equal(out.tokens, ar_tokens(model, params))


@pytest.mark.parametrize("params", PARAMS.values(), ids=PARAMS.keys())
def test_greedy_sjd_with_a_draft_head_equals_greedy_ar(run_sampler, params, tiny_gpt_factory) -> None:
    model = tiny_gpt_factory(GRID_GPT)
    out = run_sampler(get_sampler("sjd", drafter="head", window=5), model, CLASSES, params,
                      draft_head=random_head(model))
    assert torch.equal(out.tokens, ar_tokens(model, params))
    assert out.stats.details["drafter"] == "head"
    assert out.stats.draft_forward_passes == 1 + (out.stats.forward_passes - 1) * 4  # prefill read + L - 1 per pass


class FakeTokenizer(torch.nn.Module):
    def __init__(self, codebook: torch.Tensor) -> None:
        super().__init__()
        self.vectors = codebook

    def codebook(self) -> torch.Tensor:
        return self.vectors


# ---- exact acceptance is lossless: whole-sequence law on a 4-token, 4-symbol model --------------------------
SEQ_GPT = GPTConfig(vocab_size=4, dim=32, n_layer=1, n_head=2, num_classes=2, block_size=4)
ALL_SEQUENCES = torch.tensor(list(itertools.product(range(4), repeat=4)))  # 256 x 4
CLASS_ONE = torch.tensor([1])


def repeat_rows(cond: Condition, n: int) -> Condition:
    """``n`` copies of a one-row condition (class ids [1] or a one-row prefix)."""
    if isinstance(cond, PrefixCondition):
        return PrefixCondition(cond.values.expand(n, -1, -1), cond.mask.expand(n, -1))
    return cond.expand(n)


@torch.no_grad()
def exact_joint(model, params: SamplingParams, cond: Condition = CLASS_ONE) -> torch.Tensor:
    """P(sequence) [256] under the processed (CFG, temperature, top-k) per-token distributions, for the one-row
    condition ``cond`` (class 1 by default)."""
    n = len(ALL_SEQUENCES)
    rows = repeat_rows(cond, n)
    cond = cat_conditions([rows, model.null_condition(rows)]) if params.guided else rows
    inputs = torch.cat([ALL_SEQUENCES, ALL_SEQUENCES]) if params.guided else ALL_SEQUENCES
    logits = apply_cfg(model(cond, inputs[:, :-1]), params, torch.arange(4))
    probs = build_processors(params)(logits).softmax(-1)
    return probs.gather(-1, ALL_SEQUENCES[..., None])[..., 0].prod(-1)


def sequence_counts(run_sampler: Callable, model, sampler: Sampler, params: SamplingParams, batches: int = 4,
                    batch: int = 2000, draft_head=None, cond: Condition = CLASS_ONE) -> torch.Tensor:
    """How often each of the 256 sequences of a 4-token, 4-symbol model comes out of ``batches`` seeded runs of
    the one-row condition ``cond`` (class 1 by default)."""
    counts = torch.zeros(256)
    for seed in range(batches):
        tokens = run_sampler(sampler, model, repeat_rows(cond, batch), params, seed=seed,
                             draft_head=draft_head).tokens
        codes = (tokens * torch.tensor([64, 16, 4, 1])).sum(-1)
        counts += torch.bincount(codes, minlength=256)
    return counts


LOSSLESS_PARAMS = {"plain": SamplingParams(), "cfg-topk-temp": SamplingParams(cfg_scale=2.0, top_k=3,
                                                                               temperature=0.7)}


@pytest.mark.parametrize("params", LOSSLESS_PARAMS.values(), ids=LOSSLESS_PARAMS.keys())
@pytest.mark.parametrize(("sampler", "kwargs"), [("ar", {}), ("sjd", dict(window=3)),
                                                 ("sjd", dict(window=4, draft_init="left")),
                                                 ("sjd", dict(window=3, drafter="head")),
                                                 ("sjd", dict(window=3, draft_coupling="maximal")),
                                                 ("sjd", dict(window=4, draft_coupling="gumbel")),
                                                 ("mcsjd", dict(window=4, drafter="neighbour")),
                                                 ("sjd", dict(window=3, drafter="neighbour")),
                                                 ("speculative", dict(accept="match", window=3))])
def test_lossless_samplers_match_the_exact_joint_distribution(chi_square_p, run_sampler, params, sampler, kwargs,
                                                              tiny_gpt_factory) -> None:
    model = tiny_gpt_factory(SEQ_GPT)
    probs = exact_joint(model, params)
    torch.testing.assert_close(probs.sum(), torch.tensor(1.0))
    head = random_head(model) if kwargs.get("drafter") == "head" else None
    counts = sequence_counts(run_sampler, model, get_sampler(sampler, **kwargs), params, draft_head=head)
    assert chi_square_p(counts, probs) > 1e-3


def test_the_distribution_test_catches_a_lossy_rule(chi_square_p, run_sampler, tiny_gpt_factory) -> None:
    """Power check: GSD with thresholds that group everything accepts nearly any draft and fails the test."""
    model = tiny_gpt_factory(SEQ_GPT)
    params = SamplingParams()
    lossy = get_sampler("gsd", window=3, gsd_p_threshold=1.0, gsd_dist_threshold=2**16)
    counts = sequence_counts(run_sampler, model, lossy, params, batches=2)
    assert chi_square_p(counts, exact_joint(model, params)) < 1e-6


def test_the_distribution_test_catches_drafts_that_misstate_their_law(chi_square_p, run_sampler, tiny_gpt_factory,
                                                                      monkeypatch) -> None:
    """Power check on a drafter: neighbour drafts that take the neighbour's most likely token while claiming to be
    draws from its law (their q) are accepted too often and fail the test that the true draws pass."""
    model = tiny_gpt_factory(SEQ_GPT)
    params = SamplingParams()
    monkeypatch.setattr(NeighbourDrafter, "draw", lambda self, p, pos, generator: p.argmax(-1))
    counts = sequence_counts(run_sampler, model, get_sampler("mcsjd", window=4, drafter="neighbour"), params,
                             batches=2)
    assert chi_square_p(counts, exact_joint(model, params)) < 1e-6


# ---- stats, presets, bad input ------------------------------------------------------------------------------
def test_stats_describe_the_run(run_sampler, tiny_gpt_factory) -> None:
    model = tiny_gpt_factory(GRID_GPT)
    sampler = get_sampler("sjd", window=6, draft_init="vertical")
    out = run_sampler(sampler, model, CLASSES, SamplingParams(cfg_scale=2.0))
    stats, n = out.stats, GRID_GPT.block_size
    assert stats.sampler == "sjd" and stats.details["drafter"] == "jacobi" and stats.details["window"] == 6
    assert stats.tokens == len(CLASSES) * n and stats.batch_size == len(CLASSES)
    assert sum(stats.accepted_lengths) == len(CLASSES) * (n - 1)  # every token after the prefill's
    assert stats.accept_step.shape == (len(CLASSES), n)
    assert int(stats.accept_step.max()) == stats.forward_passes
    assert bool((stats.accept_step.diff(dim=1) >= 0).all())  # raster order: never produced before its left
    row_passes = stats.accept_step.amax(dim=1).double()
    assert stats.tokens_per_forward == pytest.approx(float((n / row_passes).mean()))
    assert stats.batch_tokens_per_forward == pytest.approx(len(CLASSES) * n / stats.forward_passes)
    hist = stats.accepted_length_histogram
    assert sum(hist) == len(stats.accepted_lengths) and hist[0] == 0
    assert stats.to_dict()["details"]["accept"] == "exact"


def test_rows_advance_independently(tiny_gpt_factory, monkeypatch) -> None:
    """One row gets perfect drafts, the other useless ones: the first finishes in a few passes."""
    model = tiny_gpt_factory(GRID_GPT)
    params = SamplingParams(temperature=0.0)
    expected = ar_tokens(model, params, CLASSES[:2])
    oracle = NoisyOracle(expected, GRID_GPT.vocab_size, noise=0.0)
    oracle.answer = torch.stack([expected[0], (expected[1] + 1) % GRID_GPT.vocab_size])
    monkeypatch.setattr(sampler_module, "build_drafter", lambda name, options, model, context: oracle)
    out = get_sampler("sjd", window=8).sample(model, CLASSES[:2], params)
    assert torch.equal(out.tokens, expected)
    last_pass = out.stats.accept_step[:, -1]
    assert int(last_pass[0]) == 1 + math.ceil((GRID_GPT.block_size - 1) / 8)
    assert int(last_pass[1]) == GRID_GPT.block_size


def test_lantern_with_zero_budget_is_mcsjd(run_sampler, tiny_gpt_factory) -> None:
    """The preset drafts as mcsjd does, so a zero budget leaves exact acceptance."""
    model = tiny_gpt_factory(GRID_GPT)
    tok = FakeTokenizer(torch.randn(GRID_GPT.vocab_size, 4))
    params = SamplingParams(cfg_scale=2.0)
    lantern = get_sampler("lantern", lantern_delta=0.0, window=6).sample(
        model, CLASSES, params, generator=torch.Generator().manual_seed(0), tokenizer=tok)
    assert torch.equal(lantern.tokens, run_sampler(get_sampler("mcsjd", window=6), model, CLASSES, params).tokens)
    assert lantern.stats.details["drafter"] == "jacobi"


def test_presets_are_drafter_and_rule_pairs() -> None:
    assert (get_sampler("sjd").drafter, get_sampler("sjd").accept) == ("jacobi", "exact")
    assert (get_sampler("sjd").draft_coupling, get_sampler("sjd").draft_init) == ("none", "random")  # SJD's own
    assert (get_sampler("lantern").drafter, get_sampler("lantern").accept) == ("jacobi", "lantern")
    assert (get_sampler("gsd").drafter, get_sampler("gsd").accept) == ("jacobi", "gsd")
    for coupled in ("mcsjd", "lantern", "gsd"):  # Jacobi drafts coupled and vertically initialised
        assert (get_sampler(coupled).draft_coupling, get_sampler(coupled).draft_init) == ("gumbel", "vertical")
    assert get_sampler("mcsjd").accept == "exact"
    sampler = get_sampler("speculative", drafter="jacobi", accept="lantern", lantern_k=5, lantern_delta=0.2)
    assert get_sampler(sampler.to_dict()) == sampler


def test_lantern_needs_a_tokenizer(run_sampler, tiny_gpt_factory) -> None:
    with pytest.raises(ValueError, match="needs the VQ tokenizer's codebook"):
        run_sampler("lantern", tiny_gpt_factory(GRID_GPT), CLASSES, SamplingParams())


def test_a_missing_draft_head_is_a_clear_error(run_sampler, tiny_gpt_factory) -> None:
    with pytest.raises(ValueError, match="needs a draft head, and this model ships none"):
        run_sampler(get_sampler("speculative", drafter="head"), tiny_gpt_factory(GRID_GPT), CLASSES, SamplingParams())


def test_lantern_drafts_with_the_head_on_request_and_auto_takes_it_when_there_is_one(tiny_gpt_factory) -> None:
    model = tiny_gpt_factory(GRID_GPT)
    tok = FakeTokenizer(torch.randn(GRID_GPT.vocab_size, 4))
    for drafter in ("head", "auto"):
        out = get_sampler("lantern", window=4, drafter=drafter).sample(model, CLASSES, SamplingParams(),
                                                                       draft_head=random_head(model), tokenizer=tok)
        assert out.stats.details["drafter"] == "head" and out.stats.draft_forward_passes > 0
    plain = get_sampler("lantern", window=4).sample(model, CLASSES, SamplingParams(), draft_head=random_head(model),
                                                    tokenizer=tok)
    assert plain.stats.details["drafter"] == "jacobi" and plain.stats.draft_forward_passes == 0


def test_a_head_for_another_model_is_refused(run_sampler, tiny_gpt_factory) -> None:
    model = tiny_gpt_factory(GRID_GPT)
    other = random_head(tiny_gpt_factory(GPTConfig(vocab_size=64, dim=32, n_layer=1, n_head=4, num_classes=5,
                                                   block_size=36)))
    with pytest.raises(ValueError, match="does not fit a target"):
        run_sampler(get_sampler("sjd", drafter="head"), model, CLASSES, SamplingParams(), draft_head=other)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(window=-1), "window must be an integer in \\[0, 65536\\] \\(0 = the device's"),
    (dict(window=2.5), "window must be an integer in \\[0, 65536\\]"),
    (dict(lantern_k=-1), "lantern_k must be an integer in \\[0, 262144\\]"),
    (dict(lantern_delta=1.5), "total-variation budget in \\[0, 1\\]"),
    (dict(lantern_mode="relative", lantern_delta=0.5), "lambda >= 1"),
    (dict(drafter="eagle"), "unknown drafter 'eagle'"),
    (dict(accept="greedy"), "unknown acceptance rule 'greedy'"),
    (dict(draft_init="diagonal"), "draft_init must be one of"),
    (dict(draft_coupling="optimal"), "draft_coupling must be one of"),
    (dict(gsd_p_threshold=2.0), "gsd_p_threshold must be in"),
])
def test_bad_settings_are_rejected_on_construction(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        get_sampler("speculative", **kwargs)


# ---- a text-conditional model: LlamaGen-T2I (caption prefix, left-padded, CFG with its uncond_embedding) ---------
GRID_T2I = GPTConfig(vocab_size=64, dim=64, n_layer=2, n_head=4, block_size=36, model_type="t2i", caption_dim=16,
                     cls_token_num=12)
SAMPLERS = {"ar": {}, "sjd": dict(window=6), "mcsjd": dict(window=6), "lantern": dict(window=6),
            "gsd": dict(window=6), "speculative": dict(accept="exact", window=5)}


def prompts(config: GPTConfig, lengths: tuple[int, ...], seed: int = 0) -> PrefixCondition:
    """Random caption features, left-padded to ``cls_token_num`` (zeros on the padding, as LlamaGen's sampler)."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(len(lengths), config.cls_token_num, config.caption_dim, generator=g)
    mask = torch.arange(config.cls_token_num)[None, :] >= config.cls_token_num - torch.tensor(lengths)[:, None]
    return PrefixCondition(values * mask[..., None], mask)


PROMPTS = prompts(GRID_T2I, (4, 11, 1))
GREEDY_CFG = SamplingParams(temperature=0.0, cfg_scale=3.0)


def tokenizer() -> FakeTokenizer:
    return FakeTokenizer(torch.randn(GRID_T2I.vocab_size, 4, generator=torch.Generator().manual_seed(0)))


@pytest.fixture
def t2i_model(tiny_gpt_factory):
    return tiny_gpt_factory(GRID_T2I)


@pytest.fixture
def ar_greedy(t2i_model) -> torch.Tensor:
    return ARSampler().sample(t2i_model, PROMPTS, GREEDY_CFG).tokens


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_greedy_samplers_equal_greedy_ar_on_a_t2i_model(run_sampler, name, t2i_model, ar_greedy) -> None:
    """Every rule is exact under greedy decoding; LANTERN's and GSD's neighbourhoods come from the codebook."""
    out = run_sampler(get_sampler(name, **SAMPLERS[name]), t2i_model, PROMPTS, GREEDY_CFG, tokenizer=tokenizer())
    assert torch.equal(out.tokens, ar_greedy)
    assert out.stats.accept_step.shape == ar_greedy.shape
    json.dumps(out.stats.to_dict())


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_every_sampler_samples_a_t2i_model_with_guidance(run_sampler, name, t2i_model, sampling_table) -> None:
    out = run_sampler(get_sampler(name, **SAMPLERS[name]), t2i_model, PROMPTS, sampling_table["filtered-cfg"],
                      tokenizer=tokenizer())
    assert out.tokens.shape == (3, GRID_T2I.block_size)
    assert int(out.tokens.min()) >= 0 and int(out.tokens.max()) < GRID_T2I.vocab_size
    assert out.stats.tokens == 3 * GRID_T2I.block_size and out.stats.forward_passes <= GRID_T2I.block_size
    assert json.loads(json.dumps(out.stats.to_dict(per_token=True)))["accept_step"] == out.stats.accept_step.tolist()


def test_rows_at_different_places_keep_their_own_caption_masked(t2i_model, ar_greedy, monkeypatch) -> None:
    """Noisy oracle drafts make each row accept different lengths, so the rows' windows start at different slots."""
    oracle = NoisyOracle(ar_greedy, GRID_T2I.vocab_size, noise=0.3)
    monkeypatch.setattr(sampler_module, "build_drafter", lambda name, options, model, context: oracle)
    out = get_sampler("speculative", window=5).sample(t2i_model, PROMPTS, GREEDY_CFG,
                                                     generator=torch.Generator().manual_seed(0))
    assert torch.equal(out.tokens, ar_greedy)
    assert len({tuple(row) for row in out.stats.accept_step.tolist()}) > 1  # the rows did advance differently


def test_the_static_decode_step_samples_a_t2i_model(t2i_model, ar_greedy, monkeypatch) -> None:
    """The CUDA-graph modes' step (run eagerly here) writes past the caption."""
    monkeypatch.setattr(ar_module, "compiled_step", lambda mode: ar_module._decode_step)
    monkeypatch.setattr(compiling, "_STATIC_CACHES", weakref.WeakKeyDictionary())
    sampler = ARSampler(compile="reduce-overhead")
    for _ in range(2):  # the second run reuses the cache, its caption mask rewritten
        assert torch.equal(sampler.sample(t2i_model, PROMPTS, GREEDY_CFG).tokens, ar_greedy)


# ---- exact acceptance is lossless on a text-conditional model, guidance inside the tested law --------------------
SEQ_T2I = GPTConfig(**{**SEQ_GPT.to_dict(), "model_type": "t2i", "caption_dim": 8, "cls_token_num": 5})


def test_sjd_on_a_t2i_model_matches_the_exact_joint_distribution_with_guidance(chi_square_p, run_sampler,
                                                                               tiny_gpt_factory) -> None:
    model = tiny_gpt_factory(SEQ_T2I)
    prompt = prompts(SEQ_T2I, (3,))
    params = SamplingParams(cfg_scale=2.0, top_k=3, temperature=0.7)
    probs = exact_joint(model, params, prompt)
    torch.testing.assert_close(probs.sum(), torch.tensor(1.0))
    counts = sequence_counts(run_sampler, model, get_sampler("sjd", window=3), params, cond=prompt)
    assert chi_square_p(counts, probs) > 1e-3
    # the test has power here too: the unguided law is another one
    assert chi_square_p(counts, exact_joint(model, SamplingParams(top_k=3, temperature=0.7), prompt)) < 1e-6


# ---- compile=: the static verify pass, run eagerly here, and compiled for real in the slow tests ----------------
COMPILED_SAMPLERS = {**{name: SAMPLERS[name] for name in ("sjd", "mcsjd", "lantern", "gsd")},
                     "sjd-maximal": dict(window=6, draft_coupling="maximal"),
                     "speculative-head": dict(window=5, drafter="head")}


def static_run(name: str, model, cond: Condition, params: SamplingParams, seed: int = 0, **options):
    """A run of preset ``name`` (a :data:`COMPILED_SAMPLERS` key) with its options and ``options``."""
    preset = name.split("-")[0]
    inputs = {"draft_head": random_head(model)} if name == "speculative-head" else {}
    return get_sampler(preset, **{**COMPILED_SAMPLERS[name], **options}).sample(
        model, cond, params, generator=torch.Generator().manual_seed(seed), tokenizer=tokenizer(), **inputs)


@pytest.mark.parametrize("params", ["greedy-cfg", "filtered-cfg"])
@pytest.mark.parametrize("name", COMPILED_SAMPLERS)
def test_the_static_pass_of_a_compiled_run_draws_the_eager_runs_tokens(name, params, t2i_model, sampling_table,
                                                                        monkeypatch) -> None:
    """What a compiled run computes (attention over the whole cache under a mask, every draft judged, the ops'
    torch references, its random numbers drawn before the pass), here without compiling: for the same seed the
    same tokens, acceptance map and accepted lengths as the eager loop, on rows with captions of different
    lengths that advance apart."""
    monkeypatch.setattr(sampler_module, "compile_step", lambda step, mode, config=None: step)
    params = {**sampling_table, **PARAMS}[params]
    eager = static_run(name, t2i_model, PROMPTS, params)
    static = static_run(name, t2i_model, PROMPTS, params, compile=True)
    assert torch.equal(static.tokens, eager.tokens)
    assert torch.equal(static.stats.accept_step, eager.stats.accept_step)
    assert static.stats.accepted_lengths == eager.stats.accepted_lengths
    assert static.stats.forward_passes == eager.stats.forward_passes
    if name != "speculative-head":  # a random head's drafts are all rejected: its rows move in step
        assert len({tuple(row) for row in eager.stats.accept_step.tolist()}) > 1  # the rows did advance apart


@pytest.mark.parametrize(("name", "fused"), [("mcsjd", True), ("lantern", True), ("gsd", True), ("sjd", False),
                                             ("sjd-maximal", False), ("speculative-head", False)])
def test_a_compiled_run_drafts_inside_the_pass_where_nothing_is_drawn_between_passes(name, fused, t2i_model,
                                                                                   monkeypatch) -> None:
    """Outside CUDA graphs, the Jacobi drafter of the coupled presets (Gumbel coupling, vertical drafts) runs in
    the pass's own graph; drafters that draw between passes (random guesses, maximal-coupling redraws) or run a
    model (the head) keep their own steps. The CUDA-graph modes keep them apart too."""
    called = []

    def compile_step(step, mode, config=None):
        return lambda *args: called.append((step.__name__, mode)) or step(*args)

    monkeypatch.setattr(sampler_module, "compile_step", compile_step)
    monkeypatch.setattr(compiling, "_STATIC_CACHES", weakref.WeakKeyDictionary())
    static_run(name, t2i_model, PROMPTS, GREEDY_CFG, compile=True)
    steps = {step for step, mode in called if mode == "default"}
    assert ("verify_and_draft" in steps, "verify_pass" in steps) == (fused, not fused)
    called.clear()
    static_run(name, t2i_model, PROMPTS, GREEDY_CFG, compile="reduce-overhead")
    assert ("verify_pass", "reduce-overhead") in called and all(step != "verify_and_draft" for step, _ in called)


def test_compile_takes_a_bool_or_a_torch_compile_mode_on_every_speculative_preset() -> None:
    for name in ("sjd", "mcsjd", "lantern", "gsd", "speculative"):
        assert get_sampler(name, compile="reduce-overhead").compile_mode == "reduce-overhead"
        assert get_sampler(name, compile=True).compile_mode == "default"
        assert get_sampler(name).compile_mode is None
        with pytest.raises(ValueError, match="compile must be a bool, got 'fast'"):
            get_sampler(name, compile="fast")


@pytest.mark.slow
@torch.no_grad()
def test_compiled_verify_passes_equal_eager_ones_and_compile_once_per_batch_and_window(tiny_gpt_factory,
                                                                                      sampling_table) -> None:
    """torch.compile (inductor, CPU) of the verify pass with the Jacobi drafter's step inside it: the eager run's
    tokens for the same seed, greedy and sampled; the pass attends only up to the rows' last window, whose end
    becomes a dynamic size after the first pass, so a rule compiles at most twice for every cache length of every
    run; a new window length or batch is one new graph."""
    from torch._dynamo.utils import counters

    model = tiny_gpt_factory(GRID_GPT)
    params = sampling_table["filtered-cfg"]
    counters.clear()
    for name in ("mcsjd", "gsd"):
        for seed in (0, 1):
            eager = static_run(name, model, CLASSES, params, seed)
            compiled = static_run(name, model, CLASSES, params, seed, compile=True)
            assert torch.equal(compiled.tokens, eager.tokens)
            assert compiled.stats.accepted_lengths == eager.stats.accepted_lengths
    graphs = counters["stats"]["unique_graphs"]
    assert 2 <= graphs <= 4  # per rule the first pass's graph, then one for every cache length
    static_run("mcsjd", model, CLASSES, params, 2, compile=True)
    assert counters["stats"]["unique_graphs"] == graphs
    static_run("mcsjd", model, CLASSES[:2], params, compile=True)
    assert counters["stats"]["unique_graphs"] == graphs + 1
    static_run("mcsjd", model, CLASSES, params, compile=True, window=4)
    assert counters["stats"]["unique_graphs"] == graphs + 2


@pytest.mark.slow
@torch.no_grad()
@torch._dynamo.config.patch(recompile_limit=3)
def test_one_process_compiles_more_configurations_than_dynamos_recompile_limit(tiny_gpt_factory,
                                                                               sampling_table) -> None:
    """Each configuration (options, drafter, window) compiles into a code object of its own, so a window sweep
    past Dynamo's recompile limit (graphs a code object may hold; lowered here to keep the test short) keeps
    compiling, and each run is eager's."""
    model = tiny_gpt_factory(GRID_GPT)
    params = sampling_table["filtered-cfg"]
    for window in range(2, 6):
        eager = static_run("lantern", model, CLASSES, params, window=window)
        assert torch.equal(static_run("lantern", model, CLASSES, params, window=window, compile=True).tokens,
                           eager.tokens)


@pytest.mark.slow
def test_compiled_sjd_matches_the_exact_joint_distribution(chi_square_p, run_sampler, tiny_gpt_factory) -> None:
    model = tiny_gpt_factory(SEQ_GPT)
    params = LOSSLESS_PARAMS["cfg-topk-temp"]
    counts = sequence_counts(run_sampler, model, get_sampler("sjd", window=3, compile=True), params)
    assert chi_square_p(counts, exact_joint(model, params)) > 1e-3


def test_passes_run_past_every_rows_end_change_nothing(t2i_model, sampling_table, monkeypatch) -> None:
    """On a GPU a compiled run asks whether every row is done only every few passes: the passes it runs after a
    row's (or the batch's) end write nothing and count for nothing (checked on the CPU with the GPU's cadence)."""
    monkeypatch.setattr(sampler_module, "compile_step", lambda step, mode, config=None: step)
    monkeypatch.setattr(sampler_module, "reads_are_free", lambda device: False)
    monkeypatch.setattr(sampler_module, "DONE_CHECK_PASSES", 5)
    params = sampling_table["filtered-cfg"]
    eager = static_run("mcsjd", t2i_model, PROMPTS, params)
    sparse = static_run("mcsjd", t2i_model, PROMPTS, params, compile=True)
    assert eager.stats.forward_passes % 5 != 1  # so the last check came after idle passes
    assert torch.equal(sparse.tokens, eager.tokens) and torch.equal(sparse.stats.accept_step, eager.stats.accept_step)
    assert sparse.stats.forward_passes == eager.stats.forward_passes
    assert sparse.stats.accepted_lengths == eager.stats.accepted_lengths


def test_the_cuda_graph_modes_keep_one_cache_per_model_and_window(t2i_model, monkeypatch) -> None:
    """compile="reduce-overhead" (its pass run eagerly here): the cache stays at its addresses from run to run, a
    window of another length gets its own, and the tokens are the eager loop's."""
    monkeypatch.setattr(sampler_module, "compile_step", lambda step, mode, config=None: step)
    monkeypatch.setattr(compiling, "_STATIC_CACHES", weakref.WeakKeyDictionary())
    eager = static_run("mcsjd", t2i_model, PROMPTS, GREEDY_CFG).tokens
    assert torch.equal(static_run("mcsjd", t2i_model, PROMPTS, GREEDY_CFG, compile="reduce-overhead").tokens, eager)
    cache = compiling.static_cache(t2i_model)
    assert torch.equal(static_run("mcsjd", t2i_model, PROMPTS, GREEDY_CFG, compile="reduce-overhead").tokens, eager)
    assert compiling.static_cache(t2i_model) is cache
    static_run("mcsjd", t2i_model, PROMPTS, GREEDY_CFG, compile="reduce-overhead", window=4)
    assert compiling.static_cache(t2i_model) is not cache
