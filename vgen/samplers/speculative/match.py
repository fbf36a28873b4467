"""Exact-match verification (deterministic Jacobi decoding): keep a draft only if it equals the token the target
itself draws at that position; on a mismatch that token is the recovered one.

Lossless under sampling too, since every kept or recovered token is a draw from ``p``; under greedy decoding it
is plain Jacobi iteration (draft == argmax).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vgen.kernels.spec import RuleSpec
from vgen.samplers.speculative.rules import AcceptanceRule, register_rule


class MatchRule(AcceptanceRule):
    name = "match"
    lossless = True

    def accept_probs(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                     proposals: torch.Tensor) -> torch.Tensor:
        return (drafts == proposals).to(p.dtype)

    def residual(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                 proposals: torch.Tensor) -> torch.Tensor:
        return F.one_hot(proposals, p.shape[-1]).to(p.dtype)

    def kernel_spec(self) -> RuleSpec | None:
        return RuleSpec("match") if type(self) is MatchRule else None


register_rule("match", lambda options, model, tokenizer: MatchRule())
