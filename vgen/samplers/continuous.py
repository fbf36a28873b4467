"""Samplers for continuous-token AR models with a diffusion head: target-only AR and CSpD.

Every token's denoising trajectory is driven by noise fixed up front, per (row, token): [steps + 1, C] draws,
the initial token and one per reverse step. Target-only sampling feeds the target's head that noise; CSpD feeds
the same noise to the draft and the target (trajectory alignment), so that where the two models agree their
final Gaussians nearly coincide and the draft's token is accepted.

CSpD (``cspd``), per iteration and per row, in raster order with KV caches:

1. **Pre-filling**: the target alone generates the first ``ceil(prefill_ratio * N)`` tokens (at least one).
2. **Drafting**: the draft model generates ``draft_length`` tokens autoregressively (fewer where the image ends:
   no position past the last token is drafted, verified or resampled).
3. **Verification**: one target forward over the last accepted token and the drafts gives the condition of each
   draft position and of the position after them; the target's head denoises all of them at once, with the
   same noise, giving its final Gaussians.
4. **Acceptance** left to right (:mod:`vgen.samplers.continuous_rules`): the first rejected draft is replaced
   by a residual sample and the rest are dropped; if every draft is kept, the target's own sample of the next
   position is a bonus token. Caches are rolled back per row to the kept prefix.

The reference (MAR's masked order) judges every draft independently; in raster order a draft after a rejected
one was conditioned on a token that was replaced, so it cannot be kept. At temperature 0 the trajectories are
deterministic, a draft is kept only if it equals the target's token, and the output equals target-only sampling.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn
from tqdm.auto import tqdm

from vgen.models.cache import KVCache
from vgen.models.conditioning import Condition
from vgen.models.diffusion_head import MAX_DIFFUSION_STEPS, ChainSteps, reverse_steps
from vgen.samplers.ar import decode_last
from vgen.samplers.base import (
    CFG_SCHEDULE_HELP,
    CFG_SCHEDULES,
    MAX_TOKENS,
    SampleOutput,
    Sampler,
    SamplerStats,
    SamplingParams,
    prepare_condition,
    progress_bar,
    register_sampler,
)
from vgen.samplers.compiling import COMPILE_HELP, CUDA_GRAPH_MODES, check_compile, compile_mode, compile_step
from vgen.samplers.continuous_rules import acceptance_log_ratio, sample_residual
from vgen.samplers.options import check_options, option

TOKEN_ORDER = "continuous"
HEAD_STEPS_HELP = "reverse steps of the target's diffusion head per token (MAR's sampling steps): fewer run faster"
# a head chain keeps at most one step per training timestep (MAR's heads train on 1000); a head's own count is
# checked when it samples
MAX_HEAD_STEPS = MAX_DIFFUSION_STEPS
# the residual sampler's error is at most 1 / (e * tries) per token (continuous_rules): 3.5e-7 at 2**20
MAX_RESIDUAL_TRIES = 2**20
# the reference's 42 is already far from exact; at 1000 the distances inside the widened Gaussians hardly count
MAX_INNER_TEMPERATURE = 1000


def check_continuous_params(params: SamplingParams) -> None:
    """Continuous tokens have no vocabulary to filter: refuse top-k / top-p instead of ignoring them."""
    if params.top_k or params.top_p < 1:
        raise ValueError(f"top-k / top-p filter a token vocabulary; continuous-token sampling takes neither "
                         f"(got top_k={params.top_k}, top_p={params.top_p})")


def check_continuous_compile(value: bool | str) -> None:
    """Refuse a ``compile`` setting that is not a mode, and the CUDA-graph modes, which the continuous samplers do
    not take: a decode step's cache grows every token, which a captured graph cannot follow."""
    check_compile(value)
    if compile_mode(value) in CUDA_GRAPH_MODES:
        raise ValueError(f"the continuous-token samplers compile without CUDA graphs; use compile=True or "
                         f"'max-autotune-no-cudagraphs', got {value!r}")


@dataclass(frozen=True)
class TokenSteps:
    """A continuous model's per-token work as a sampler runs it, eagerly or compiled: ``decode(model, tokens,
    cache)`` appends one token a row and returns the next condition (:func:`~vgen.samplers.ar.decode_last`), and
    ``chain`` runs its head's reverse steps (:func:`~vgen.models.diffusion_head.reverse_steps`)."""

    decode: Callable[[nn.Module, torch.Tensor, KVCache], torch.Tensor]
    chain: ChainSteps


def token_steps(sampler: Sampler, role: str) -> TokenSteps:
    """The eager steps, or with the sampler's ``compile`` a compiled copy of each for this sampler configuration
    and ``role`` (the target or the draft), with dynamic shapes: one graph serves every cache length, one more
    each batch size and chain length."""
    mode = compile_mode(sampler.compile)
    if mode is None:
        return TokenSteps(decode_last, reverse_steps)
    config = (sampler, role)
    return TokenSteps(compile_step(decode_last, mode, config), compile_step(reverse_steps, mode, config))


def prepare(sampler: Sampler, model: nn.Module, cond: Condition, params: SamplingParams,
            generator: torch.Generator | None) -> tuple[Condition, Condition, torch.Tensor]:
    """The condition and the rows the model runs (:func:`~vgen.samplers.base.prepare_condition`) after refusing
    top-k / top-p, and the noise of every token's trajectory, [B, N, steps + 1, C] for the sampler's
    ``head_steps`` (or the head's own count), drawn in one call from ``generator`` (row b gets the same noise
    whatever the batch size)."""
    check_continuous_params(params)
    cond, batch_cond = prepare_condition(sampler, model, cond, params)
    if sampler.head_steps > model.head.cfg.num_train_steps:
        raise ValueError(f"head_steps must be at most {model.head.cfg.num_train_steps} (the head's training "
                         f"timesteps), got {sampler.head_steps}")
    steps = len(model.head.sampling_schedule(sampler.head_steps or None))
    noise = torch.randn((len(cond), model.num_tokens, steps + 1, model.token_channels), generator=generator,
                        device=cond.device)
    return cond, batch_cond, noise


def _guided(x: torch.Tensor, guided: bool) -> torch.Tensor:
    return torch.cat([x, x]) if guided else x


def denoise(model: nn.Module, z: torch.Tensor, noise: torch.Tensor, params: SamplingParams, schedule: str,
            index: int | torch.Tensor,
            chain: ChainSteps = reverse_steps) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens of several positions per row at once: conditions z [B', P, dim] ([cond; uncond] halves when
    guided), trajectory noise [B, P, steps + 1, C] and the positions' token indices ``index`` (an int, or
    [B, P]) -> (x, mean, std) of the last step of a ``steps``-step reverse chain, each [B, P, C]. Guidance
    follows ``schedule`` over the tokens (:meth:`~vgen.samplers.base.SamplingParams.scheduled_cfg_scale`); ``chain``
    runs the reverse steps (:class:`TokenSteps`)."""
    b, p, draws, c = noise.shape
    zz = z.reshape(-1, z.shape[-1])  # [cond rows; uncond rows] stays in that order
    scale = params.scheduled_cfg_scale(schedule, index + 1, model.num_tokens) if params.guided else 1.0
    if isinstance(scale, torch.Tensor):
        scale = scale.to(zz.dtype).reshape(-1)  # one per (row, position), in the order of the noise's rows
    x, mean, std = model.head.sample(zz, noise.reshape(b * p, draws, c).transpose(0, 1), params.temperature,
                                     scale, draws - 1, guided=params.guided, steps=chain)
    return x.reshape(b, p, c), mean.reshape(b, p, c), std.reshape(b, p, c)


def chain_draws(target_steps: int, draft_steps: int) -> torch.Tensor:
    """Which of a target trajectory's ``target_steps + 1`` noise draws a ``draft_steps`` chain reads: the initial
    token, then evenly spaced draws ending with the last one, so the draft's final draw is the target's.

    Any fixed choice keeps CSpD exact: the draft's last Gaussian depends only on draws before the last, and its
    token is that Gaussian's mean plus its std times the last draw, so given the earlier draws it is distributed
    as that Gaussian, the density the acceptance test divides by.
    """
    if not 1 <= draft_steps <= target_steps:
        raise ValueError(f"the draft's head chain must take 1 to {target_steps} steps (the target's), "
                         f"got {draft_steps}")
    steps = torch.linspace(target_steps / draft_steps, target_steps, draft_steps).round().long()
    return torch.cat([torch.zeros(1, dtype=torch.long), steps])


def one_per_pass(model: nn.Module, z: torch.Tensor, cache: KVCache, noise: torch.Tensor, params: SamplingParams,
                 schedule: str, tokens: torch.Tensor, count: int, bar: tqdm, steps: TokenSteps) -> None:
    """Target-only generation of the first ``count`` tokens into ``tokens`` [B, >= count, C], starting from the
    prefill's condition ``z``: one head trajectory and (but for the last token) one decode pass per token."""
    for i in range(count):
        tokens[:, i] = denoise(model, z[:, None], noise[:, i:i + 1], params, schedule, i, steps.chain)[0][:, 0]
        bar.update(len(tokens))
        if i + 1 < count:
            z = steps.decode(model, _guided(tokens[:, i:i + 1], params.guided), cache)


def _start(model: nn.Module, batch_cond: Condition, extra: int) -> tuple[KVCache, torch.Tensor]:
    cache = model.new_cache(len(batch_cond), extra=extra)
    return cache, model.prefill(batch_cond, cache)


@register_sampler
@dataclass(frozen=True)
class ContinuousARSampler(Sampler):
    """One target forward and one head trajectory per token (the baseline CSpD is lossless against). ``compile``
    compiles the decode step and the head chain's steps (:func:`token_steps`)."""

    name: ClassVar[str] = "continuous-ar"
    token_order: ClassVar[str] = TOKEN_ORDER
    description: ClassVar[str] = "target-only sampling, one forward pass and one diffusion-head chain per token"
    head_steps: int = option(0, HEAD_STEPS_HELP, at_least=0, at_most=MAX_HEAD_STEPS, note="0 = the model's")
    cfg_schedule: str = option("constant", CFG_SCHEDULE_HELP, choices=CFG_SCHEDULES)
    compile: bool | str = option(False, COMPILE_HELP)

    def __post_init__(self) -> None:
        check_options(self)
        check_continuous_compile(self.compile)

    @torch.no_grad()
    def sample(self, model: nn.Module, cond: Condition, params: SamplingParams, *,
               generator: torch.Generator | None = None, progress: bool = False,
               tokenizer: nn.Module | None = None, draft_head: nn.Module | None = None) -> SampleOutput:
        start = time.perf_counter()
        cond, batch_cond, noise = prepare(self, model, cond, params, generator)
        device, batch, n = cond.device, len(cond), model.num_tokens
        cache, z = _start(model, batch_cond, extra=0)
        tokens = torch.empty(batch, n, model.token_channels, device=device)
        with progress_bar(progress, batch * n, self.name) as bar:
            one_per_pass(model, z, cache, noise, params, self.cfg_schedule, tokens, n, bar,
                         token_steps(self, "target"))
        stats = SamplerStats(sampler=self.name, forward_passes=n, tokens=batch * n,
                             wall_time_s=time.perf_counter() - start, batch_size=batch,
                             accept_step=torch.arange(1, n + 1).repeat(batch, 1))
        return SampleOutput(tokens=tokens, stats=stats)


def check_draft(target: nn.Module, draft: nn.Module | None) -> nn.Module:
    """The draft must be a continuous-token model over the same token grid, channels and classes."""
    if draft is None:
        raise ValueError("cspd needs a draft model (a smaller continuous-token AR over the same latents)")
    if getattr(draft, "token_order", None) != TOKEN_ORDER:
        raise ValueError(f"the cspd draft must be a continuous-token model, got {type(draft).__name__}")
    mine = (target.grid, target.token_channels, target.num_classes)
    theirs = (draft.grid, draft.token_channels, draft.num_classes)
    if mine != theirs:
        raise ValueError(f"draft and target latents differ: target grid/channels/classes {mine}, draft {theirs}")
    if draft.training:
        raise ValueError("the draft model is in training mode; call draft.eval() first")
    return draft


@register_sampler
@dataclass(frozen=True)
class CSpD(Sampler):
    """Continuous speculative decoding: a small draft model proposes, the target verifies in one forward.

    ``draft_length`` tokens per iteration; ``prefill_ratio`` in [0, 1) of the tokens come from the target alone
    first; ``inner_temperature`` 1 is exact, larger values loosen acceptance (the reference uses 42; lossy);
    ``max_residual_tries`` bounds the residual sampler (see :mod:`vgen.samplers.continuous_rules`).
    ``head_steps`` sets the target's head chain and ``draft_steps`` the draft's, which reads a subset of the
    target's trajectory noise (see :func:`chain_draws`). The stats' ``details`` count the residual fallbacks and
    the draft's head chains (each over the whole batch), and give ``median_draft_gap_in_target_stds``, how far
    the draft's final means sit from the target's in units of the target's final std: exact acceptance needs it
    well below 1. ``compile`` compiles the target's decode step and both head chains' steps
    (:func:`token_steps`); the multi-token passes (the draft's and the verification) run eagerly.
    """

    name: ClassVar[str] = "cspd"
    token_order: ClassVar[str] = TOKEN_ORDER
    description: ClassVar[str] = ("continuous speculative decoding, a draft model proposes and the target "
                                  "verifies (lossy above --inner-temperature 1)")
    lossless: ClassVar[bool | None] = True
    draft_length: int = option(4, "tokens the draft model proposes per pass", at_least=1, at_most=MAX_TOKENS)
    prefill_ratio: float = option(0.05, "share of the tokens the target generates alone first", at_least=0,
                                  below=1)
    inner_temperature: float = option(1.0, "above 1 widens both Gaussians in the acceptance test, lossily; the "
                                           "reference uses 42", at_least=1, at_most=MAX_INNER_TEMPERATURE,
                                      note="1 = exact")
    max_residual_tries: int = option(4096, "draws of the residual sampler before it falls back", at_least=1,
                                     at_most=MAX_RESIDUAL_TRIES)
    head_steps: int = option(0, HEAD_STEPS_HELP, at_least=0, at_most=MAX_HEAD_STEPS, note="0 = the model's")
    draft_steps: int = option(0, "reverse steps of the draft's head chain, reading a subset of the target's "
                                 "trajectory noise; fewer steps draft faster and stay exact", at_least=0,
                              at_most=MAX_HEAD_STEPS, note="0 = the target's")
    cfg_schedule: str = option("constant", CFG_SCHEDULE_HELP, choices=CFG_SCHEDULES)
    compile: bool | str = option(False, COMPILE_HELP)

    def __post_init__(self) -> None:
        check_options(self)
        check_continuous_compile(self.compile)

    @torch.no_grad()
    def sample(self, model: nn.Module, cond: Condition, params: SamplingParams, *,
               generator: torch.Generator | None = None, progress: bool = False,
               tokenizer: nn.Module | None = None, draft_head: nn.Module | None = None) -> SampleOutput:
        """``draft_head`` is the draft model (a :class:`~vgen.models.mar.ContinuousAR`)."""
        start_time = time.perf_counter()
        cond, batch_cond, noise = prepare(self, model, cond, params, generator)
        draft = check_draft(model, draft_head)
        target_steps = noise.shape[2] - 1
        draft_steps = self.draft_steps or target_steps
        draws = chain_draws(target_steps, draft_steps).to(device=noise.device)
        steps, draft_chain = token_steps(self, "target"), token_steps(self, "draft").chain
        device, batch, n, guided = cond.device, len(cond), model.num_tokens, params.guided
        k, rows = min(self.draft_length, n), len(batch_cond)  # no round drafts past the image: caches need no more
        tokens = torch.zeros(batch, n, model.token_channels, device=device)
        accept_step = torch.zeros(batch, n, dtype=torch.long)
        draft_passes = fallbacks = drafted = 0
        gaps: list[torch.Tensor] = []  # per draft: |mean_p - mean_q| in units of std_p, averaged over channels
        accepted_lengths: list[int] = []

        # 1. pre-filling: the target alone, the same for every row
        prefill = max(1, math.ceil(self.prefill_ratio * n))
        cache, z = _start(model, batch_cond, extra=k + 1)
        with progress_bar(progress, batch * n, self.name) as bar:
            one_per_pass(model, z, cache, noise, params, self.cfg_schedule, tokens, prefill, bar, steps)
            accept_step[:, :prefill] = torch.arange(1, prefill + 1)
            passes = prefill  # the prefill pass, then one decode pass per pre-filled token but the last
            pos = torch.full((batch,), prefill, dtype=torch.long, device=device)  # tokens done per row

            # the draft reads the prefix once; later rounds re-feed each row's last two tokens
            draft_cache = draft.new_cache(rows, extra=k + 1)
            draft.prefill(batch_cond, draft_cache)
            zq = draft.decode(_guided(tokens[:, :prefill], guided), draft_cache)[:, -1]
            draft_passes += 2
            first_round = True
            ar = torch.arange(batch, device=device)
            while bool((pos < n).any()):
                # drafts and verification cover only positions inside the image: a row with room for r < k tokens
                # keeps at most r drafts and is then done (no residual or bonus token past its last position)
                room = (n - pos).clamp(min=0)  # [B] tokens a row still needs
                kr = min(k, int(room.max()))  # drafts this round
                # 2. drafting
                if not first_round:
                    two = torch.stack([tokens[ar, pos - 2], tokens[ar, pos - 1]], 1)
                    zq = draft.decode_rows(_guided(two, guided), _guided(pos - 1, guided), draft_cache)[:, -1]
                    draft_passes += 1
                first_round = False
                drafts, mean_q, std_q = [], [], []
                for j in range(kr):
                    idx = (pos + j).clamp(max=n - 1)[:, None]
                    x, m, sd = (t[:, 0] for t in denoise(draft, zq[:, None], noise[ar[:, None], idx][:, :, draws],
                                                              params, self.cfg_schedule, idx, draft_chain))
                    drafts.append(x)
                    mean_q.append(m)
                    std_q.append(sd)
                    if j + 1 < kr:
                        zq = draft.decode_rows(_guided(x[:, None], guided), _guided(pos + j + 1, guided),
                                               draft_cache)[:, -1]
                        draft_passes += 1
                drafted += kr
                drafts_t = torch.stack(drafts, 1)  # [B, kr, C]
                # 3. verification: last accepted token + drafts, written from slot pos (slot s holds token s - 1)
                window = torch.cat([tokens[ar, pos - 1][:, None], drafts_t], 1)
                zp = model.decode_rows(_guided(window, guided), _guided(pos, guided), cache)  # [B', kr + 1, dim]
                passes += 1
                positions = (pos[:, None] + torch.arange(kr + 1, device=device)).clamp(max=n - 1)  # [B, kr + 1]
                xp, mean_p, std_p = denoise(model, zp, noise[ar[:, None], positions], params, self.cfg_schedule,
                                            positions, steps.chain)
                # 4. acceptance, left to right
                mq, sq = torch.stack(mean_q, 1), torch.stack(std_q, 1)
                inside = torch.arange(kr, device=device)[None] < room[:, None]  # [B, kr] drafts inside the image
                gaps.append(((mean_p[:, :kr] - mq).abs() / std_p[:, :kr]).mean(-1)[inside].cpu())
                if params.temperature == 0:
                    ok = (drafts_t == xp[:, :kr]).all(-1)
                else:
                    log_ratio = acceptance_log_ratio(drafts_t, mq, sq, mean_p[:, :kr], std_p[:, :kr],
                                                     self.inner_temperature)
                    u = torch.rand(log_ratio.shape, generator=generator, device=device)
                    ok = u.log() < log_ratio
                kept = torch.minimum(torch.cumprod(ok.long(), 1).sum(1), room)  # [B] drafts kept
                new = torch.zeros(batch, model.token_channels, device=device)
                more = kept < room  # rows that take a target token after their kept drafts
                full = more & (kept == kr)  # every draft kept: the target's bonus token
                new[full] = xp[full, kr]
                rej = more & ~full  # a rejected draft: a residual sample in its place
                if bool(rej.any()):
                    r = ar[rej]
                    j = kept[rej]
                    if params.temperature == 0:
                        new[rej] = xp[r, j]
                    else:
                        new[rej], fell = sample_residual(mean_p[r, j], std_p[r, j], mq[r, j], sq[r, j], xp[r, j],
                                                         generator, self.max_residual_tries)
                        fallbacks += int(fell.sum())
                step = kept + more.long()  # [B] tokens each row gains
                for b in range(batch):
                    if room[b] == 0:
                        continue
                    p0, m, g = int(pos[b]), int(kept[b]), int(step[b])
                    tokens[b, p0:p0 + m] = drafts_t[b, :m]
                    tokens[b, p0 + m:p0 + g] = new[b]
                    accept_step[b, p0:p0 + g] = passes
                    accepted_lengths.append(g)
                    bar.update(g)
                pos = pos + step
        stats = SamplerStats(sampler=self.name, forward_passes=passes, tokens=batch * n,
                             wall_time_s=time.perf_counter() - start_time, batch_size=batch,
                             draft_forward_passes=draft_passes, accepted_lengths=accepted_lengths,
                             accept_step=accept_step,
                             details={"prefill_tokens": prefill, "draft_length": k, "draft_steps": draft_steps,
                                      "draft_head_chains": drafted,
                                      "inner_temperature": self.inner_temperature,
                                      "residual_fallbacks": fallbacks,
                                      "median_draft_gap_in_target_stds": float(torch.cat(gaps).median())})
        return SampleOutput(tokens=tokens, stats=stats)
