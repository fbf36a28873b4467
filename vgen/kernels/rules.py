"""What the acceptance and residual kernels share: a rule spec as kernel arguments, and LANTERN's moved mass."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from vgen.kernels import spec
from vgen.kernels.spec import RULE_KINDS, RuleSpec

# rule kinds, compile-time constants of the kernels (``.value`` in Python), in the order of ``RULE_KINDS``
EXACT, LANTERN, GSD, MATCH = (tl.constexpr(RULE_KINDS.index(kind)) for kind in ("exact", "lantern", "gsd", "match"))
TINY = tl.constexpr(spec.TINY)


@dataclass(frozen=True)
class RuleArgs:
    """A rule spec as kernel arguments. ``table`` holds LANTERN's neighbours [V, K] and ``embeddings`` GSD's [V, D]
    (another tensor stands in where a rule has none); ``budget`` is LANTERN's delta ('tv') or lambda - 1
    ('relative', in float64 as the reference forms it)."""

    kind: int
    table: torch.Tensor
    embeddings: torch.Tensor
    budget: float = 0.0
    relative: bool = False
    rank_window: int = 0
    p_threshold: float = 0.0
    dist_threshold: float = 0.0

    @property
    def table_width(self) -> int:
        return self.table.shape[1] if self.kind == LANTERN.value else 0

    @property
    def embedding_dim(self) -> int:
        return self.embeddings.shape[1] if self.kind == GSD.value else 1


def rule_args(rule: RuleSpec, like: torch.Tensor) -> RuleArgs:
    """The kernel arguments of ``rule`` with its tables on ``like``'s device."""
    kind = RULE_KINDS.index(rule.kind)
    if kind == LANTERN.value:
        return RuleArgs(kind, rule.neighbours.to(like.device).contiguous(), like,
                        budget=rule.delta - 1 if rule.relative else rule.delta, relative=rule.relative)
    if kind == GSD.value:
        return RuleArgs(kind, like, rule.embeddings.to(like.device).contiguous(), rank_window=rule.rank_window,
                        p_threshold=rule.p_threshold, dist_threshold=rule.dist_threshold)
    return RuleArgs(kind, like, like)


@triton.jit
def lantern_moved(p_row, table_row, K, px, budget, RELATIVE: tl.constexpr, BLOCK_K: tl.constexpr):
    """LANTERN's neighbours of a draft [BLOCK_K], which of them give their mass to it, and the mass moved: the
    longest closest-first prefix whose mass stays within the budget (``budget`` or ``budget * p(x)``)."""
    offs = tl.arange(0, BLOCK_K)
    inside = offs < K
    neighbours = tl.load(table_row + offs, mask=inside, other=0)
    mass = tl.load(p_row + neighbours, mask=inside, other=0.0).to(tl.float32)
    limit = budget * px if RELATIVE else budget
    used = inside & (tl.cumsum(mass, 0) <= limit)
    return neighbours, used, tl.sum(tl.where(used, mass, 0.0), 0)
