"""The samplers on a CUDA device: ``auto`` runs the Triton kernels inside them and a seeded run draws the same
tokens as with the torch references; greedy speculative decoding equals greedy vanilla AR token for token (fp32);
and compiled steps, CUDA graphs included, give eager's tokens: ARSampler's decode step, the speculative
samplers' verify pass and the continuous samplers' decode step and head chain. Models are built on the CPU from
fixed seeds, then moved.

Run them alone, ``pytest -m gpu``: a run that also selects the CPU kernel tests loads Triton's interpreter (see
tests/kernels/conftest.py), and these skip."""

import dataclasses
import weakref

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
              pytest.mark.usefixtures("compiled_kernels")]

from vgen.kernels import use_backend  # noqa: E402 (imports no triton: see launched)
from vgen.models.llamagen import GPTConfig  # noqa: E402
from vgen.models.mar import ContinuousAR, MARConfig  # noqa: E402
from vgen.samplers import ARSampler, ContinuousARSampler, CSpD, SamplingParams, compiling, get_sampler  # noqa: E402
from vgen.samplers.compiling import CUDA_GRAPH_MODES, static_cache  # noqa: E402
from vgen.samplers.speculative import sampler as sampler_module  # noqa: E402
from vgen.samplers.speculative.drafters import Drafter  # noqa: E402

CUDA = torch.device("cuda")
KERNELS = {"probs_kernel", "accept_kernel", "residual_kernel"}


def generator(seed: int) -> torch.Generator:
    return torch.Generator(device=CUDA).manual_seed(seed)


class FakeTokenizer(torch.nn.Module):
    """A codebook for LANTERN's neighbours and GSD's embeddings."""

    def __init__(self, vocab: int, dim: int = 8) -> None:
        super().__init__()
        self.vectors = torch.randn(vocab, dim, generator=torch.Generator().manual_seed(0)).to(CUDA)

    def codebook(self) -> torch.Tensor:
        return self.vectors


SMALL = GPTConfig(vocab_size=48, dim=32, n_layer=1, n_head=2, num_classes=3, block_size=16)
LLAMAGEN_VOCAB = GPTConfig(vocab_size=16384, dim=64, n_layer=2, n_head=4, num_classes=3, block_size=64)
RUNS = {
    "sjd-cfg": (SMALL, "sjd", dict(window=4), SamplingParams(cfg_scale=2.0, temperature=0.8)),
    "mcsjd": (SMALL, "mcsjd", dict(window=4), SamplingParams(cfg_scale=2.0, top_p=0.9)),
    "lantern": (SMALL, "lantern", dict(window=4, lantern_k=6, lantern_delta=0.3), SamplingParams()),
    "lantern++": (SMALL, "lantern", dict(window=4, lantern_k=6, lantern_delta=3.0, lantern_mode="relative"),
                  SamplingParams(top_p=0.9)),
    "gsd": (SMALL, "gsd", dict(window=4, gsd_rank_window=3, gsd_dist_threshold=50.0), SamplingParams(cfg_scale=2.0)),
    "match-greedy": (SMALL, "speculative", dict(window=4, accept="match", draft_init="left"),
                     SamplingParams(temperature=0.0, cfg_scale=2.0)),
    "ar-top-k": (SMALL, "ar", {}, SamplingParams(top_k=8, cfg_scale=2.0)),
    # LlamaGen's vocabulary and window, CFG 4. Top-k 20, not LlamaGen's 2000: the kernel's and torch's softmax round
    # differently (about 1e-7), and a seeded run parts for good where a draw lands that close to a boundary between
    # two tokens' cumulative masses: with 2000 tokens in play about 2e-4 per draw (simulated), in a run of ~3000
    # draws; with 20, 100x rarer (the kernel tests compare the ops at top-k 2000 directly)
    "sjd-llamagen": (LLAMAGEN_VOCAB, "sjd", dict(window=16), SamplingParams(cfg_scale=4.0, top_k=20)),
    "lantern-llamagen": (LLAMAGEN_VOCAB, "lantern", dict(window=16, lantern_k=1000, lantern_delta=0.1),
                         SamplingParams(cfg_scale=4.0, top_k=20)),
    "gsd-llamagen": (LLAMAGEN_VOCAB, "gsd", dict(window=16), SamplingParams(cfg_scale=4.0, top_k=20)),
}
# exact acceptance keeps no draft of this random GPT over 16,384 codes (seen on an H100): that run checks the
# rejections and the resampling alone; the small runs and the relaxed rules check kept drafts
KEEPS_NO_DRAFT = {"sjd-llamagen"}


@pytest.mark.parametrize(("config", "name", "options", "params"), RUNS.values(), ids=RUNS.keys())
def test_auto_runs_the_kernels_and_seeded_runs_agree_with_the_references(config, name, options, params,
                                                                         tiny_gpt_factory, launched, request) -> None:
    model, tokenizer = tiny_gpt_factory(config).to(CUDA), FakeTokenizer(config.vocab_size)
    sampler = get_sampler(name, **options)
    classes = torch.tensor([0, 2, 1], device=CUDA)

    def run():
        return sampler.sample(model, classes, params, generator=generator(3), tokenizer=tokenizer)

    with use_backend("torch"):
        reference = run()
    assert launched == []
    kernel = run()  # auto on CUDA tensors: the kernels
    assert set(launched) == ({"probs_kernel"} if name == "ar" else KERNELS)
    assert kernel.tokens.device.type == CUDA.type and torch.equal(kernel.tokens, reference.tokens)
    assert kernel.stats.accepted_lengths == reference.stats.accepted_lengths
    if name != "ar":
        if request.node.callspec.id not in KEEPS_NO_DRAFT:
            assert max(reference.stats.accepted_lengths) > 1  # drafts were kept and rejected
        assert min(reference.stats.accepted_lengths) < sampler.window


GRID = GPTConfig(vocab_size=64, dim=64, n_layer=2, n_head=4, num_classes=5, block_size=36)
GREEDY = {"greedy": SamplingParams(temperature=0.0), "greedy-cfg": SamplingParams(temperature=0.0, cfg_scale=3.0)}


class NoisyOracle(Drafter):
    """Proposes the greedy AR tokens, each replaced by a wrong one with probability ``noise``: long accepted runs,
    rejections mid-window and bonus tokens all happen (Jacobi drafts on a random model are rarely kept)."""

    name = "oracle"

    def __init__(self, answer: torch.Tensor, vocab_size: int, noise: float) -> None:
        super().__init__()
        self.answer, self.vocab_size, self.noise = answer, vocab_size, noise
        self.generator = torch.Generator(device=answer.device).manual_seed(123)

    def propose(self, tokens, pos, count, generator):
        index = (pos[:, None] + torch.arange(count, device=pos.device)).clamp(max=self.answer.shape[1] - 1)
        drafts = self.answer.gather(1, index)
        wrong = torch.rand(drafts.shape, generator=self.generator, device=drafts.device) < self.noise
        drafts = torch.where(wrong, (drafts + 1) % self.vocab_size, drafts)
        return drafts, torch.nn.functional.one_hot(drafts, self.vocab_size).float()


@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("params", GREEDY.values(), ids=GREEDY.keys())
@pytest.mark.parametrize("accept", ["exact", "lantern", "gsd", "match"])
def test_greedy_speculative_equals_greedy_ar_on_cuda(accept: str, params: SamplingParams, backend: str,
                                                     tiny_gpt_factory, monkeypatch) -> None:
    """Lossless: under greedy decoding every rule keeps exactly the target's argmax (fp32), whether the k-token
    verify pass or the one-token AR step computed it."""
    model = tiny_gpt_factory(GRID).to(CUDA)
    classes = torch.tensor([0, 3, 1], device=CUDA)
    with use_backend(backend):
        expected = ARSampler().sample(model, classes, params, generator=generator(0)).tokens
        oracle = NoisyOracle(expected, GRID.vocab_size, noise=0.2)
        monkeypatch.setattr(sampler_module, "build_drafter", lambda name, options, model, context: oracle)
        out = get_sampler("speculative", accept=accept, window=6).sample(
            model, classes, params, generator=generator(0), tokenizer=FakeTokenizer(GRID.vocab_size))
    assert torch.equal(out.tokens, expected), f"{int((out.tokens != expected).sum())} tokens differ"
    assert out.stats.forward_passes < GRID.block_size / 2  # the drafts were used
    assert max(out.stats.accepted_lengths) == 6 and min(out.stats.accepted_lengths) < 3  # kept whole, and not


@pytest.mark.parametrize("params", GREEDY.values(), ids=GREEDY.keys())
@pytest.mark.parametrize("name", ["sjd", "mcsjd", "lantern", "gsd"])
def test_greedy_jacobi_samplers_equal_greedy_ar_on_cuda(name: str, params: SamplingParams, tiny_gpt_factory) -> None:
    model = tiny_gpt_factory(GRID).to(CUDA)
    classes = torch.tensor([0, 3, 1], device=CUDA)
    expected = ARSampler().sample(model, classes, params, generator=generator(0)).tokens
    out = get_sampler(name, window=6).sample(model, classes, params, generator=generator(0),
                                             tokenizer=FakeTokenizer(GRID.vocab_size))
    assert torch.equal(out.tokens, expected), f"{int((out.tokens != expected).sum())} tokens differ"


@pytest.mark.parametrize("mode", ["reduce-overhead", "default"])
def test_compiled_ar_draws_the_eager_tokens_on_cuda(mode: str, tiny_gpt_factory, monkeypatch) -> None:
    """``compile="reduce-overhead"`` (static step under CUDA graphs, one cache kept per model) and ``"default"``
    (dynamic shapes): greedy and seeded sampled tokens equal eager decoding's, on the first call (compiling) and
    the next (replaying)."""
    monkeypatch.setattr(compiling, "_STATIC_CACHES", weakref.WeakKeyDictionary())
    model = tiny_gpt_factory(GPTConfig(vocab_size=512, dim=64, n_layer=2, n_head=4, num_classes=5,
                                       block_size=64)).to(CUDA)
    classes = torch.tensor([0, 3, 1, 4], device=CUDA)
    sampler = ARSampler(compile=mode)
    for params in (SamplingParams(temperature=0.0, cfg_scale=3.0), SamplingParams(top_k=50, cfg_scale=3.0)):
        eager = ARSampler().sample(model, classes, params, generator=generator(5)).tokens
        for _ in range(2):
            compiled = sampler.sample(model, classes, params, generator=generator(5)).tokens
            assert torch.equal(compiled, eager), f"{int((compiled != eager).sum())} of {eager.numel()} tokens differ"
    if mode in CUDA_GRAPH_MODES:
        cache = static_cache(model)
        sampler.sample(model, classes, SamplingParams(temperature=0.0, cfg_scale=3.0))
        assert static_cache(model) is cache  # reused at the same addresses, not reallocated


@pytest.mark.parametrize("mode", ["reduce-overhead", "default"])
@pytest.mark.parametrize("name", ["sjd", "mcsjd", "lantern", "gsd"])
def test_compiled_speculative_samplers_draw_the_eager_tokens_on_cuda(name: str, mode: str, tiny_gpt_factory,
                                                                     monkeypatch) -> None:
    """``compile=`` on a speculative sampler: the verify pass under CUDA graphs (``reduce-overhead``: the cache
    kept per model, the done check every few passes) or inductor alone gives the tokens of the eager loop run on
    the torch references, greedy and seeded, on the first call (compiling) and the next (replaying)."""
    monkeypatch.setattr(compiling, "_STATIC_CACHES", weakref.WeakKeyDictionary())
    model = tiny_gpt_factory(GRID).to(CUDA)
    classes = torch.tensor([0, 3, 1], device=CUDA)
    tokenizer = FakeTokenizer(GRID.vocab_size)
    for params in (SamplingParams(temperature=0.0, cfg_scale=3.0), SamplingParams(top_k=20, cfg_scale=3.0)):
        with use_backend("torch"):
            eager = get_sampler(name, window=6).sample(model, classes, params, generator=generator(5),
                                                       tokenizer=tokenizer).tokens
        for _ in range(2):
            compiled = get_sampler(name, window=6, compile=mode).sample(model, classes, params,
                                                                        generator=generator(5),
                                                                        tokenizer=tokenizer).tokens
            assert torch.equal(compiled, eager), f"{int((compiled != eager).sum())} of {eager.numel()} tokens differ"


def test_compiled_continuous_samplers_draw_the_eager_tokens_on_cuda() -> None:
    """``compile=True`` on the continuous samplers (the decode step and the head chains under inductor): tokens
    within rounding of the eager run's on the same seed, on the first call (compiling) and the next."""
    torch.manual_seed(0)
    config = MARConfig(token_channels=4, grid_size=4, dim=64, n_layer=2, n_head=4, num_classes=5, head_width=64,
                       head_depth=2, num_sampling_steps=12, dropout_p=0.0)
    model, draft = ContinuousAR(config).to(CUDA).eval(), ContinuousAR(config).to(CUDA).eval()
    classes = torch.tensor([0, 3, 1], device=CUDA)
    params = SamplingParams(cfg_scale=3.0)
    for sampler in (ContinuousARSampler(), CSpD(draft_length=3)):
        eager = sampler.sample(model, classes, params, generator=generator(5), draft_head=draft)
        for _ in range(2):
            compiled = dataclasses.replace(sampler, compile=True).sample(model, classes, params,
                                                                         generator=generator(5), draft_head=draft)
            assert torch.allclose(compiled.tokens, eager.tokens, atol=1e-3)
