"""Next-neighbour sampling for NAR models: one forward pass per step, every token of the step drawn at once.

The prefill runs the class position and draws the first token; each later pass feeds the tokens just drawn
(written to the KV cache at their raster slots) and returns the logits of every token one step further from the
origin: ``H + W - 1`` passes for an image, ``T + H + W - 2`` for a video (``T + 2 (H + W) - 4`` for a model that
draws frame 0 first, ``image_first``), against ``H * W`` (``T * H * W``) for next-token AR. The tokens of a step
are drawn independently, each from its own processed distribution, as NAR does.

Guidance follows the AR sampler: the batch is doubled as [cond; null] once and both halves are fed the same
tokens; ``cfg_interval`` is read as for AR with a step's first token index (the tokens drawn before it), so a step
is guided iff a raster-order token with that index would be. NAR's own sampler switches guidance off once the
tokens drawn before a step exceed ``cfg_interval``, one token earlier; the default (-1, always on) is the same.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import torch

from vgen.models.conditioning import Condition
from vgen.samplers.base import (
    SampleOutput,
    Sampler,
    SamplerStats,
    SamplingParams,
    prepare_condition,
    progress_bar,
    register_sampler,
)
from vgen.samplers.logits import apply_cfg, build_processors, sample_logits


@register_sampler
@dataclass(frozen=True)
class NARSampler(Sampler):
    """All tokens at the same Manhattan distance from the first token per forward pass (NAR models only)."""

    name: ClassVar[str] = "nar"
    token_order: ClassVar[str] = "next-neighbour"
    description: ClassVar[str] = "all cells of a diagonal per forward pass"

    @torch.no_grad()
    def sample(self, model: torch.nn.Module, cond: Condition, params: SamplingParams, *,
               generator: torch.Generator | None = None, progress: bool = False,
               tokenizer: torch.nn.Module | None = None, draft_head: torch.nn.Module | None = None) -> SampleOutput:
        start = time.perf_counter()
        cond, batch_cond = prepare_condition(self, model, cond, params)
        device, batch, n, guided = cond.device, len(cond), model.num_tokens, params.guided
        cache = model.new_cache(len(batch_cond))
        processors = build_processors(params)
        tokens = torch.empty(batch, n, dtype=torch.long, device=device)
        steps, drawn = model.steps, 0
        with progress_bar(progress, batch * n, self.name) as bar:
            logits = model.prefill(batch_cond, cache)
            for s, positions in enumerate(steps):
                sampled = sample_logits(processors(apply_cfg(logits, params, drawn)), params.greedy, generator)[0]
                tokens[:, positions] = sampled
                drawn += len(positions)
                bar.update(batch * len(positions))
                if s + 1 < len(steps):
                    logits = model.decode(torch.cat([sampled, sampled]) if guided else sampled, s, cache)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_of = torch.empty(n, dtype=torch.long)
        for s, positions in enumerate(steps):
            step_of[positions.cpu()] = s + 1
        stats = SamplerStats(sampler=self.name, forward_passes=len(steps), tokens=batch * n,
                             wall_time_s=time.perf_counter() - start, batch_size=batch,
                             accept_step=step_of.repeat(batch, 1), details={"grid": list(model.grid)})
        return SampleOutput(tokens=tokens, stats=stats)
