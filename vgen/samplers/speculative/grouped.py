"""Grouped speculative decoding (GSD, So et al., ICCV 2025): accept a draft for its group of look-alikes.

Image tokens are often interchangeable, so GSD judges a draft ``x`` together with the tokens that the target
ranks next to it and that look like it. Candidates ``C(x)`` are the tokens at target ranks ``rank(x) - w ...
rank(x) + w - 1`` (``w`` = ``rank_window``, 7 in GSD); the group ``G(x)`` keeps those ``y`` with
``|p(y) - p(x)| < p_threshold`` and ``||e_x - e_y||^2 < dist_threshold``, where ``e`` is the AR model's own input
embedding table (not the VQ codebook). The draft is accepted with ``min(1, sum_G p / sum_G q)``; a rejection
draws from SJD's residual ``norm(max(0, p - q))``.

With a one-hot draft the grouped ratio ``sum_G p`` is never below ``p(x)``. With a carried draft distribution it
can be, when a group member is over-drafted; vgen then keeps the exact ratio, so GSD never accepts less often
than exact verification would (its premise). Distances are gathered for the <= 2w candidates of each draft from
the embedding table, which costs less than GSD's precomputed V x V matrix and works for any vocabulary, and the
candidates come from two top-k selections rather than a sort of the vocabulary (``rank_neighbours``). The verify
loop forms a group only for a draft that the exact test rejects and that the decision reaches
(:meth:`GroupedRule.accepted_length`): about one per row and pass.
"""

from __future__ import annotations

import torch
from torch import nn

from vgen.kernels.spec import TINY, RuleSpec
from vgen.samplers.speculative.rules import (
    AcceptanceRule,
    exact_ratio,
    gather_last,
    leading_kept,
    normalized_residual,
    register_rule,
)


class GroupedRule(AcceptanceRule):
    name = "gsd"
    lossless = False

    def __init__(self, embeddings: torch.Tensor, rank_window: int = 7, p_threshold: float = 0.15,
                 dist_threshold: float = 0.5) -> None:
        if isinstance(rank_window, bool) or not isinstance(rank_window, int) or rank_window < 0:
            raise ValueError(f"gsd_rank_window must be an integer >= 0, got {rank_window!r}")
        if not 0 <= p_threshold <= 1:
            raise ValueError(f"gsd_p_threshold must be in [0, 1], got {p_threshold}")
        if not dist_threshold >= 0:
            raise ValueError(f"gsd_dist_threshold must be >= 0, got {dist_threshold}")
        self.embeddings = embeddings
        self.rank_window, self.p_threshold, self.dist_threshold = rank_window, p_threshold, dist_threshold

    def group(self, p: torch.Tensor, drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Candidate tokens [..., <= 2w] of each draft with a mask of those in its group (x included)."""
        candidates, inside = rank_neighbours(p, drafts, self.rank_window)
        close_p = (p.gather(-1, candidates) - gather_last(p, drafts)[..., None]).abs() < self.p_threshold
        e = self.embeddings.to(p.device)
        dist = (e[candidates].float() - e[drafts][..., None, :].float()).pow(2).sum(-1)
        similar = (close_p & (dist < self.dist_threshold)) | (candidates == drafts[..., None])
        return candidates, inside & similar

    def grouped_ratio(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
        """GSD's ``sum_G p / sum_G q`` for each draft [...]."""
        candidates, keep = self.group(p, drafts)
        return (p.gather(-1, candidates) * keep).sum(-1) / (q.gather(-1, candidates) * keep).sum(-1).clamp_min(TINY)

    def accept_probs(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                     proposals: torch.Tensor) -> torch.Tensor:
        exact = exact_ratio(p, q, drafts)
        if self.rank_window == 0:
            return exact.clamp(max=1)
        return torch.maximum(exact, self.grouped_ratio(p, q, drafts)).clamp(max=1)

    def accepted_length(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, proposals: torch.Tensor,
                        uniforms: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """The base rule's accepted length, with the grouped ratio formed only where the decision needs it.

        A draft is kept when its draw passes the exact ratio or the grouped one (:meth:`accept_probs` is their
        maximum). So the exact test judges the whole window first, and the grouped ratio is formed for one draft
        per row at a time: the row's first draft that the exact test rejects, then the next one while the group
        keeps them. That is about one grouped ratio per row and pass instead of J, each needing two top-k
        selections over the vocabulary; the outcome is the same draft for draft.
        """
        kept = (uniforms < exact_ratio(p, q, drafts)) & valid
        count = drafts.shape[1]
        if self.rank_window == 0 or count == 0:
            return leading_kept(kept)
        rows = torch.arange(len(drafts), device=drafts.device)
        open_rows = torch.ones_like(rows, dtype=torch.bool)  # the group has not yet rejected this row's draft
        while True:
            length = leading_kept(kept)
            at = length.clamp(max=count - 1)
            open_rows &= (length < count) & valid[rows, at]  # past the image: rejected without a group
            if not bool(open_rows.any()):
                return length
            b = rows[open_rows]
            j = at[b]
            rescued = uniforms[b, j] < self.grouped_ratio(p[b, j], q[b, j], drafts[b, j])
            kept[b[rescued], j[rescued]] = True
            open_rows[b[~rescued]] = False

    def residual(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                 proposals: torch.Tensor) -> torch.Tensor:
        return normalized_residual(p, q)

    def kernel_spec(self) -> RuleSpec | None:
        if type(self) is not GroupedRule:
            return None
        return RuleSpec("gsd", embeddings=self.embeddings, rank_window=self.rank_window, p_threshold=self.p_threshold,
                        dist_threshold=self.dist_threshold)


def rank_neighbours(p: torch.Tensor, drafts: torch.Tensor, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens at ranks ``rank(x) - window .. rank(x) + window - 1`` of ``p``'s stable descending order.

    Two top-k selections over a unique integer key (the probability's float32 bits, ties broken by the lower
    index first, as a stable sort does) find them without sorting the vocabulary, which is what made GSD's
    verify step slow. Returns the candidates [..., <= 2 * window] (x among them) and a mask of the ranks that
    exist.
    """
    vocab = p.shape[-1]
    index = torch.arange(vocab, device=p.device)
    key = p.float().contiguous().view(torch.int32).long() * vocab + (vocab - 1 - index)
    draft_key = gather_last(key, drafts)[..., None]
    above = torch.where(key > draft_key, key, torch.iinfo(torch.int64).max)
    above_keys, above_tokens = above.topk(min(window, vocab), dim=-1, largest=False)
    below = torch.where(key < draft_key, key, -1)
    below_keys, below_tokens = below.topk(min(max(window - 1, 0), vocab), dim=-1)
    candidates = torch.cat([above_tokens, drafts[..., None], below_tokens], dim=-1)
    exists = torch.ones_like(drafts[..., None], dtype=torch.bool)
    inside = torch.cat([above_keys != torch.iinfo(torch.int64).max, exists, below_keys != -1], dim=-1)
    return candidates, inside


def _build(options, model: nn.Module, tokenizer: nn.Module | None) -> GroupedRule:
    return GroupedRule(model.code_embeddings().detach(), options.gsd_rank_window, options.gsd_p_threshold,
                       options.gsd_dist_threshold)


register_rule("gsd", _build)
