"""Drafters: where a speculative window's guesses come from, each with the distribution it was drawn from.

The verify loop asks ``propose`` for the drafts of the next ``count`` tokens of every row (token indices
``pos[b] ... pos[b] + count - 1``) and tells ``observe`` what the target made of them, so a drafter can carry
state between passes. Drafters register with :func:`register_drafter`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from vgen.samplers.base import SamplingParams
from vgen.samplers.logits import sample_probs
from vgen.samplers.speculative.exact import ExactRule

DRAFT_INITS = ("random", "left", "vertical")
DRAFT_COUPLINGS = ("none", "maximal", "gumbel")


def reads_are_free(device: torch.device) -> bool:
    """Whether the host may read a tensor's value without waiting for a device: a CPU tensor's is at hand."""
    return device.type == "cpu"


def _gumbel(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """Standard Gumbel noise: ``argmax(log p + g)`` is then an exact draw from ``p``."""
    return -torch.log(-torch.log(torch.rand(shape, generator=generator, device=device).clamp_min(1e-20)))


@dataclass(frozen=True)
class DraftContext:
    """What a drafter may need beyond the sampler's options: the run's sampling settings (a draft model forms
    its distributions as the target's are: guidance, temperature, top-k, top-p), the pipeline's draft head, and
    whether the run is compiled (``static``: a draft model's passes then take the static, sync-free form too)."""

    params: SamplingParams
    draft_head: nn.Module | None = None
    static: bool = False


@dataclass
class Verification:
    """What one target pass decided for a batch of windows (L = window length).

    ``pos`` [B]: index of the first drafted token before the pass; ``accepted`` [B]: drafts kept;
    ``probs`` [B, L, V] and ``proposals`` [B, L]: the target's processed distributions for tokens
    ``pos + j`` and one draw from each; ``hidden`` [B, L, dim]: the target's final hidden states (only when the
    drafter asked for them); ``tokens`` [B, N + L]: the sequence after the pass (room past N for drafts);
    ``drafts`` [B, L - 1] and ``draft_probs`` [B, L - 1, V]: what was verified; ``generator``: the run's.
    """

    pos: torch.Tensor
    accepted: torch.Tensor
    probs: torch.Tensor
    proposals: torch.Tensor
    hidden: torch.Tensor | None
    tokens: torch.Tensor
    drafts: torch.Tensor
    draft_probs: torch.Tensor
    generator: torch.Generator | None = None


class Drafter(ABC):
    name: ClassVar[str]
    needs_hidden: ClassVar[bool] = False

    def __init__(self) -> None:
        self.forward_passes = 0  # draft-model passes (0 for drafters that run no model)

    @abstractmethod
    def propose(self, tokens: torch.Tensor, pos: torch.Tensor, count: int,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Drafts [B, count] for token indices ``pos[b] + i`` and their draft distributions [B, count, V]."""

    def observe(self, result: Verification) -> None:  # noqa: B027 (an optional hook)
        """Called after every verification (default: nothing to remember)."""


class JacobiDrafter(Drafter):
    """Speculative Jacobi decoding's drafts: the target's own last pass.

    After a pass, the target's draws at the positions past the first rejection become the next window's drafts,
    each carrying the distribution it was drawn from. Positions the last pass did not reach are initialised
    fresh with a one-hot distribution: ``random`` (uniform over the vocabulary, SJD's default), ``left`` (repeat
    the token to the left) or ``vertical`` (repeat the token one step back along the grid's first axis: the token
    above in an image, the same cell of the previous frame in a clip; ``left`` where there is none), which SJD
    found to give the most acceleration on images. ``stride`` is that step in tokens (a row, or a frame).

    ``coupling`` (MC-SJD) decides how a position's draft is refreshed from its new distribution ``p`` when it held
    a draft ``x`` drawn from ``q``: ``none`` draws afresh (SJD); ``maximal`` keeps ``x`` with probability
    ``min(1, p(x) / q(x))`` and otherwise draws from ``norm(max(0, p - q))``; ``gumbel`` gives every token
    position one Gumbel noise vector ``g`` for the whole run and drafts ``argmax(log p + g)``. Each way the draft
    is an exact sample of ``p``, so exact acceptance stays lossless, but coupled drafts change only when their
    distribution does, which keeps the later drafts' context stable.
    """

    name = "jacobi"

    def __init__(self, vocab_size: int, stride: int, init: str = "random", coupling: str = "none") -> None:
        super().__init__()
        if init not in DRAFT_INITS:
            raise ValueError(f"draft_init must be one of {list(DRAFT_INITS)}, got {init!r}")
        if coupling not in DRAFT_COUPLINGS:
            raise ValueError(f"draft_coupling must be one of {list(DRAFT_COUPLINGS)}, got {coupling!r}")
        self.vocab_size, self.stride, self.init, self.coupling = vocab_size, stride, init, coupling
        self.carried: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # tokens, probs, count
        self.noise: torch.Tensor | None = None  # gumbel: [B, L, V] for the tokens of the last window's outputs
        self.noise_pos: torch.Tensor | None = None  # ... which start at these token indices

    def propose(self, tokens: torch.Tensor, pos: torch.Tensor, count: int,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        batch, device = tokens.shape[0], tokens.device
        index = pos[:, None] + torch.arange(count, device=device)
        if self.carried is None:
            fresh = torch.ones(batch, count, dtype=torch.bool, device=device)
            carried_tokens, carried_probs = torch.zeros_like(index), None
        else:
            carried_tokens, carried_probs, carried_count = self.carried
            fresh = torch.arange(count, device=device)[None] >= carried_count[:, None]
            pad = count - carried_tokens.shape[1]  # after the prefill nothing is carried yet
            carried_tokens, carried_probs = F.pad(carried_tokens, (0, pad)), F.pad(carried_probs, (0, 0, 0, pad))
        seq = tokens.clone()
        seq.scatter_(1, index, carried_tokens)
        if self.init == "random":
            guess = torch.randint(self.vocab_size, (batch, count), generator=generator, device=device)
            seq.scatter_(1, index, torch.where(fresh, guess, carried_tokens))
        else:
            seq.scatter_(1, index, torch.where(fresh, seq.gather(1, self.copy_sources(index, pos, fresh)),
                                               carried_tokens))
        drafts = seq.gather(1, index)
        probs = F.one_hot(drafts, self.vocab_size).float()
        if carried_probs is not None:
            probs = torch.where(fresh[..., None], probs, carried_probs)
        return drafts, probs

    def copy_sources(self, index: torch.Tensor, pos: torch.Tensor, fresh: torch.Tensor) -> torch.Tensor:
        """The token each fresh draft repeats [B, count]: its left (or vertical) neighbour, followed through
        neighbours that are fresh drafts themselves (which repeat theirs) by pointer doubling, so a chain of k
        fresh drafts costs log2(k) vectorised rounds rather than a Python loop over the window. On a CPU the rounds
        stop once no chain is left; elsewhere asking would wait for the device, so all ceil(log2(count)) + 1 rounds
        that a chain of at most ``count`` drafts can need are run."""
        source = index - 1
        if self.init == "vertical":
            source = torch.where(index >= self.stride, index - self.stride, source)
        count = index.shape[1]
        for _ in range(max(count - 1, 1).bit_length() + 1):
            rel = source - pos[:, None]  # the source's place in the window (< 0: a committed token)
            pending = fresh & (rel >= 0) & fresh.gather(1, rel.clamp(0, count - 1))
            if reads_are_free(index.device) and not bool(pending.any()):
                break
            source = torch.where(pending, source.gather(1, rel.clamp(0, count - 1)), source)
        return source

    def refresh(self, result: Verification) -> torch.Tensor:
        """New draws [B, L] from this pass's distributions, coupled with the drafts they replace."""
        probs, drafted = result.probs, result.drafts.shape[1]
        if self.coupling == "gumbel":
            return (probs.log() + self.shifted_noise(result)).argmax(-1)
        if self.coupling == "none" or drafted == 0:
            return result.proposals
        p, q, x = probs[:, :drafted], result.draft_probs, result.drafts
        rule = ExactRule()
        keep = torch.rand(x.shape, generator=result.generator, device=x.device) < rule.accept_probs(p, q, x, x)
        redrawn = sample_probs(rule.residual(p, q, x, x), result.generator)
        return torch.cat([torch.where(keep, x, redrawn), result.proposals[:, drafted:]], dim=1)

    def shifted_noise(self, result: Verification) -> torch.Tensor:
        """The Gumbel noise [B, L, V] of the tokens this pass predicted (``pos + j``), kept from the last pass for
        the tokens it already covered and drawn fresh for the others: on a CPU from the first column any row needs
        (a window's tail), elsewhere for the whole window (how many columns are new differs by row, and asking
        would wait for the device)."""
        shape, device = result.probs.shape, result.probs.device
        if self.noise is None or self.noise.shape != shape:
            self.noise = _gumbel(shape, result.generator, device)
        else:
            # this pass's output j is token pos + j; the last pass's output j' was token noise_pos + j'
            offset = (result.pos - self.noise_pos)[:, None] + torch.arange(shape[1], device=device)
            kept = (offset >= 0) & (offset < shape[1])
            noise = self.noise.gather(1, offset.clamp(0, shape[1] - 1)[..., None].expand(-1, -1, shape[2]))
            first = 0
            if reads_are_free(device):
                needs_fresh = ~kept.all(0)
                first = int(needs_fresh.int().argmax()) if bool(needs_fresh.any()) else shape[1]
            if first < shape[1]:
                fresh = _gumbel((shape[0], shape[1] - first, shape[2]), result.generator, device)
                noise[:, first:] = torch.where(kept[:, first:, None], noise[:, first:], fresh)
            self.noise = noise
        self.noise_pos = result.pos
        return self.noise

    def observe(self, result: Verification) -> None:
        length = result.proposals.shape[1]
        count = length - 1
        drawn = self.refresh(result)
        source = (result.accepted[:, None] + 1 + torch.arange(count, device=result.accepted.device)).clamp(
            max=length - 1)
        tokens = drawn.gather(1, source)
        probs = result.probs.gather(1, source[..., None].expand(-1, -1, result.probs.shape[-1]))
        self.carried = (tokens, probs, count - result.accepted)


DrafterFactory = Callable[..., Drafter]
_DRAFTERS: dict[str, DrafterFactory] = {}


def register_drafter(name: str, factory: DrafterFactory) -> None:
    """Make a drafter available under ``name``; ``factory(options, model, context)`` builds it for one run
    (``options``: the speculative sampler config; ``context``: a :class:`DraftContext`)."""
    if name in _DRAFTERS:
        raise ValueError(f"drafter {name!r} is already registered")
    _DRAFTERS[name] = factory


def available_drafters() -> list[str]:
    return sorted(_DRAFTERS)


def build_drafter(name: str, options: object, model: nn.Module, context: DraftContext) -> Drafter:
    if name not in _DRAFTERS:
        raise ValueError(f"unknown drafter {name!r}; available: {', '.join(available_drafters())}")
    return _DRAFTERS[name](options, model, context)


register_drafter("jacobi", lambda options, model, context: JacobiDrafter(
    model.vocab_size, math.prod(model.grid[1:]), options.draft_init, options.draft_coupling))
