"""Exact speculative sampling (Leviathan et al.; SJD's verification): lossless.

Accept ``x`` with probability ``min(1, p(x) / q(x))``; at a rejection draw from ``norm(max(0, p - q))``. The
accepted-or-recovered token is then distributed exactly as ``p``.
"""

from __future__ import annotations

import torch

from vgen.kernels.spec import RuleSpec
from vgen.samplers.speculative.rules import AcceptanceRule, exact_ratio, normalized_residual, register_rule


class ExactRule(AcceptanceRule):
    name = "exact"
    lossless = True

    def accept_probs(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                     proposals: torch.Tensor) -> torch.Tensor:
        return exact_ratio(p, q, drafts).clamp(max=1)

    def residual(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                 proposals: torch.Tensor) -> torch.Tensor:
        return normalized_residual(p, q)

    def kernel_spec(self) -> RuleSpec | None:
        return RuleSpec("exact") if type(self) is ExactRule else None


register_rule("exact", lambda options, model, tokenizer: ExactRule())
