"""Triton kernel of ``target_probs``: CFG merge, temperature, top-k, top-p and softmax, one program per row.

A program holds one output row (a sample's window position) of the vocabulary in registers (a block of the next
power of two >= V), reads its conditional and, where guidance is on, its unconditional logits, and writes the
probabilities. Instead of sorting, thresholds are found by bisection over the float bit patterns mapped to
order-preserving integers:

- top-k: the k-th largest logit is the largest key ``t`` with ``#{key >= t} >= k`` (32 steps; ties survive);
- top-p: with ``S(t)`` the mass of keys above ``t``, the kept set is every token above the smallest ``t`` with
  ``S(t) <= top_p`` plus, of the tokens at ``t``, those whose mass ranked before them (``S(t)`` and their equals
  at lower vocabulary indices) is still within ``top_p``: the stable sort of the torch reference, exactly.

Arithmetic is float32 whatever the logits' dtype. Sums run in another order than torch's, so a kept set can
differ from the reference only where a cumulative mass lies within rounding of ``top_p``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vgen.kernels.common import launch, row_launch
from vgen.kernels.spec import SamplingSpec


@triton.jit
def sortable_key(x):
    """uint32 keys ordered as the float32 values ``x`` (``-0.0`` and ``0.0`` share a key)."""
    bits = x.to(tl.uint32, bitcast=True)
    key = tl.where((bits & 0x80000000) != 0, ~bits, bits | 0x80000000)
    return tl.where(x == 0, 0x80000000, key)


@triton.jit
def kth_largest_key(key, valid, k):
    """The key of the k-th largest valid entry (duplicates counted), by bisection."""
    lo = tl.min(tl.where(valid, key, 0xFFFFFFFF), 0)
    hi = tl.max(tl.where(valid, key, 0), 0)
    for _ in range(32):
        mid = hi - (hi - lo) // 2
        enough = tl.sum((valid & (key >= mid)).to(tl.int32), 0) >= k
        lo = tl.where(enough, mid, lo)
        hi = tl.where(enough, hi, mid - 1)
    return lo


@triton.jit
def nucleus(key, probs, valid, top_p):
    """Mask of the tokens HF/LlamaGen nucleus filtering keeps (equal keys ranked by vocabulary index)."""
    lo = tl.min(tl.where(valid, key, 0xFFFFFFFF), 0)
    hi = tl.max(tl.where(valid, key, 0), 0)
    for _ in range(32):  # the smallest key t with S(t) <= top_p (if the lowest key's t is below it, all pass below)
        mid = lo + (hi - lo) // 2
        small = tl.sum(tl.where(valid & (key > mid), probs, 0.0), 0) <= top_p
        hi = tl.where(small, mid, hi)
        lo = tl.where(small, lo, mid + 1)
    above = tl.sum(tl.where(valid & (key > lo), probs, 0.0), 0)
    tied = tl.where(valid & (key == lo), probs, 0.0)
    ranked_before = above + (tl.cumsum(tied, 0) - tied)
    return valid & ((key > lo) | ((key == lo) & (ranked_before <= top_p)))


@triton.jit
def probs_kernel(logits_ptr, guide_ptr, out_ptr, V, uncond_offset, scale, temperature, top_k, top_p,
                 GUIDED: tl.constexpr, GREEDY: tl.constexpr, TOP_K: tl.constexpr, TOP_P: tl.constexpr,
                 BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_V)
    inside = offs < V
    x = tl.load(logits_ptr + row * V + offs, mask=inside, other=0.0).to(tl.float32)
    if GUIDED:  # noqa: SIM102 (a compile-time test: unguided kernels load no flag)
        if tl.load(guide_ptr + row) != 0:
            uncond = tl.load(logits_ptr + uncond_offset + row * V + offs, mask=inside, other=0.0).to(tl.float32)
            x = uncond + (x - uncond) * scale
    x = tl.where(inside, x, -float("inf"))
    if GREEDY:
        probs = (offs == tl.argmax(x, 0, tie_break_left=True)).to(tl.float32)
    else:
        x = x / temperature
        keep = inside
        key = sortable_key(x)
        if TOP_K:
            keep = keep & (key >= kth_largest_key(key, inside, top_k))
        e = tl.where(keep, tl.exp(x - tl.max(x, 0)), 0.0)
        if TOP_P:
            keep = nucleus(key, e / tl.sum(e, 0), keep, top_p)
            e = tl.where(keep, e, 0.0)
        probs = e / tl.sum(e, 0)
    tl.store(out_ptr + row * V + offs, probs.to(out_ptr.dtype.element_ty), mask=inside)


def target_probs(logits: torch.Tensor, settings: SamplingSpec, guide: bool | torch.Tensor) -> torch.Tensor:
    """``vgen.samplers.logits.target_probs`` in one launch; ``guide`` says where guidance applies (a bool, or a
    bool tensor that broadcasts to the output positions), read only when ``settings.guided``."""
    vocab = logits.shape[-1]
    batch = logits.shape[0] // 2 if settings.guided else logits.shape[0]
    shape = (batch, *logits.shape[1:])
    logits = logits.contiguous()
    out = torch.empty(shape, dtype=logits.dtype, device=logits.device)
    rows = out.numel() // vocab
    if rows == 0:
        return out
    flags = logits  # unused unless guided
    if settings.guided:
        active = torch.as_tensor(guide, device=logits.device)
        flags = torch.broadcast_to(active, shape[:-1]).reshape(-1).to(torch.int8)
    launch(probs_kernel, (rows,), logits, flags, out, vocab, rows * vocab, float(settings.cfg_scale),
           float(settings.temperature or 1.0), settings.top_k, float(settings.top_p), GUIDED=settings.guided,
           GREEDY=settings.greedy, TOP_K=0 < settings.top_k < vocab, TOP_P=settings.top_p < 1, **row_launch(vocab))
    return out
