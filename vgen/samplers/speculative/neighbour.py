"""Drafts from the token layout: a fresh draft is a draw from the target's own distribution at its grid neighbour.

Jacobi drafting (:class:`~vgen.samplers.speculative.drafters.JacobiDrafter`) carries the target's draws past the
first rejection into the next window; the positions a window reaches for the first time need a guess. MC-SJD
repeats the token one step back along the grid (``draft_init="vertical"``: the token above). The ``neighbour``
drafter guesses with what the target said there instead: the fresh draft of token ``i`` is a draw from ``p_n``, the
latest distribution the target gave at ``i``'s neighbour ``n`` (:func:`grid_neighbour`: the same cell one frame
earlier in a clip, the token above in an image or a clip's first frame, the token to the left on the first row),
and ``p_n`` is its draft distribution ``q``. Under ``draft_coupling="gumbel"`` the draw is ``argmax(p_n / E_i)``
with the Exp(1) noise ``E_i`` that MC-SJD keeps for token ``i`` all run, so when the target's own ``p_i`` arrives
and resembles ``p_n`` the refreshed draft ``argmax(p_i / E_i)`` is the same token and the later drafts' context
stays put (other couplings draw it by inverse CDF at a fresh uniform).

Why it is lossless: ``p_n`` was computed before the pass that verifies token ``i`` from tokens before ``i`` only,
and ``E_i`` (or the uniform) is used for no other token, so the draft is an exact sample of its ``q``; the exact
rule's acceptance ``min(1, p_i(x) / q(x))`` and residual ``norm(max(0, p_i - q))`` then give an exact sample of
``p_i`` whatever ``q`` is. The drafter changes only what is proposed, never the rule (tests/samplers/speculative/
test_neighbour.py checks greedy equality with AR and the sampled law by a chi-square test).

Where no neighbour has been reached by a pass yet (a window longer than a row reaches rows whose row above is
still fresh), the neighbour's neighbour is taken, and so on; the first token, which has none, follows
``draft_init``. Under greedy decoding ``p_n`` is one-hot, so the draft is the target's greedy token above.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from vgen.samplers.logits import inverse_cdf
from vgen.samplers.speculative.drafters import (
    DraftContext,
    JacobiDrafter,
    Verification,
    aligned_noise,
    register_drafter,
)


def grid_neighbour(index: torch.Tensor, grid: tuple[int, ...]) -> torch.Tensor:
    """The neighbour of each token ``index`` (raster order over ``grid``): one step back along the outermost axis
    on which the token is not at 0 (previous frame, else previous row, else previous column); -1 for token 0."""
    source = torch.full_like(index, -1)
    strides = [math.prod(grid[k + 1:]) for k in range(len(grid))]
    for size, stride in reversed(list(zip(grid, strides, strict=True))):  # the outer axes override the inner
        source = torch.where((index // stride) % size > 0, index - stride, source)
    return source


class NeighbourDrafter(JacobiDrafter):
    """Jacobi drafts (coupled as ``coupling`` says) whose fresh positions draw from the target's distribution at
    their grid neighbour (module docstring). ``window``: the sampler's window, which with the grid's largest step
    sizes the ring of kept distributions (the latest of each of the last ``max(step, window)`` tokens a pass
    reached)."""

    name = "neighbour"

    def __init__(self, vocab_size: int, grid: tuple[int, ...], window: int, init: str = "vertical",
                 coupling: str = "gumbel") -> None:
        super().__init__(vocab_size, math.prod(grid[1:]), init, coupling, grid=tuple(grid))
        self.ring = max(self.stride, window)
        self.probs: torch.Tensor | None = None  # [B, ring, V]: token j's latest distribution at slot j % ring
        self.reached: torch.Tensor | None = None  # [B]: tokens 0 .. reached - 1 have one

    def propose(self, tokens: torch.Tensor, pos: torch.Tensor, count: int,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        carried = 0 if self.carried is None else self.carried[2][:, None]
        drafts, q = super().propose(tokens, pos, count, generator)
        if count == 0 or self.probs is None:
            return drafts, q
        batch, device = len(pos), pos.device
        columns = torch.arange(count, device=device)
        fresh = columns[None] >= carried
        source = grid_neighbour(pos[:, None] + columns, self.grid)
        for _ in range(count):  # a neighbour no pass reached yet hands over to its own
            unreached = source >= self.reached[:, None]
            if not bool(unreached.any()):
                break
            source = torch.where(unreached, grid_neighbour(source, self.grid), source)
        usable = fresh & (source >= 0)
        p = self.probs[torch.arange(batch, device=device)[:, None], source % self.ring]  # [B, count, V]
        return torch.where(usable, self.draw(p, pos, generator), drafts), torch.where(usable[..., None], p, q)

    def draw(self, p: torch.Tensor, pos: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """One draw [B, count] from each neighbour distribution ``p`` [B, count, V] of the window at ``pos``:
        with token i's run-long Gumbel noise (made now for this window's outputs, which the refresh after the
        pass reads), else by inverse CDF at a fresh uniform."""
        batch, count = p.shape[:2]
        if self.coupling == "gumbel":
            self.noise = aligned_noise(*self.noise_inputs(pos, (batch, count + 1, self.vocab_size), generator))
            return (p * self.noise[:, :count]).argmax(-1)
        return inverse_cdf(p, torch.rand(batch, count, generator=generator, device=p.device))

    def observe(self, result: Verification) -> None:
        super().observe(result)
        batch, length, vocab = result.probs.shape
        if self.probs is None:
            self.probs = result.probs.new_zeros(batch, self.ring, vocab)
        slots = (result.pos[:, None] + torch.arange(length, device=result.pos.device)) % self.ring
        self.probs.scatter_(1, slots[..., None].expand(-1, -1, vocab), result.probs)
        self.reached = result.pos + length


def build_neighbour_drafter(options: object, model: nn.Module, context: DraftContext) -> NeighbourDrafter:
    """The ``neighbour`` drafter for a run: the grid from ``model.grid`` (codes only, fixed tokens never appear),
    the coupling and the first token's init from the sampler's options."""
    return NeighbourDrafter(model.vocab_size, tuple(model.grid), options.window, options.draft_init,
                            options.draft_coupling)


register_drafter("neighbour", build_neighbour_drafter)
