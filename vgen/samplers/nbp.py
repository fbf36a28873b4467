"""Next-block sampling for NBP backbones (:mod:`vgen.models.nbp`): one forward pass per block.

Step ``k`` (1-based) feeds the block drawn at step ``k - 1`` (the begin-of-video slots at step 1) and draws all
``B`` tokens of block ``k - 1`` at once, each independently (temperature, top-k, top-p, then a draw), as NBP's
``sample_with_past`` does. The step count equals the number of blocks. A hybrid model (NBP's
``hybrid_sample_with_past``) draws block 0 one token per pass first, ``B + K - 1`` passes in all (``L + K - m``
with its first ``m`` blocks, ``L`` tokens, drawn token by token).

Classifier-free guidance is LlamaGen's ``u + s (c - u)`` on a doubled batch [cond; null]. NBP writes it as
``(1 + t) c - t u``, the same thing with ``s = 1 + t``. ``cfg_schedule="constant"`` keeps ``s`` for every block
(LlamaGen; ``cfg_interval`` is read as for AR with a block's first token index, so a block is guided iff a
raster-order token with that index would be); ``"linear"`` ramps the guidance weight ``t = s - 1`` linearly over
the blocks, ``t_k = (s - 1)(k + 1) / K`` for block ``k`` of ``K``, NBP's ``scale_cfg`` (``t = ratio * n``)
normalised so that the last block gets the full scale.

Continuation. ``prefix`` holds the tokens of leading whole blocks (e.g. given first frames, NBP's frame-prediction
setting) and the model continues from them. Given blocks that cover the hybrid start run in one pass with the
class (:meth:`~vgen.models.nbp.NBPTransformer.prefill_given`), so continuing ``k`` given blocks of ``K`` takes
``K - k`` passes; a shorter prefix is fed instead of drawn, at the passes that would have drawn it. The stats
count the drawn tokens only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import torch

from vgen.models.conditioning import Condition
from vgen.samplers.base import (
    CFG_SCHEDULE_HELP,
    CFG_SCHEDULES,
    SampleOutput,
    Sampler,
    SamplerStats,
    SamplingParams,
    prepare_condition,
    progress_bar,
    register_sampler,
)
from vgen.samplers.logits import apply_cfg, build_processors, cfg_merge, sample_logits
from vgen.samplers.options import check_options, option


@register_sampler
@dataclass(frozen=True)
class NBPSampler(Sampler):
    """All tokens of one block (a row or a frame) per forward pass (NBP models only)."""

    name: ClassVar[str] = "nbp"
    token_order: ClassVar[str] = "next-block"
    description: ClassVar[str] = "one row (or frame) of codes per forward pass"
    continues: ClassVar[bool] = True
    cfg_schedule: str = option("constant", CFG_SCHEDULE_HELP, choices=CFG_SCHEDULES)

    def __post_init__(self) -> None:
        check_options(self)

    def guide(self, logits: torch.Tensor, params: SamplingParams, block: int, num_blocks: int,
              first_token: int) -> torch.Tensor:
        """The logits of the samples [B, n, V] from the CFG batch's [2B, n, V] for block ``block`` of
        ``num_blocks`` whose first raster index is ``first_token``."""
        if self.cfg_schedule == "constant" or not params.guided:
            return apply_cfg(logits, params, first_token)
        cond, uncond = logits.chunk(2)
        return cfg_merge(cond, uncond, params.scheduled_cfg_scale(self.cfg_schedule, block + 1, num_blocks))

    @torch.no_grad()
    def sample(self, model: torch.nn.Module, cond: Condition, params: SamplingParams, *,
               generator: torch.Generator | None = None, progress: bool = False,
               tokenizer: torch.nn.Module | None = None, draft_head: torch.nn.Module | None = None,
               prefix: torch.Tensor | None = None) -> SampleOutput:
        """Draw a token grid for each row of ``cond``; ``prefix`` [B, k * block_size] (0 < k < blocks) fixes the leading
        blocks, which the model then continues."""
        start = time.perf_counter()
        cond, batch_cond = prepare_condition(self, model, cond, params)
        device, batch, n, guided = cond.device, len(cond), model.num_tokens, params.guided
        b = model.block_size
        cache = model.new_cache(len(batch_cond))
        processors = build_processors(params)
        tokens = torch.empty(batch, n, dtype=torch.long, device=device)
        num_blocks = n // b
        given = check_prefix(prefix, batch, b, n, model.config.vocab_size)
        if given:
            tokens[:, :given] = prefix.to(device)

        def draw(logits: torch.Tensor, k: int, first_token: int, count: int) -> torch.Tensor:
            if first_token + count <= given:
                return tokens[:, first_token:first_token + count]
            return sample_logits(processors(self.guide(logits, params, k, num_blocks, first_token)), params.greedy,
                                 generator)[0]

        def feed(drawn: torch.Tensor) -> torch.Tensor:
            return torch.cat([drawn, drawn]) if guided else drawn

        first = model.first_tokens
        prefilled = given >= max(b, first)  # the given blocks run in one pass
        with progress_bar(progress, batch * n, self.name) as bar:
            if prefilled:
                logits = model.prefill_given(batch_cond, feed(tokens[:, :given]), cache)
                bar.update(batch * given)
            else:
                logits = model.prefill(batch_cond, cache)
            if model.hybrid and not prefilled:  # the first blocks token by token
                for i in range(first):
                    tokens[:, i:i + 1] = draw(logits, i // b, i, 1)
                    bar.update(batch)
                    if i + 1 < first:
                        logits = model.decode_first_block(feed(tokens[:, i:i + 1]), cache)
                logits = model.decode(feed(tokens[:, first - b:first]), cache)
            for k in range(given // b if prefilled else first // b, num_blocks):
                block = draw(logits, k, k * b, b)
                tokens[:, k * b:(k + 1) * b] = block
                bar.update(batch * b)
                if k + 1 < num_blocks:
                    logits = model.decode(feed(block), cache)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_of = torch.arange(n) // b + 1
        if prefilled:  # given tokens take no pass of their own; block k >= given / b at pass k - given / b + 1
            step_of = (step_of - given // b).clamp(min=0)
        elif model.hybrid:  # token i < L at pass i + 1, block k >= m at pass L + k - m + 1
            step_of = torch.where(torch.arange(n) < first, torch.arange(n) + 1, step_of + first - first // b)
        passes = num_blocks - given // b if prefilled else model.num_steps
        step_of = step_of.repeat(batch, 1)
        stats = SamplerStats(sampler=self.name, forward_passes=passes, tokens=batch * (n - given),
                             wall_time_s=time.perf_counter() - start, batch_size=batch, accept_step=step_of,
                             details={"grid": list(model.grid), "block": model.config.block, "block_size": b,
                                      "hybrid": model.hybrid, "first_tokens": first, "cfg_schedule": self.cfg_schedule,
                                      "given_tokens": given})
        return SampleOutput(tokens=tokens, stats=stats)


def check_prefix(prefix: torch.Tensor | None, batch: int, block_size: int, num_tokens: int, vocab_size: int) -> int:
    """The number of given tokens (0 without a prefix); a clear error for a prefix that is not whole leading
    blocks of every sample, that leaves nothing to draw, or that holds tokens outside the vocabulary."""
    if prefix is None:
        return 0
    if prefix.ndim != 2 or prefix.shape[0] != batch:
        raise ValueError(f"prefix must be [batch={batch}, tokens], got shape {tuple(prefix.shape)}")
    given = prefix.shape[1]
    if given == 0 or given % block_size or given >= num_tokens:
        raise ValueError(f"prefix must hold whole blocks of {block_size} tokens and fewer than all {num_tokens}, "
                         f"got {given} tokens")
    if prefix.is_floating_point() or int(prefix.min()) < 0 or int(prefix.max()) >= vocab_size:
        raise ValueError(f"prefix must hold integer token ids in [0, {vocab_size}), got {prefix.dtype} values in "
                         f"[{prefix.min().item()}, {prefix.max().item()}]")
    return given
