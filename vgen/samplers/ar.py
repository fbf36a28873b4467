"""Vanilla autoregressive sampling over a KV cache: LlamaGen's ``generate()``, one forward pass per token.

With guidance (``cfg_scale > 1``) the batch is doubled as [cond; null] once at the prefill and both halves are
fed the same sampled token at every step; the guided logits are processed (temperature, top-k, top-p) and one
token per sample is drawn from the caller's generator. This is the baseline the speculative samplers are
measured against (step compression and latency ratio) and must equal when they are lossless and greedy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import torch
from tqdm.auto import tqdm

from vgen.samplers.base import (
    SampleOutput,
    Sampler,
    SamplerStats,
    SamplingParams,
    check_inputs,
    register_sampler,
)
from vgen.samplers.logits import apply_cfg, build_processors, sample_logits


@register_sampler
@dataclass(frozen=True)
class ARSampler(Sampler):
    """One token per forward pass. ``compile`` wraps the per-token decode step with ``torch.compile`` (slow to
    compile, worth it only for long runs)."""

    name: ClassVar[str] = "ar"
    compile: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.compile, bool):
            raise ValueError(f"compile must be a bool, got {self.compile!r}")

    @torch.no_grad()
    def sample(self, model: torch.nn.Module, class_ids: torch.Tensor, params: SamplingParams, *,
               generator: torch.Generator | None = None, progress: bool = False) -> SampleOutput:
        check_inputs(model, class_ids)
        start = time.perf_counter()
        device = next(model.parameters()).device
        class_ids = class_ids.to(device)
        batch, n = class_ids.shape[0], model.num_tokens
        cond = torch.cat([class_ids, model.null_condition(class_ids)]) if params.guided else class_ids
        decode = torch.compile(model.decode) if self.compile else model.decode
        processors = build_processors(params)
        tokens = torch.empty(batch, n, dtype=torch.long, device=device)
        cache = model.new_cache(cond.shape[0])
        with tqdm(total=n, desc=self.name, unit="tok", disable=not progress) as bar:
            logits = model.prefill(cond, cache)
            for t in range(n):
                if t:
                    prev = tokens[:, t - 1:t]
                    logits = decode(torch.cat([prev, prev]) if params.guided else prev, cache)[:, -1]
                logits = processors(apply_cfg(logits, params, t))
                tokens[:, t] = sample_logits(logits, params.greedy, generator)[0]
                bar.update()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        stats = SamplerStats(sampler=self.name, forward_passes=n, tokens=batch * n,
                             wall_time_s=time.perf_counter() - start, batch_size=batch,
                             accept_step=torch.arange(1, n + 1).repeat(batch, 1))
        return SampleOutput(tokens=tokens, stats=stats)
