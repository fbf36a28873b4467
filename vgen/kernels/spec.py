"""What the kernels need from their callers, as plain values: an acceptance rule and the sampling settings each
describe themselves with one of these specs, so the kernels know no sampler types.

Importing this module does not import triton.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# a drafted token always has q(x) > 0; the clamp only keeps 0/0 out of rows the verify loop masks anyway (the
# references and the kernels share it)
TINY = 1e-30

RULE_KINDS = ("exact", "lantern", "gsd", "match")


@dataclass(frozen=True)
class RuleSpec:
    """An acceptance rule as the accept and residual kernels compute it.

    ``kind`` is one of :data:`RULE_KINDS`. LANTERN (``"lantern"``): ``neighbours`` [V, K] (closest first) and
    ``delta``, the total-variation budget, or LANTERN++'s lambda when ``relative``. GSD (``"gsd"``):
    ``embeddings`` [V, D], ``rank_window``, ``p_threshold`` and ``dist_threshold``. Exact and exact-match take
    nothing else.
    """

    kind: str
    neighbours: torch.Tensor | None = None
    delta: float = 0.0
    relative: bool = False
    embeddings: torch.Tensor | None = None
    rank_window: int = 0
    p_threshold: float = 0.0
    dist_threshold: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in RULE_KINDS:
            raise ValueError(f"rule kind must be one of {list(RULE_KINDS)}, got {self.kind!r}")
        if self.kind == "lantern" and self.neighbours is None:
            raise ValueError("a 'lantern' rule spec needs its neighbours table")
        if self.kind == "gsd" and self.embeddings is None:
            raise ValueError("a 'gsd' rule spec needs its embedding table")


@dataclass(frozen=True)
class SamplingSpec:
    """The sampling settings as the probs kernel applies them: the logits merged by classifier-free guidance with
    ``cfg_scale`` where ``guided`` (the batch is doubled as [cond; null]), divided by ``temperature``, filtered by
    ``top_k`` (0 = off) and ``top_p`` (1 = off), and the softmax taken; the one-hot argmax where ``greedy``."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    cfg_scale: float = 1.0
    guided: bool = False
    greedy: bool = False
