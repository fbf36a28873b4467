"""LANTERN relaxed acceptance (Jang et al., ICLR 2025) and LANTERN++'s relative bound.

Tokens whose code vectors lie close together decode to similar image patches, so a draft ``x`` may borrow the
target mass of its latent neighbours. ``B_k(x)`` lists the ``k`` codes nearest to ``x`` (L2 distance between the
tokenizer's code vectors, ``x`` excluded, closest first). Neighbour mass is moved onto ``x`` closest first while
the moved total stays within the budget, the largest prefix ``n_1..n_m`` with

- ``sum_{l<=m} p(n_l) <= delta`` (``mode="tv"``, LANTERN: the adjusted distribution is within ``delta`` total
  variation of ``p``), or
- ``sum_{l<=m} p(n_l) <= (lambda - 1) * p(x)`` (``mode="relative"``, LANTERN++'s multiplicative bound, ``delta``
  holding lambda >= 1).

With ``p~_x`` = ``p`` with that mass moved onto ``x``, the draft is accepted with ``min(1, p~_x(x) / q(x))`` and a
rejection draws from ``norm(max(0, p~_x - q))``: exact speculative sampling against ``p~_x``. For a one-hot draft
the output is then exactly ``p~_x``; with ``delta = 0`` (or ``k = 0``) the rule is the exact one.

vgen measures the distances between the code vectors the decoder actually receives (``tokenizer.codebook()``,
L2-normalised for LlamaGen's tokenizers); LANTERN's script uses the raw embedding rows.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from vgen.kernels.spec import TINY, RuleSpec
from vgen.samplers.speculative.rules import AcceptanceRule, gather_last, normalized_residual, register_rule

LANTERN_MODES = ("tv", "relative")

_NEIGHBOURS: weakref.WeakKeyDictionary[nn.Module, dict[int, torch.Tensor]] = weakref.WeakKeyDictionary()


@torch.no_grad()
def latent_neighbours(codebook: torch.Tensor, k: int, chunk: int = 2048) -> torch.Tensor:
    """Indices [V, min(k, V - 1)] of each code's ``k`` nearest other codes by L2 distance, closest first (a ``k``
    beyond the codebook means every other code)."""
    if k < 0:
        raise ValueError(f"lantern_k must be >= 0, got {k}")
    k = min(k, codebook.shape[0] - 1)
    codes = codebook.float()
    rows = []
    for start in range(0, len(codes), chunk):
        d = torch.cdist(codes[start:start + chunk], codes)
        d[torch.arange(d.shape[0]), torch.arange(start, start + d.shape[0])] = torch.inf  # never yourself
        rows.append(d.topk(k, dim=-1, largest=False).indices)
    return torch.cat(rows)


def tokenizer_neighbours(tokenizer: nn.Module, k: int) -> torch.Tensor:
    """:func:`latent_neighbours` of ``tokenizer.codebook()``, computed once per tokenizer and ``k``."""
    per_k = _NEIGHBOURS.setdefault(tokenizer, {})
    if k not in per_k:
        per_k[k] = latent_neighbours(tokenizer.codebook(), k)
    return per_k[k]


def check_lantern_budget(mode: str, delta: float) -> None:
    """Refuse a LANTERN budget that its mode cannot read: a total-variation budget in [0, 1] (``tv``) or LANTERN++'s
    lambda >= 1 (``relative``)."""
    if mode not in LANTERN_MODES:
        raise ValueError(f"lantern_mode must be one of {list(LANTERN_MODES)}, got {mode!r}")
    if not isinstance(delta, (int, float)) or isinstance(delta, bool):
        raise ValueError(f"lantern_delta must be a number, got {delta!r}")
    if mode == "tv" and not 0 <= delta <= 1:
        raise ValueError(f"lantern_delta is a total-variation budget in [0, 1] in 'tv' mode, got {delta}")
    if mode == "relative" and not delta >= 1:
        raise ValueError(f"lantern_delta is LANTERN++'s lambda >= 1 in 'relative' mode, got {delta}")


class LanternRule(AcceptanceRule):
    name = "lantern"
    lossless = False

    def __init__(self, neighbours: torch.Tensor, delta: float, mode: str = "tv") -> None:
        check_lantern_budget(mode, delta)
        self.neighbours, self.delta, self.mode = neighbours, delta, mode

    def moved(self, p: torch.Tensor, drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The neighbours of each draft [..., k] and which of them give their mass to it [..., k] (bool)."""
        neighbours = self.neighbours.to(drafts.device)[drafts]
        mass = p.gather(-1, neighbours)
        budget = self.delta if self.mode == "tv" else (self.delta - 1) * gather_last(p, drafts)[..., None]
        return neighbours, mass.cumsum(-1) <= budget

    def adjusted(self, p: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
        """``p~_x`` [..., V]: ``p`` with the budgeted neighbour mass of each draft moved onto the draft."""
        neighbours, used = self.moved(p, drafts)
        gained = (p.gather(-1, neighbours) * used).sum(-1, keepdim=True)
        out = p.scatter(-1, neighbours, torch.where(used, 0.0, p.gather(-1, neighbours)))
        return out.scatter_add(-1, drafts[..., None], gained)

    def accept_probs(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                     proposals: torch.Tensor) -> torch.Tensor:
        neighbours, used = self.moved(p, drafts)
        relaxed = gather_last(p, drafts) + (p.gather(-1, neighbours) * used).sum(-1)
        return (relaxed / gather_last(q, drafts).clamp_min(TINY)).clamp(max=1)

    def residual(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                 proposals: torch.Tensor) -> torch.Tensor:
        return normalized_residual(self.adjusted(p, drafts), q)

    def kernel_spec(self) -> RuleSpec | None:
        if type(self) is not LanternRule:
            return None
        return RuleSpec("lantern", neighbours=self.neighbours, delta=self.delta, relative=self.mode == "relative")


def _build(options, model: nn.Module, tokenizer: nn.Module | None) -> LanternRule:
    if tokenizer is None or not hasattr(tokenizer, "codebook"):
        raise ValueError("the LANTERN rule needs the VQ tokenizer's codebook for its latent neighbourhoods; "
                         "sample through a pipeline or pass tokenizer=")
    return LanternRule(tokenizer_neighbours(tokenizer, options.lantern_k), options.lantern_delta,
                       options.lantern_mode)


register_rule("lantern", _build)
