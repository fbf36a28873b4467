"""On a CUDA device the kernels are compiled for the GPU (not run in Triton's interpreter), ``auto`` dispatch runs
them for CUDA tensors, and each agrees with its torch reference run on the same CUDA tensors: at small sizes and at
LlamaGen's (vocabulary 16384, window 16, 8 samples doubled to 16 rows by CFG, LANTERN's 1000 neighbours, GSD's
768-d embeddings). Inputs are drawn on the CPU from fixed seeds, then moved, so every run sees the same numbers.

Run them alone, ``pytest -m gpu``: a run that also selects the CPU kernel tests loads the interpreter (see
conftest.py), and these skip."""

import functools

import pytest
import torch
import torch.nn.functional as F

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
              pytest.mark.usefixtures("compiled_kernels")]
triton = pytest.importorskip("triton", reason="the kernel tests need triton (pip install -e '.[triton]')")

from vgen.kernels import accept, dispatch, probs, residual, use_backend  # noqa: E402
from vgen.samplers.base import SamplingParams  # noqa: E402
from vgen.samplers.logits import nucleus_edge, target_probs  # noqa: E402
from vgen.samplers.speculative.exact import ExactRule  # noqa: E402
from vgen.samplers.speculative.grouped import GroupedRule  # noqa: E402
from vgen.samplers.speculative.lantern import LanternRule, latent_neighbours  # noqa: E402
from vgen.samplers.speculative.match import MatchRule  # noqa: E402
from vgen.samplers.speculative.rules import accept_drafts, recover  # noqa: E402

CUDA = torch.device("cuda")
# (samples, window, vocabulary): a small odd case and LlamaGen's verify step
SIZES = {"small": (3, 5, 45), "llamagen": (8, 16, 16384)}


def on_cuda(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(t.to(CUDA) for t in tensors)


def model_logits(batch: int, window: int, vocab: int, seed: int) -> torch.Tensor:
    """[2B, L, V] logits whose conditional and unconditional halves share most of their structure, as a real
    model's do (CPU)."""
    g = torch.Generator().manual_seed(seed)
    shared = torch.randn(batch, window, vocab, generator=g) * 2
    return shared.repeat(2, 1, 1) + 0.3 * torch.randn(2 * batch, window, vocab, generator=g)


def kernel_side(op, *args):
    with use_backend("triton"):
        return op(*args)


def test_the_kernels_are_compiled_for_the_gpu_and_auto_runs_them_on_cuda_tensors(launched, monkeypatch) -> None:
    assert not dispatch.interpreted()
    for kernel in (probs.probs_kernel, accept.accept_kernel, residual.residual_kernel):
        assert isinstance(kernel, triton.runtime.JITFunction), type(kernel)  # not the interpreter's function
    monkeypatch.delenv("VGEN_DISABLE_TRITON", raising=False)
    logits = torch.randn(4, 3, 64, generator=torch.Generator().manual_seed(0)).to(CUDA)  # 2 samples' CFG rows, L 3
    params, index = SamplingParams(top_k=8, cfg_scale=2.0), torch.arange(3, device=CUDA)
    p = target_probs(logits, params, index)
    drafts, proposals = p[:, :-1].argmax(-1), p.argmax(-1)
    accepted = accept_drafts(ExactRule(), p[:, :-1], p[:, :-1], drafts, proposals[:, :-1],
                             torch.rand(2, 2, device=CUDA), torch.ones_like(drafts, dtype=torch.bool))
    tokens, _ = recover(ExactRule(), p, p[:, :-1], drafts, proposals, accepted.clamp(max=1), torch.rand(2, device=CUDA))
    assert launched == ["probs_kernel", "accept_kernel", "residual_kernel"]  # auto: every op ran its kernel
    assert accepted.tolist() == [2, 2]  # q = p: every draft is kept
    assert bool((p[:, 1].gather(-1, tokens[:, None]) > 0).all())  # the residual is 0 there: drawn from p itself
    with use_backend("torch"):
        target_probs(logits, params, index)
    monkeypatch.setenv("VGEN_DISABLE_TRITON", "probs")
    target_probs(logits, params, index)
    assert len(launched) == 3  # forced torch, and the op switched off, ran the reference


# ---- target_probs ---------------------------------------------------------------------------------------------
SETTINGS = {
    "plain": SamplingParams(),
    "llamagen": SamplingParams(cfg_scale=4.0, top_k=2000),  # LlamaGen's sample_c2i defaults
    "filtered": SamplingParams(cfg_scale=4.0, top_k=2000, top_p=0.95, temperature=0.9),
    "top-p": SamplingParams(top_p=0.8, temperature=1.3),
    "cfg-interval": SamplingParams(cfg_scale=2.5, cfg_interval=6, top_k=30),  # guidance stops inside the window
    "greedy-cfg": SamplingParams(cfg_scale=4.0, temperature=0.0),
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("setting", SETTINGS)
def test_target_probs_matches_the_reference_on_cuda(setting: str, size: str) -> None:
    params = SETTINGS[setting]
    batch, window, vocab = SIZES[size]
    logits = model_logits(batch, window, vocab, seed=vocab + window)
    logits = (logits if params.guided else logits[:batch]).to(CUDA)
    index = torch.arange(2, 2 + window, device=CUDA)
    reference = target_probs.reference(logits, params, index)
    kernel = kernel_side(target_probs, logits, params, index)
    assert kernel.shape == reference.shape and kernel.dtype == reference.dtype
    assert kernel.device == logits.device
    if params.greedy:
        assert torch.equal(kernel, reference)
        return
    differ = (kernel > 0) != (reference > 0)
    edge = nucleus_edge(logits, params, index)
    assert not bool((differ & ~edge).any()), f"{int((differ & ~edge).sum())} kept tokens differ away from top_p"
    same_rows = ~differ.any(-1)
    assert same_rows.float().mean() >= 0.95  # a cut on the edge is rare
    torch.testing.assert_close(kernel[same_rows], reference[same_rows], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(kernel.sum(-1), torch.ones_like(kernel[..., 0]), rtol=0, atol=1e-5)


# ---- the verify step: accept_drafts and recover ---------------------------------------------------------------
RULE_NAMES = ("exact", "match", "lantern-tv", "lantern-relative", "gsd")


@functools.cache
def rules(size: str) -> dict:
    """Every built-in rule at ``size`` (built on first use: LlamaGen's neighbours take seconds on a CPU)."""
    vocab, lantern_k, embedding_dim = (45, 8, 6) if size == "small" else (16384, 1000, 768)
    g = torch.Generator().manual_seed(0)
    codebook = torch.randn(vocab, 8, generator=g)
    embeddings = torch.randn(vocab, embedding_dim, generator=g) * (0.4 if embedding_dim < 64 else 0.02)
    neighbours = latent_neighbours(codebook, lantern_k)
    return {
        "exact": ExactRule(),
        "match": MatchRule(),
        "lantern-tv": LanternRule(neighbours, delta=0.1),
        "lantern-relative": LanternRule(neighbours[:, :8], delta=2.0, mode="relative"),
        # thresholds where about half the candidates join a group (embedding distances: ~0.61 +- 0.03 at 768-d)
        "gsd": GroupedRule(embeddings, rank_window=7, p_threshold=0.05 if vocab > 1000 else 0.15,
                           dist_threshold=0.62 if vocab > 1000 else 1.0),
    }


def verify_step(size: str, seed: int):
    """One verify step on CPU, as the sampler forms it: p [B, L, V] (LlamaGen's filters, CFG 4), soft draft
    distributions q [B, L - 1, V] near p, drafts drawn from q, the target's proposals, uniforms."""
    batch, window, vocab = SIZES[size]
    g = torch.Generator().manual_seed(seed)
    params = SamplingParams(cfg_scale=4.0, top_k=min(2000, vocab // 3))
    logits = model_logits(batch, window, vocab, seed)
    index = torch.arange(1, window + 1)
    p = target_probs.reference(logits, params, index)
    noise = 0.3 * torch.randn(batch, window - 1, vocab, generator=g).repeat(2, 1, 1)
    q = target_probs.reference(logits[:, :-1] + noise, params, index[:-1])
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).view(batch, window - 1)
    proposals = torch.multinomial(p.reshape(-1, vocab), 1, generator=g).view(batch, window)
    proposals[:, :-1] = torch.where(torch.rand(batch, window - 1, generator=g) < 0.5, drafts, proposals[:, :-1])
    return p, q, drafts, proposals, g


def lantern_margin(rule: LanternRule, p: torch.Tensor, drafts: torch.Tensor) -> float:
    """The smallest distance (float64) between a running neighbour mass and the budget, over every draft: the
    kernel's and torch's cumsums differ in rounding, so the inputs must keep away from a tie."""
    px = p.gather(-1, drafts[..., None]).double()
    mass = p.double().gather(-1, rule.neighbours[drafts])  # [B, J, K], closest first
    limit = (rule.delta - 1) * px if rule.mode == "relative" else torch.full_like(px, rule.delta)
    return float((mass.cumsum(-1) - limit).abs().min())


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("one_hot_q", [False, True], ids=["soft-q", "one-hot-q"])
@pytest.mark.parametrize("name", RULE_NAMES)
def test_accept_drafts_matches_the_reference_on_cuda(name: str, one_hot_q: bool, size: str) -> None:
    """Every window judged under 4 draws of its uniforms and under draws that test one position at a time (the
    drafts before it kept with a draw of 0), so that each position's acceptance probability is compared."""
    p, q, drafts, proposals, g = verify_step(size, seed=1 + one_hot_q)
    if one_hot_q:
        q = F.one_hot(drafts, p.shape[-1]).float()
    batch, count = drafts.shape
    rule = rules(size)[name]
    if isinstance(rule, LanternRule):
        assert lantern_margin(rule, p[:, :-1], drafts) > 1e-6
    uniforms = torch.rand(4, batch, count, generator=g)
    probe = (torch.arange(count)[None, :] >= torch.arange(count)[:, None]).float()  # [position, J]: 0 before it
    probe = probe[:, None] * torch.rand(count, batch, 1, generator=g)
    uniforms = torch.cat([uniforms, probe]).reshape(-1, count)
    n = len(uniforms) // batch
    valid = torch.ones(len(uniforms), count, dtype=torch.bool)
    valid[-1, count // 2:] = False  # one window runs past the end of the image
    args = on_cuda(p[:, :-1].repeat(n, 1, 1), q.repeat(n, 1, 1), drafts.repeat(n, 1), proposals[:, :-1].repeat(n, 1),
                   uniforms, valid)
    reference = accept_drafts.reference(rule, *args)
    kernel = kernel_side(accept_drafts, rule, *args)
    assert kernel.dtype == torch.long and kernel.device == reference.device
    assert torch.equal(kernel, reference), f"{int((kernel != reference).sum())} of {len(kernel)} lengths differ"
    assert 0 < reference.float().mean() < count  # the draws do decide


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("greedy", [False, True], ids=["sampled", "greedy"])
@pytest.mark.parametrize("name", RULE_NAMES)
def test_recover_matches_the_reference_on_cuda(name: str, greedy: bool, size: str) -> None:
    p, q, drafts, proposals, g = verify_step(size, seed=3)
    batch, count = drafts.shape
    rule = rules(size)[name]
    at = torch.randint(count, (batch,), generator=g)
    at[:2] = torch.tensor([0, count - 1])  # the first draft rejected, and only the last
    if isinstance(rule, LanternRule):
        rows = torch.arange(batch)
        assert lantern_margin(rule, p[rows, at][:, None], drafts[rows, at][:, None]) > 1e-6
    uniforms = None if greedy else torch.rand(batch, generator=g).to(CUDA)
    args = (*on_cuda(p, q, drafts, proposals, at), uniforms)
    ref_tokens, ref_residual = recover.reference(rule, *args)
    tokens, res = kernel_side(recover, rule, *args)
    torch.testing.assert_close(res, ref_residual, rtol=1e-5, atol=1e-7)
    assert torch.equal(tokens, ref_tokens) and tokens.dtype == torch.long
    assert tokens.device == ref_tokens.device == args[0].device
    assert bool((res.gather(-1, tokens[:, None]) > 0).all())  # never a token the residual rules out
