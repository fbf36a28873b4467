"""Acceptance rules: given the target's distribution and a draft, keep it or say what to sample instead.

Vocabulary (one window position): the target distribution ``p`` [V] is the CFG-merged, processed (temperature,
top-k, top-p) next-token distribution the target model gives at that position; the draft ``x`` was drawn from
the drafter's distribution ``q`` [V] (a one-hot vector for a deterministic draft). The rule gives the
probability of **accepting** ``x``; at the first rejection in a window, the verify loop draws a **recovered**
token from the rule's ``residual`` distribution and stops. Every rule works on tensors of any leading shape
[...] so a whole batch of windows is judged at once.

The verify loop calls two ops over a batch of windows, each a torch reference here and a fused Triton kernel
on CUDA (``vgen.kernels``): :func:`accept_drafts` (the left-to-right test of acceptance probabilities against given
uniform draws, giving the accepted length) and :func:`recover` (the residual at the first rejection and the recovered
token); a rule that a kernel computes describes itself to it with :meth:`AcceptanceRule.kernel_spec`. Each rule
lives in its own small module and registers here with :func:`register_rule`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from types import NotImplementedType
from typing import ClassVar

import torch
from torch import nn

from vgen.kernels.dispatch import kernel_op
from vgen.kernels.spec import TINY, RuleSpec
from vgen.samplers.logits import inverse_cdf


def gather_last(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``values[..., index]`` per leading position: values [..., V], index [...] -> [...]."""
    return values.gather(-1, index[..., None])[..., 0]


def exact_ratio(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """``p(x) / q(x)`` of each draft [...] (unclamped: ``min(1, .)`` is exact acceptance)."""
    return gather_last(p, drafts) / gather_last(q, drafts).clamp_min(TINY)


def pick_rows(x: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """``x[b, at[b]]`` for x [B, L, ...]."""
    return x[torch.arange(x.shape[0], device=x.device), at]


def written(buffer: torch.Tensor, index: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``buffer`` with ``[b, index[b, i]] = values[b, i]`` where ``mask[b, i]`` (a new tensor): a pass's commit."""
    return buffer.scatter(1, index, torch.where(mask, values, buffer.gather(1, index)))


def normalized_residual(target: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``norm(max(0, target - q))`` [..., V]; where that is all zero (target == q, so rejection had probability
    zero), the target itself."""
    residual = (target - q).clamp_min(0)
    mass = residual.sum(-1, keepdim=True)
    return torch.where(mass > 0, residual / mass.clamp_min(TINY), target)


def leading_kept(keep: torch.Tensor) -> torch.Tensor:
    """How many leading entries of each row of ``keep`` [B, J] (bool) are True: the accepted length [B]."""
    return keep.long().cumprod(dim=1).sum(dim=1)


def window_accepted_length(rule: AcceptanceRule, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                           proposals: torch.Tensor, uniforms: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """:meth:`AcceptanceRule.accepted_length` with every draft of the window judged: shapes that do not depend on
    the decisions, which is what a compiled verify pass needs."""
    return leading_kept((uniforms < rule.accept_probs(p, q, drafts, proposals)) & valid)


class AcceptanceRule(ABC):
    """Decides how many drafts to keep. ``lossless`` rules leave the output distribution exactly the target's."""

    name: ClassVar[str]
    lossless: ClassVar[bool]

    @abstractmethod
    def accept_probs(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                     proposals: torch.Tensor) -> torch.Tensor:
        """Probability in [0, 1] of accepting each draft [...]; ``p``, ``q`` [..., V]; ``proposals`` [...] are
        tokens the verify loop drew from ``p`` (only the exact-match rule looks at them)."""

    def accepted_length(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, proposals: torch.Tensor,
                        uniforms: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """The leading drafts [B] of windows [B, J] that are ``valid`` and pass ``uniforms < accept_probs``. A
        rule whose probability is costly may override this to judge only the drafts the decision reaches, with
        the same outcome as :func:`window_accepted_length`."""
        return window_accepted_length(self, p, q, drafts, proposals, uniforms, valid)

    @abstractmethod
    def residual(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                 proposals: torch.Tensor) -> torch.Tensor:
        """The distribution [..., V] of the recovered token after ``drafts`` was rejected."""

    def kernel_spec(self) -> RuleSpec | None:
        """The rule as the accept and residual kernels compute it, or None where they do not (its torch methods
        run). A built-in rule describes only its own class: a subclass may change the logic."""
        return None


RuleFactory = Callable[..., AcceptanceRule]
_RULES: dict[str, RuleFactory] = {}


def register_rule(name: str, factory: RuleFactory) -> None:
    """Make a rule available under ``name``. ``factory(options, model, tokenizer)`` builds it for one run, where
    ``options`` is the speculative sampler config (its ``lantern_k``, ``gsd_*`` ... fields)."""
    if name in _RULES:
        raise ValueError(f"acceptance rule {name!r} is already registered")
    _RULES[name] = factory


def available_rules() -> list[str]:
    return sorted(_RULES)


def build_rule(name: str, options: object, model: nn.Module, tokenizer: nn.Module | None) -> AcceptanceRule:
    if name not in _RULES:
        raise ValueError(f"unknown acceptance rule {name!r}; available: {', '.join(available_rules())}")
    return _RULES[name](options, model, tokenizer)


def _accept_kernel(rule: AcceptanceRule, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                   proposals: torch.Tensor, uniforms: torch.Tensor,
                   valid: torch.Tensor) -> torch.Tensor | NotImplementedType:
    """:func:`accept_drafts` on its Triton kernel (NotImplemented for a rule without a kernel spec)."""
    spec = rule.kernel_spec()
    if spec is None:
        return NotImplemented
    from vgen.kernels import accept  # imports triton, an optional dependency

    return accept.accept_drafts(spec, p, q, drafts, proposals, uniforms, valid)


@kernel_op("accept", _accept_kernel)
def accept_drafts(rule: AcceptanceRule, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                  proposals: torch.Tensor, uniforms: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Left-to-right verification of windows of J drafts: ``p``, ``q`` [B, J, V]; ``drafts``, ``proposals``,
    ``uniforms`` (draws in [0, 1)) and ``valid`` (bool: inside the image) [B, J].

    Draft j is kept when ``uniforms < rule.accept_probs`` and it is valid. Returns the accepted length [B]: the
    leading kept drafts, which is also the position of the first rejection when below J.
    """
    return rule.accepted_length(p, q, drafts, proposals, uniforms, valid)


def _recover_kernel(rule: AcceptanceRule, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                    proposals: torch.Tensor, at: torch.Tensor,
                    uniforms: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | NotImplementedType:
    """:func:`recover` on its Triton kernel (NotImplemented for a rule without a kernel spec)."""
    spec = rule.kernel_spec()
    if spec is None:
        return NotImplemented
    from vgen.kernels import residual  # imports triton, an optional dependency

    return residual.recover(spec, p, q, drafts, proposals, at, uniforms)


@kernel_op("residual", _recover_kernel)
def recover(rule: AcceptanceRule, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, proposals: torch.Tensor,
            at: torch.Tensor, uniforms: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The recovered token [B] at window position ``at[b]`` and the residual distribution [B, V] it comes from
    (``p`` [B, L, V], ``q`` [B, J, V], ``drafts`` [B, J], ``proposals`` [B, L], L >= J > ``at``): its argmax when
    ``uniforms`` is None (greedy), else :func:`inverse_cdf` at ``uniforms`` [B]."""
    residual = rule.residual(pick_rows(p, at), pick_rows(q, at), pick_rows(drafts, at), pick_rows(proposals, at))
    return (residual.argmax(-1) if uniforms is None else inverse_cdf(residual, uniforms)), residual
