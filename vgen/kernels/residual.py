"""Triton kernel of ``recover``: the residual distribution at each sample's first rejection and the recovered
token drawn from it, one program per sample.

A program reads the target row ``p`` and draft row ``q`` at its window position ``at[b]``, forms the rule's
target (``p``; LANTERN's ``p~`` with the budgeted neighbour mass moved onto the draft, built in the output row
in place; exact-match's one-hot proposal), the residual ``norm(max(0, target - q))`` (the target itself where
that is all zero), writes it, and picks the token: the argmax (greedy), or the inverse CDF at the sample's
uniform draw with the running mass summed in float64, as the torch reference does. With the same draws both
sides pick the same token unless a draw lies within float64 rounding of a boundary between two tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vgen.kernels.common import last_dim_contiguous, launch, row_launch
from vgen.kernels.rules import LANTERN, MATCH, TINY, lantern_moved, rule_args
from vgen.kernels.spec import RuleSpec


@triton.jit
def residual_kernel(p_ptr, q_ptr, drafts_ptr, proposals_ptr, at_ptr, uniforms_ptr, residual_ptr, tokens_ptr,
                    table_ptr, V, K, p_sb, p_sj, q_sb, q_sj, drafts_sb, proposals_sb, budget,
                    RULE: tl.constexpr, RELATIVE: tl.constexpr, GREEDY: tl.constexpr, BLOCK_V: tl.constexpr,
                    BLOCK_K: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    j = tl.load(at_ptr + b)
    offs = tl.arange(0, BLOCK_V)
    inside = offs < V
    out_row = residual_ptr + b * V
    if RULE == MATCH:  # the one-hot proposal, whose inverse CDF is the proposal at any draw
        token = tl.load(proposals_ptr + b * proposals_sb + j)
        tl.store(out_row + offs, (offs == token).to(residual_ptr.dtype.element_ty), mask=inside)
    else:
        p_row = p_ptr + b * p_sb + j * p_sj
        target = tl.load(p_row + offs, mask=inside, other=0.0).to(tl.float32)
        if RULE == LANTERN:  # p~: the used neighbours' mass moved onto the draft, assembled in the output row
            x = tl.load(drafts_ptr + b * drafts_sb + j)
            px = tl.load(p_row + x).to(tl.float32)
            neighbours, used, gained = lantern_moved(p_row, table_ptr + x * K, K, px, budget, RELATIVE, BLOCK_K)
            tl.store(out_row + offs, target, mask=inside)
            tl.debug_barrier()
            tl.store(out_row + neighbours, tl.zeros([BLOCK_K], dtype=tl.float32), mask=used)
            tl.store(out_row + x, px + gained)
            tl.debug_barrier()
            target = tl.load(out_row + offs, mask=inside, other=0.0)
        q = tl.load(q_ptr + b * q_sb + j * q_sj + offs, mask=inside, other=0.0).to(tl.float32)
        excess = tl.maximum(target - q, 0.0)
        mass = tl.sum(excess, 0)
        residual = tl.where(mass > 0, excess / tl.maximum(mass, TINY), target)
        tl.store(out_row + offs, residual.to(residual_ptr.dtype.element_ty), mask=inside)
        if GREEDY:
            token = tl.argmax(tl.where(inside, residual, -1.0), 0, tie_break_left=True).to(tl.int64)
        else:
            cdf = tl.cumsum(tl.where(inside, residual, 0.0).to(tl.float64), 0)
            threshold = tl.load(uniforms_ptr + b).to(tl.float64) * tl.max(cdf, 0)
            below = tl.sum((inside & (cdf <= threshold)).to(tl.int32), 0)
            token = tl.minimum(below, tl.max(tl.where(inside & (residual > 0), offs, 0), 0)).to(tl.int64)
    tl.store(tokens_ptr + b, token)


def recover(rule: RuleSpec, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, proposals: torch.Tensor,
            at: torch.Tensor, uniforms: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``vgen.samplers.speculative.rules.recover`` of the rule ``rule`` describes, in one launch."""
    args = rule_args(rule, p)
    p, q, drafts, proposals = (last_dim_contiguous(x) for x in (p, q, drafts, proposals))
    batch, vocab = p.shape[0], p.shape[-1]
    residual = torch.empty(batch, vocab, dtype=p.dtype, device=p.device)
    tokens = torch.empty(batch, dtype=torch.long, device=p.device)
    if batch:
        greedy = uniforms is None
        launch(residual_kernel, (batch,), p, q, drafts, proposals, at.contiguous(),
               p if greedy else uniforms.contiguous(), residual, tokens, args.table, vocab, args.table_width,
               p.stride(0), p.stride(1), q.stride(0), q.stride(1), drafts.stride(0), proposals.stride(0), args.budget,
               RULE=args.kind, RELATIVE=args.relative, GREEDY=greedy,
               BLOCK_K=triton.next_power_of_2(max(args.table_width, 1)), **row_launch(vocab))
    return tokens, residual
