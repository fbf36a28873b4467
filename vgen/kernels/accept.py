"""Triton kernel of ``accept_drafts``: every draft of every window judged in one launch, one program per draft.

A program computes its draft's acceptance probability with the rule's formula (exact ``min(1, p/q)``; LANTERN
with the moved neighbour mass; GSD with the grouped sums, formed only when the exact ratio alone rejects;
exact-match), compares it with its uniform draw and, on a rejection (or a position outside the image), lowers its
sample's accepted length to its own position with an atomic minimum: the result is the first rejected position, or
J when every draft was kept.

GSD's candidates, the tokens ranked just above and below the draft by ``p`` (ties in vocabulary order, the
stable sort of the reference), are found without sorting: each step takes the next token in that order with a
pair of reductions over the vocabulary block.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vgen.kernels.common import last_dim_contiguous, launch, row_launch
from vgen.kernels.rules import GSD, LANTERN, MATCH, TINY, lantern_moved, rule_args
from vgen.kernels.spec import RuleSpec


@triton.jit
def group_member(token, pc, px, x, q_row, embeddings, e_stride, ex, D, p_threshold, dist_threshold,
                 BLOCK_D: tl.constexpr):
    """Whether candidate ``token`` (target probability ``pc``) joins draft ``x``'s group, and its ``q``."""
    d = tl.arange(0, BLOCK_D)
    ec = tl.load(embeddings + token.to(tl.int64) * e_stride + d, mask=d < D, other=0.0).to(tl.float32)
    dist = tl.sum((ec - ex) * (ec - ex), 0)
    similar = (tl.abs(pc - px) < p_threshold) & (dist < dist_threshold)
    return similar | (token == x), tl.load(q_row + token).to(tl.float32)


@triton.jit
def grouped_ratio(p_row, q_row, x, px, qx, V, embeddings, e_stride, D, p_threshold, dist_threshold,
                  W: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr):
    """GSD's ``sum_G p / sum_G q`` over the tokens at ranks ``rank(x) - W .. rank(x) + W - 1``."""
    offs = tl.arange(0, BLOCK_V)
    inside = offs < V
    p = tl.load(p_row + offs, mask=inside, other=0.0).to(tl.float32)
    d = tl.arange(0, BLOCK_D)
    ex = tl.load(embeddings + x * e_stride + d, mask=d < D, other=0.0).to(tl.float32)
    p_sum = px
    q_sum = qx
    cur_p = px
    cur_i = x.to(tl.int32)
    for _ in range(W):  # upwards: the last token ranked before the current one
        before = inside & ((p > cur_p) | ((p == cur_p) & (offs < cur_i)))
        cur_p = tl.min(tl.where(before, p, float("inf")), 0)
        cur_i = tl.max(tl.where(before & (p == cur_p), offs, -1), 0)
        if cur_i >= 0:
            member, qc = group_member(cur_i, cur_p, px, x, q_row, embeddings, e_stride, ex, D, p_threshold,
                                      dist_threshold, BLOCK_D)
            p_sum += tl.where(member, cur_p, 0.0)
            q_sum += tl.where(member, qc, 0.0)
    cur_p = px
    cur_i = x.to(tl.int32)
    for _ in range(W - 1):  # downwards: the first token ranked after the current one
        after = inside & ((p < cur_p) | ((p == cur_p) & (offs > cur_i)))
        cur_p = tl.max(tl.where(after, p, -float("inf")), 0)
        cur_i = tl.min(tl.where(after & (p == cur_p), offs, V), 0)
        if cur_i < V:
            member, qc = group_member(cur_i, cur_p, px, x, q_row, embeddings, e_stride, ex, D, p_threshold,
                                      dist_threshold, BLOCK_D)
            p_sum += tl.where(member, cur_p, 0.0)
            q_sum += tl.where(member, qc, 0.0)
    return p_sum / tl.maximum(q_sum, TINY)


@triton.jit
def accept_kernel(p_ptr, q_ptr, drafts_ptr, proposals_ptr, uniforms_ptr, valid_ptr, accepted_ptr,
                  table_ptr, embeddings, J, V, K, D, p_sb, p_sj, q_sb, q_sj, drafts_sb, proposals_sb, e_stride,
                  budget, p_threshold, dist_threshold, RULE: tl.constexpr, RELATIVE: tl.constexpr, W: tl.constexpr,
                  BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    x = tl.load(drafts_ptr + b * drafts_sb + j)
    p_row = p_ptr + b * p_sb + j * p_sj
    q_row = q_ptr + b * q_sb + j * q_sj
    draw = tl.load(uniforms_ptr + b * J + j)
    if RULE == MATCH:
        chance = (x == tl.load(proposals_ptr + b * proposals_sb + j)).to(tl.float32)
    else:
        px = tl.load(p_row + x).to(tl.float32)
        qx = tl.load(q_row + x).to(tl.float32)
        relaxed = px
        if RULE == LANTERN:
            relaxed += lantern_moved(p_row, table_ptr + x * K, K, px, budget, RELATIVE, BLOCK_K)[2]
        chance = relaxed / tl.maximum(qx, TINY)
        if RULE == GSD and W > 0:  # noqa: SIM102 (a compile-time branch around a run-time one)
            if draw >= chance:  # the exact ratio rejects: the group may still keep the draft
                chance = tl.maximum(chance, grouped_ratio(p_row, q_row, x, px, qx, V, embeddings, e_stride, D,
                                                          p_threshold, dist_threshold, W, BLOCK_V, BLOCK_D))
        chance = tl.minimum(chance, 1.0)
    keep = (draw < chance) & (tl.load(valid_ptr + b * J + j) != 0)
    tl.atomic_min(accepted_ptr + b, j, mask=keep == 0)


def accept_drafts(rule: RuleSpec, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, proposals: torch.Tensor,
                  uniforms: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``vgen.samplers.speculative.rules.accept_drafts`` of the rule ``rule`` describes, in one launch."""
    args = rule_args(rule, p)
    p, q, drafts, proposals = (last_dim_contiguous(x) for x in (p, q, drafts, proposals))
    batch, count, vocab = p.shape
    accepted = torch.full((batch,), count, dtype=torch.int32, device=p.device)
    if batch * count:
        options = row_launch(vocab if args.kind == GSD.value else 1)  # only GSD holds a vocabulary row
        launch(accept_kernel, (batch, count), p, q, drafts, proposals, uniforms.contiguous(), valid.contiguous(),
               accepted, args.table, args.embeddings, count, vocab, args.table_width, args.embedding_dim,
               p.stride(0), p.stride(1), q.stride(0), q.stride(1), drafts.stride(0), proposals.stride(0),
               args.embeddings.stride(0), args.budget, args.p_threshold, args.dist_threshold, RULE=args.kind,
               RELATIVE=args.relative, W=args.rank_window, BLOCK_K=triton.next_power_of_2(max(args.table_width, 1)),
               BLOCK_D=triton.next_power_of_2(args.embedding_dim), **options)
    return accepted.long()
