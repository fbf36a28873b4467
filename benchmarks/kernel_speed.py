"""Each Triton kernel against its torch reference on one verify step at LlamaGen sizes.

On a GPU it prints, per op and setting, the median time of the torch reference and of the kernel over interleaved
repeats (CUDA synchronised), the speed-up, and whether both gave the same result. Without a GPU it runs the
kernels in Triton's interpreter on the same inputs (about 30 s of CPU time at the default sizes) and prints only the
agreement: speed needs a GPU. Either way it exits with status 1 if any kernel disagreed with its reference.

Sizes default to LlamaGen's: vocabulary 16384, window 16, 8 samples doubled to 16 rows by CFG (scale 4,
top-k 2000), LANTERN's k = 1000 latent neighbours, GSD's rank window 7 over GPT-B's 768-d embeddings.

    python benchmarks/kernel_speed.py                    # GPU: speed-ups; CPU: the interpreter check
    python benchmarks/kernel_speed.py --vocab 1000 --repeats 100
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from vgen.kernels import load_interpreted, use_backend

GPU = torch.cuda.is_available()
if not GPU:
    load_interpreted()  # before anything imports triton

from vgen.samplers.base import SamplingParams  # noqa: E402
from vgen.samplers.logits import nucleus_edge, target_probs  # noqa: E402
from vgen.samplers.speculative.exact import ExactRule  # noqa: E402
from vgen.samplers.speculative.grouped import GroupedRule  # noqa: E402
from vgen.samplers.speculative.lantern import LanternRule, latent_neighbours  # noqa: E402
from vgen.samplers.speculative.rules import accept_drafts, recover  # noqa: E402


@dataclass
class Case:
    """One op call: ``run()`` calls the dispatching op; ``same(a, b)`` says whether two outputs agree and
    ``describe(out)`` what the reference's output was (so that an agreement is seen not to be trivial)."""

    op: str
    setting: str
    run: Callable[[], object]
    same: Callable[[object, object], bool]
    describe: Callable[[object], str]


def same_probs(edge: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor], bool]:
    """Agreement of two target distributions: the same kept tokens except on the nucleus edge (``edge``, from
    :func:`~vgen.samplers.logits.nucleus_edge`: float32 rounding decides those), and equal probabilities within
    float32 rounding on the rows that keep the same tokens."""

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        differ = (a > 0) != (b > 0)
        rows = ~differ.any(-1)
        return not bool((differ & ~edge).any()) and torch.allclose(a[rows], b[rows], rtol=1e-4, atol=1e-6)

    return same


def same_pair(a: tuple, b: tuple) -> bool:
    """The same tokens, and residual probabilities within float32 rounding."""
    return torch.equal(a[0], b[0]) and torch.allclose(a[1], b[1], rtol=1e-4, atol=1e-6)


def kept_tokens(probs: torch.Tensor) -> str:
    return f"{(probs > 0).sum(-1).float().mean():.0f} tokens kept"


def accepted_drafts(lengths: torch.Tensor) -> str:
    return f"{lengths.float().mean():.1f} drafts accepted"


def distinct_tokens(out: tuple) -> str:
    return f"{out[0].unique().numel()} distinct of {out[0].numel()}"


def build_cases(vocab: int, window: int, batch: int, lantern_k: int, device: str) -> list[Case]:
    g = torch.Generator(device).manual_seed(0)
    index = torch.arange(1, window + 1, device=device)
    # conditional and unconditional logits share most of their structure, as a real model's do
    shared = torch.randn(batch, window, vocab, generator=g, device=device) * 2
    logits = shared.repeat(2, 1, 1) + 0.3 * torch.randn(2 * batch, window, vocab, generator=g, device=device)
    cases = []
    for name, params in (("cfg 4, top-k 2000", SamplingParams(cfg_scale=4.0, top_k=2000)),
                         ("cfg 4, top-k 2000, top-p 0.95, T 0.9", SamplingParams(cfg_scale=4.0, top_k=2000,
                                                                                  top_p=0.95, temperature=0.9)),
                         ("cfg 4, greedy", SamplingParams(cfg_scale=4.0, temperature=0.0))):
        cases.append(Case("target_probs", name, lambda params=params: target_probs(logits, params, index),
                          same_probs(nucleus_edge(logits, params, index)), kept_tokens))

    # a verify step: p over the window, Jacobi-style drafts with a carried (soft) q, or one-hot drafts
    p = target_probs.reference(logits, SamplingParams(cfg_scale=4.0, top_k=2000), index)
    noise = 0.3 * torch.randn(batch, window - 1, vocab, generator=g, device=device).repeat(2, 1, 1)  # the drafter's
    q = target_probs.reference(logits[:, :-1] + noise, SamplingParams(cfg_scale=4.0, top_k=2000), index[:-1])
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).view(batch, window - 1)
    one_hot = torch.nn.functional.one_hot(drafts, vocab).float()
    proposals = torch.multinomial(p.reshape(-1, vocab), 1, generator=g).view(batch, window)
    uniforms = torch.rand(batch, window - 1, generator=g, device=device)
    valid = torch.ones(batch, window - 1, dtype=torch.bool, device=device)
    codebook = torch.randn(vocab, 8, generator=g, device=device)
    embeddings = torch.randn(vocab, 768, generator=g, device=device) * 0.02
    rules = {"exact": ExactRule(), "GSD w 7": GroupedRule(embeddings, rank_window=7),
             f"LANTERN k {lantern_k}, delta 0.1": LanternRule(latent_neighbours(codebook, lantern_k), 0.1)}
    for name, rule in rules.items():
        for kind, draft_probs in (("one-hot q", one_hot), ("soft q", q)):
            cases.append(Case("accept_drafts", f"{name}, {kind}", lambda rule=rule, dq=draft_probs: accept_drafts(
                rule, p[:, :-1], dq, drafts, proposals[:, :-1], uniforms, valid), torch.equal, accepted_drafts))
        accepted = accept_drafts.reference(rule, p[:, :-1], q, drafts, proposals[:, :-1], uniforms, valid)
        at = accepted.clamp(max=window - 2)
        draws = torch.rand(batch, generator=g, device=device)
        cases.append(Case("recover", f"{name}, soft q", lambda rule=rule, at=at, draws=draws: recover(
            rule, p, q, drafts, proposals, at, draws), same_pair, distinct_tokens))
    return cases


def timed(case: Case, backend: str) -> tuple[object, float]:
    with use_backend(backend):
        if GPU:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = case.run()
        if GPU:
            torch.cuda.synchronize()
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8, help="samples; CFG doubles the target's rows")
    parser.add_argument("--lantern-k", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=50, help="timed calls per side (GPU only)")
    args = parser.parse_args()
    device = "cuda" if GPU else "cpu"
    cases = build_cases(args.vocab, args.window, args.batch, args.lantern_k, device)
    print(f"vocabulary {args.vocab}, window {args.window}, batch {args.batch} x 2 (CFG), on "
          f"{torch.cuda.get_device_name() if GPU else 'CPU: Triton interpreter'}")
    if GPU:
        print(f"{'op':14s} {'setting':40s} {'torch ms':>9s} {'triton ms':>9s} {'speed-up':>8s}  agree  "
              f"reference output")
    else:
        print(f"{'op':14s} {'setting':40s}  agree  reference output")
    disagreed = 0
    for case in cases:
        reference, _ = timed(case, "torch")
        kernel, _ = timed(case, "triton")  # on a GPU this call compiles the kernel
        same = case.same(reference, kernel)
        disagreed += not same
        agree = f"{str(same):5s}  {case.describe(reference)}"
        if not GPU:
            print(f"{case.op:14s} {case.setting:40s}  {agree}")
            continue
        times = {"torch": [], "triton": []}
        for _ in range(args.repeats):
            for backend in times:  # interleaved, so drifts hit both sides alike
                times[backend].append(timed(case, backend)[1])
        torch_ms, triton_ms = (1e3 * statistics.median(times[b]) for b in ("torch", "triton"))
        print(f"{case.op:14s} {case.setting:40s} {torch_ms:9.3f} {triton_ms:9.3f} {torch_ms / triton_ms:7.2f}x  "
              f"{agree}")
    if not GPU:
        print("No GPU here: these are correctness checks in Triton's interpreter; speed-ups need a GPU.")
    if disagreed:
        raise SystemExit(f"{disagreed} of {len(cases)} kernel outputs differ from their references")


if __name__ == "__main__":
    main()
