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
from vgen.samplers.speculative.motion import motion_sources

DRAFT_INITS = ("random", "left", "vertical", "motion")
DRAFT_COUPLINGS = ("none", "maximal", "gumbel")


def reads_are_free(device: torch.device) -> bool:
    """Whether the host may read a tensor's value without waiting for a device: a CPU tensor's is at hand."""
    return device.type == "cpu"


@dataclass(frozen=True)
class DraftContext:
    """What a drafter may need beyond the sampler's options: the run's sampling settings (a draft model forms
    its distributions as the target's are: guidance, temperature, top-k, top-p), the pipeline's draft head, and
    whether the run is compiled (``static``: a draft model's passes then take the static, sync-free form too;
    ``compile``: what wraps a drafter's tensor work in a compiled run, None in an eager one; ``fuse``: the
    sampler runs a drafter's :meth:`Drafter.pass_step` inside its compiled pass where the drafter offers one)."""

    params: SamplingParams
    draft_head: nn.Module | None = None
    static: bool = False
    compile: Callable[[Callable], Callable] | None = None
    fuse: bool = False


@dataclass(frozen=True)
class DraftStep:
    """A drafter's work after a pass as a pure function of what the pass decided, which the sampler runs inside
    its compiled pass (one graph instead of the pass's and the drafter's): ``fn(probs, proposals, accepted,
    tokens, pos, *args)``, with the pass's outputs and the rows' next ``pos``, returns the next window's drafts
    [B, L - 1], their distributions and the drafter's new state, which go back through :meth:`Drafter.adopt`."""

    fn: Callable
    args: tuple


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
        """Called after every verification that ran no :meth:`pass_step` (default: nothing to remember)."""

    def pass_step(self, pos: torch.Tensor, length: int, generator: torch.Generator | None) -> DraftStep | None:
        """Called before a pass over windows of ``length`` at ``pos`` in a fused run (``DraftContext.fuse``): the
        drafter's work after the pass as a :class:`DraftStep`, its random numbers drawn now, or None (the
        default) to be told by :meth:`observe` instead."""
        return None

    def adopt(self, drafts: torch.Tensor, probs: torch.Tensor, *state: torch.Tensor | None) -> None:
        """What a :class:`DraftStep` returned: the drafts the next :meth:`propose` gives, and the new state."""
        raise NotImplementedError(f"drafter {self.name!r} offers no pass step")


class JacobiDrafter(Drafter):
    """Speculative Jacobi decoding's drafts: the target's own last pass.

    After a pass, the target's draws at the positions past the first rejection become the next window's drafts,
    each carrying the distribution it was drawn from. Positions the last pass did not reach are initialised
    fresh with a one-hot distribution: ``random`` (uniform over the vocabulary, SJD's default), ``left`` (repeat
    the token to the left), ``vertical`` (repeat the token one step back along the grid's first axis: the token
    above in an image, the same cell of the previous frame in a clip; ``left`` where there is none), which SJD
    found to give the most acceleration on images, or ``motion`` (in a clip, the previous frame's token under the
    local motion that best explains the known tokens around it, :mod:`~vgen.samplers.speculative.motion`; else as
    ``vertical``). ``stride`` is that step in tokens (a row, or a frame); ``grid`` the token grid ``motion`` reads.

    ``coupling`` (MC-SJD) decides how a position's draft is refreshed from its new distribution ``p`` when it held
    a draft ``x`` drawn from ``q``: ``none`` draws afresh (SJD); ``maximal`` keeps ``x`` with probability
    ``min(1, p(x) / q(x))`` and otherwise draws from ``norm(max(0, p - q))``; ``gumbel`` gives every token
    position one Gumbel noise vector ``g`` for the whole run and drafts ``argmax(log p + g)``. Each way the draft
    is an exact sample of ``p``, so exact acceptance stays lossless, but coupled drafts change only when their
    distribution does, which keeps the later drafts' context stable.

    The random numbers are drawn eagerly, in the run's order; the tensor work of a pass (:func:`carry_drafts`,
    :func:`gumbel_refresh`, :func:`draft_window`) goes through ``compile``, which a compiled run sets to
    ``torch.compile``: a few fused kernels instead of some sixty small ops a pass. With ``fuse`` it joins the
    sampler's compiled pass instead (:func:`next_window` as the :meth:`pass_step`), where a pass draws nothing
    that depends on its outcome: coupling ``none`` or ``gumbel``, and fresh drafts that repeat a neighbour (a
    ``random`` init draws the next window's guesses, and ``maximal`` its redraws, between passes).
    """

    name = "jacobi"

    def __init__(self, vocab_size: int, stride: int, init: str = "random", coupling: str = "none",
                 compile: Callable[[Callable], Callable] | None = None, fuse: bool = False,
                 grid: tuple[int, ...] = ()) -> None:
        super().__init__()
        if init not in DRAFT_INITS:
            raise ValueError(f"draft_init must be one of {list(DRAFT_INITS)}, got {init!r}")
        if coupling not in DRAFT_COUPLINGS:
            raise ValueError(f"draft_coupling must be one of {list(DRAFT_COUPLINGS)}, got {coupling!r}")
        self.vocab_size, self.stride, self.init, self.coupling = vocab_size, stride, init, coupling
        self.grid = tuple(grid)
        self.fuses = fuse and init != "random" and coupling != "maximal"
        # fused, the drafter's own steps run once a run (the first window), not worth a graph
        self.compiled = compile is not None and not self.fuses
        steps = (carry_drafts, gumbel_carry, draft_window)
        self.carry, self.gumbel_carry, self.draft = tuple(map(compile, steps)) if self.compiled else steps
        self.carried: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # tokens, probs, count
        self.ready: tuple[torch.Tensor, torch.Tensor] | None = None  # the next window, from a fused pass
        self.noise: torch.Tensor | None = None  # gumbel: [B, L, V] (as 1 / E) for the last window's outputs
        self.noise_pos: torch.Tensor | None = None  # ... which start at these token indices
        self.uniforms: torch.Tensor | None = None  # [B, L, V]: the draws behind the fresh part of that noise

    def propose(self, tokens: torch.Tensor, pos: torch.Tensor, count: int,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.ready is not None:
            drafts, probs = self.ready
            self.ready = None
            return drafts, probs
        batch, device = tokens.shape[0], tokens.device
        if self.carried is None:
            carried_tokens = torch.zeros(batch, count, dtype=torch.long, device=device)
            carried_probs = torch.zeros(batch, count, self.vocab_size, device=device)
            carried_count = torch.zeros(batch, dtype=torch.long, device=device)
        else:
            carried_tokens, carried_probs, carried_count = self.carried
            pad = count - carried_tokens.shape[1]  # after the prefill nothing is carried yet
            if pad:
                carried_tokens, carried_probs = F.pad(carried_tokens, (0, pad)), F.pad(carried_probs, (0, 0, 0, pad))
        guess = (torch.randint(self.vocab_size, (batch, count), generator=generator, device=device)
                 if self.init == "random" else None)
        # a chain of fresh drafts is followed until none is left where that costs no wait (eager, on a CPU)
        early_stop = reads_are_free(device) and not self.compiled
        return self.draft(tokens, pos, carried_tokens, carried_probs, carried_count, guess, self.vocab_size,
                          self.init, self.stride, early_stop, self.grid)

    def refresh(self, result: Verification) -> torch.Tensor:
        """New draws [B, L] from this pass's distributions, coupled with the drafts they replace."""
        probs, drafted = result.probs, result.drafts.shape[1]
        if self.coupling == "gumbel":
            drawn, self.noise = gumbel_refresh(probs, *self.noise_inputs(result.pos, probs.shape, result.generator))
            return drawn
        if self.coupling == "none" or drafted == 0:
            return result.proposals
        p, q, x = probs[:, :drafted], result.draft_probs, result.drafts
        rule = ExactRule()
        keep = torch.rand(x.shape, generator=result.generator, device=x.device) < rule.accept_probs(p, q, x, x)
        redrawn = sample_probs(rule.residual(p, q, x, x), result.generator)
        return torch.cat([torch.where(keep, x, redrawn), result.proposals[:, drafted:]], dim=1)

    def noise_inputs(self, pos: torch.Tensor, shape: torch.Size | tuple[int, int, int],
                     generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What :func:`gumbel_refresh` needs for the tokens a pass at ``pos`` predicts (``pos + j``, ``shape``
        [B, L, V]): the last pass's noise, how far each row moved since (``shift`` [B]: token ``pos + j`` was its
        column ``shift + j``), and uniform draws [B, L, V] for the tokens it does not hold. The draws are made
        here, on a CPU from the first column any row needs (a window's tail; the columns before it keep older draws
        that no row reads), elsewhere for the whole window (how many columns are new differs by row, and asking
        would wait for the device)."""
        shape, device = torch.Size(shape), pos.device
        if self.noise is None or self.noise.shape != shape:  # all fresh: a shift past the old noise
            self.noise_pos = pos
            self.uniforms = torch.rand(shape, generator=generator, device=device)
            return torch.zeros_like(self.uniforms), torch.full_like(pos, shape[1]), self.uniforms
        shift = pos - self.noise_pos
        first = max(shape[1] - int(shift.max()), 0) if reads_are_free(device) else 0
        self.uniforms[:, first:] = torch.rand((shape[0], shape[1] - first, shape[2]), generator=generator,
                                              device=device)
        self.noise_pos = pos
        return self.noise, shift, self.uniforms

    def pass_step(self, pos: torch.Tensor, length: int, generator: torch.Generator | None) -> DraftStep | None:
        if not self.fuses:
            return None
        noise = ((None, None, None) if self.coupling == "none"
                 else self.noise_inputs(pos, (pos.shape[0], length, self.vocab_size), generator))
        return DraftStep(next_window, (*noise, self.vocab_size, self.init, self.stride, self.grid))

    def adopt(self, drafts: torch.Tensor, probs: torch.Tensor, *state: torch.Tensor | None) -> None:
        self.ready = (drafts, probs)
        if self.coupling == "gumbel":
            (self.noise,) = state

    def observe(self, result: Verification) -> None:
        if self.coupling == "gumbel" and result.drafts.shape[1] > 0:
            noise_inputs = self.noise_inputs(result.pos, result.probs.shape, result.generator)
            tokens, probs, count, self.noise = self.gumbel_carry(result.probs, *noise_inputs, result.accepted)
            self.carried = (tokens, probs, count)
        else:  # the other couplings (their draws made eagerly), or the prefill's single position (not compiled)
            carry = self.carry if result.drafts.shape[1] > 0 else carry_drafts
            self.carried = carry(self.refresh(result), result.probs, result.accepted)


def copy_sources(index: torch.Tensor, pos: torch.Tensor, fresh: torch.Tensor, init: str, stride: int,
                 early_stop: bool, moved: torch.Tensor | None = None) -> torch.Tensor:
    """The token each fresh draft of windows at token ``index`` [B, count] repeats: its left (``init="left"``) or
    vertical neighbour, or where ``moved`` [B, count] holds one (>= 0) its motion source, followed through
    neighbours that are fresh drafts themselves (which repeat theirs) by pointer doubling, so a chain of k fresh
    drafts costs log2(k) vectorised rounds rather than a Python loop over the window. With ``early_stop`` the
    rounds stop once no chain is left (a read of the values); otherwise all ceil(log2(count)) + 1 rounds that a
    chain of at most ``count`` drafts can need are run."""
    source = index - 1
    if init in ("vertical", "motion"):
        source = torch.where(index >= stride, index - stride, source)
    if moved is not None:
        source = torch.where(moved >= 0, moved, source)
    count = index.shape[1]
    for _ in range(max(count - 1, 1).bit_length() + 1):
        rel = source - pos[:, None]  # the source's place in the window (< 0: a committed token)
        pending = fresh & (rel >= 0) & fresh.gather(1, rel.clamp(0, count - 1))
        if early_stop and not bool(pending.any()):
            break
        source = torch.where(pending, source.gather(1, rel.clamp(0, count - 1)), source)
    return source


def draft_window(tokens: torch.Tensor, pos: torch.Tensor, carried_tokens: torch.Tensor, carried_probs: torch.Tensor,
                 carried_count: torch.Tensor, guess: torch.Tensor | None, vocab_size: int, init: str, stride: int,
                 early_stop: bool, grid: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """The drafts [B, count] of tokens ``pos .. pos + count - 1`` with their distributions: the first
    ``carried_count`` of each row carried (``carried_tokens``, ``carried_probs``), the rest fresh with a one-hot
    distribution, ``guess`` for ``init="random"``, else a repeated neighbour (:func:`copy_sources`; ``init=
    "motion"`` reads the committed and carried tokens on ``grid`` for each one's motion source)."""
    count = carried_tokens.shape[1]
    columns = torch.arange(count, device=pos.device)
    index = pos[:, None] + columns
    fresh = columns[None] >= carried_count[:, None]
    if guess is not None:
        drafts = torch.where(fresh, guess, carried_tokens)
    else:
        seq = tokens.scatter(1, index, carried_tokens)
        moved = None
        if init == "motion":
            known = torch.arange(seq.shape[1], device=pos.device) < (pos + carried_count)[:, None]
            moved = motion_sources(seq, known, index, grid)
        sources = copy_sources(index, pos, fresh, init, stride, early_stop, moved)
        drafts = torch.where(fresh, seq.gather(1, sources), carried_tokens)
    one_hot = (drafts[..., None] == torch.arange(vocab_size, device=pos.device)).float()
    return drafts, torch.where(fresh[..., None], one_hot, carried_probs)


def carry_drafts(drawn: torch.Tensor, probs: torch.Tensor,
                 accepted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a pass leaves for the next window: its draws ``drawn`` [B, L] past the first rejection (after the
    ``accepted`` drafts and the recovered token) with their distributions, and how many there are per row."""
    length = probs.shape[1]
    source = (accepted[:, None] + 1 + torch.arange(length - 1, device=accepted.device)).clamp(max=length - 1)
    return (drawn.gather(1, source), probs.gather(1, source[..., None].expand(-1, -1, probs.shape[-1])),
            length - 1 - accepted)


def gumbel_refresh(probs: torch.Tensor, noise: torch.Tensor, shift: torch.Tensor,
                   uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gumbel-coupled draws [B, L] from ``probs`` [B, L, V], and the noise they used: output j of row b reads the
    last pass's ``noise`` at column ``shift[b] + j`` where that lies inside it, else fresh noise made from
    ``uniforms`` [B, L, V]. The Gumbel-max draw ``argmax(log p + g)`` is taken as ``argmax(p / E)`` with
    ``E = exp(-g)``, an Exp(1) variable, and the noise is kept as ``1 / E``: the same draw without the logarithms of
    ``p``."""
    noise = aligned_noise(noise, shift, uniforms)
    return (probs * noise).argmax(-1), noise


def aligned_noise(noise: torch.Tensor, shift: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The noise [B, L, V] (as ``1 / E``) of :func:`gumbel_refresh`'s outputs: column j of row b is the last pass's
    ``noise`` at column ``shift[b] + j`` where that lies inside it, else made from ``uniforms`` [B, L, V]."""
    length = uniforms.shape[1]
    offset = shift[:, None] + torch.arange(length, device=shift.device)
    shifted = noise.gather(1, offset.clamp(max=length - 1)[..., None].expand_as(uniforms))
    fresh = -1 / torch.log(uniforms.clamp_min(1e-20))
    return torch.where((offset < length)[..., None], shifted, fresh)


def gumbel_carry(probs: torch.Tensor, noise: torch.Tensor, shift: torch.Tensor, uniforms: torch.Tensor,
                 accepted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`gumbel_refresh` then :func:`carry_drafts`, one step for the compiler; the noise comes last."""
    drawn, noise = gumbel_refresh(probs, noise, shift, uniforms)
    return (*carry_drafts(drawn, probs, accepted), noise)


def next_window(probs: torch.Tensor, proposals: torch.Tensor, accepted: torch.Tensor, tokens: torch.Tensor,
                pos: torch.Tensor, noise: torch.Tensor | None, shift: torch.Tensor | None,
                uniforms: torch.Tensor | None, vocab_size: int, init: str, stride: int,
                grid: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The Jacobi drafter's :class:`DraftStep`: a pass's draws past the first rejection carried (Gumbel-coupled
    with ``noise``, ``shift`` and ``uniforms`` from :meth:`JacobiDrafter.noise_inputs`, else the target's
    ``proposals``), then the window at the rows' next ``pos`` drafted with fresh drafts repeating a neighbour;
    the new noise comes last (None without it)."""
    if noise is None:
        carried_tokens, carried_probs, count = carry_drafts(proposals, probs, accepted)
    else:
        carried_tokens, carried_probs, count, noise = gumbel_carry(probs, noise, shift, uniforms, accepted)
    drafts, draft_probs = draft_window(tokens, pos, carried_tokens, carried_probs, count, None, vocab_size, init,
                                       stride, early_stop=False, grid=grid)
    return drafts, draft_probs, noise


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
    model.vocab_size, math.prod(model.grid[1:]), options.draft_init, options.draft_coupling, context.compile,
    context.fuse, tuple(model.grid)))
