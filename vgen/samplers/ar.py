"""Vanilla autoregressive sampling over a KV cache: LlamaGen's ``generate()``, one forward pass per token.

With guidance (``cfg_scale > 1``) the batch is doubled as [cond; null] once at the prefill and both halves are
fed the same sampled token at every step; the guided logits are processed (temperature, top-k, top-p) and one
token per sample is drawn from the caller's generator. This is the baseline the speculative samplers are
measured against (step compression and latency ratio) and must equal when they are lossless and greedy.

The prefill runs the class position once; every later step feeds one token per row and reads everything
before it from the cache. ``compile`` wraps that per-token step with ``torch.compile``:

- ``True`` (mode ``"default"``) or ``"max-autotune-no-cudagraphs"`` compile ``model.decode`` with dynamic
  shapes, so one graph serves every cache length (and batch size) and attention still reads only the filled
  part of the cache: the fastest choice on CPU.
- ``"reduce-overhead"`` or ``"max-autotune"`` (CUDA graphs) compile ``model.decode_step``, whose shapes are
  static: the position is a tensor and attention spans the whole preallocated cache under a mask. CUDA graphs
  need the cache at fixed addresses, so these modes keep one cache per model between calls (reused when the
  batch, dtype and device match) and mark its buffers static.

Compiled graphs are cached per mode for the life of the process; the first call pays the compilation.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import ClassVar

import torch

from vgen.models.cache import KVCache
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
from vgen.samplers.compiling import (
    COMPILE_HELP,
    CUDA_GRAPH_MODES,
    check_compile,
    compile_mode,
    keep_static_cache,
    take_static_cache,
)
from vgen.samplers.logits import draw, target_probs
from vgen.samplers.options import option


def decode_last(model: torch.nn.Module, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Append tokens [B, k] to ``cache``; the model's output for the last of them (the next token's logits, or a
    continuous model's condition)."""
    return model.decode(tokens, cache)[:, -1]


def _decode_step(model: torch.nn.Module, tokens: torch.Tensor, slot: torch.Tensor, cache: KVCache) -> torch.Tensor:
    return model.decode_step(tokens, slot, cache)


@functools.cache
def compiled_step(mode: str):
    """The compiled per-token step for ``mode`` (built once per process; graphs are made on first call)."""
    if mode in CUDA_GRAPH_MODES:
        return torch.compile(_decode_step, mode=mode, fullgraph=True)
    return torch.compile(decode_last, mode=mode, dynamic=True, fullgraph=True)


@register_sampler
@dataclass(frozen=True)
class ARSampler(Sampler):
    """One token per forward pass. ``compile`` (False, True or a ``torch.compile`` mode name) compiles the
    per-token decode step: slow the first time (tens of seconds on CPU), faster per token afterwards."""

    name: ClassVar[str] = "ar"
    description: ClassVar[str] = "vanilla sampling, one token per forward pass (KV cache, CFG, optional torch.compile)"
    compile: bool | str = option(False, COMPILE_HELP)

    def __post_init__(self) -> None:
        check_compile(self.compile)

    @property
    def compile_mode(self) -> str | None:
        """The ``torch.compile`` mode of the decode step, None when it runs eagerly."""
        return compile_mode(self.compile)

    @torch.no_grad()
    def sample(self, model: torch.nn.Module, cond: Condition, params: SamplingParams, *,
               generator: torch.Generator | None = None, progress: bool = False,
               tokenizer: torch.nn.Module | None = None, draft_head: torch.nn.Module | None = None) -> SampleOutput:
        start = time.perf_counter()
        cond, batch_cond = prepare_condition(self, model, cond, params)
        device, batch, n, guided = cond.device, len(cond), model.num_tokens, params.guided
        mode = self.compile_mode
        static = mode in CUDA_GRAPH_MODES
        cache = take_static_cache(model, len(batch_cond)) if static else model.new_cache(len(batch_cond))
        if mode is None:
            step = functools.partial(decode_last, model)
        elif static:
            compiled, slot = compiled_step(mode), torch.ones(1, dtype=torch.long, device=device)

            def step(x: torch.Tensor, cache: KVCache) -> torch.Tensor:
                torch.compiler.cudagraph_mark_step_begin()
                logits = compiled(model, x, slot, cache)
                cache.advance(1)
                slot.add_(1)
                return logits
        else:
            step = functools.partial(compiled_step(mode), model)
        tokens = torch.empty(batch, n, dtype=torch.long, device=device)
        with progress_bar(progress, batch * n, self.name) as bar:
            logits = model.prefill(batch_cond, cache)
            for t in range(n):
                sampled = draw(target_probs(logits, params, t), params.greedy, generator)
                tokens[:, t] = sampled
                bar.update(batch)
                if t + 1 < n:
                    prev = sampled[:, None]  # [B, 1] and contiguous, guided or not: one compiled graph serves both
                    logits = step(torch.cat([prev, prev]) if guided else prev, cache)
        if static:
            keep_static_cache(model, cache)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        stats = SamplerStats(sampler=self.name, forward_passes=n, tokens=batch * n,
                             wall_time_s=time.perf_counter() - start, batch_size=batch,
                             accept_step=torch.arange(1, n + 1).repeat(batch, 1))
        return SampleOutput(tokens=tokens, stats=stats)
