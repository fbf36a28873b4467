"""Block-diffusion streaming (``vgen stream``): an unbounded video generated block by block, each block denoised
in a few flow-matching steps against a bounded key/value cache of earlier blocks, and yielded as soon as it is
done (the loop Inferix runs for Self-Forcing / CausVid, with BlockVid's semantic sparse context as an option).

Per block:

1. the context is read once from the :class:`~vgen.models.rolling_cache.RollingKVCache` (sinks, retrieved
   blocks, local window), and the block takes the frame positions right after it;
2. fresh noise is denoised over the chunk-wise schedule (``first_steps`` for the first block, which has no
   context, ``steps`` after it), by Euler steps of the flow ODE (``solver="euler"``) or, as Self-Forcing and
   CausVid sample their few-step students, by predicting the clean block and noising it afresh to the next level
   (``solver="renoise"``); with classifier-free guidance if ``cfg_scale > 1`` on the steps that start at a noise
   level >= ``cfg_min_sigma`` (a guidance interval: the later steps run the conditional half alone, at half the
   cost);
3. one extra forward at noise level ``context_noise`` (0: clean) writes the block's keys/values, which are pushed
   into the cache (Inferix's cache update); the oldest window block is evicted when the window is full;
4. with ``refresh="recompute"``, an eviction re-encodes the kept blocks from their clean frames, as CausVid
   recomputes the overlap, so the cache always equals a fresh encoding of what it keeps.

A stream is conditioned on a *target* per stream: a class id (class models) or a prompt (text models, whose
``encode`` turns prompts into a :class:`~vgen.models.conditioning.PrefixCondition`). A *switch* to a new target
applies before a block, in one of four ways (``StreamConfig.switch``):

- ``recache`` (LongLive's KV re-cache): the resident blocks' clean frames, which the streamer always keeps (a few
  KB), are re-encoded under the new condition in one whole-clip pass and replace the cache, so the context speaks
  of the new target while it still shows the old scene (LongLive's way to change the scene without a cut); the
  pass costs less than one block's denoising, once;
- ``recache-keep-sink``: the same with the sinks' keys/values kept (LongLive's ``global_sink: true``);
- ``plain``: the new condition over the old cache (what Self-Forcing's loop gives when its prompt is swapped);
- ``reset``: the new condition over an empty cache, a new stream from ``first_steps`` (a cut: the baseline the
  switch measures compare with).

Evicted blocks in a retrieval bank keep their keys/values in every mode.

Randomness comes from one ``torch.Generator`` per stream, drawn in a fixed order, so a seed fixes the stream and a
switch changes nothing before it. :class:`StreamControl` switches the target at the next block and pauses, resumes
or stops the stream from another thread: after the block in hand, or (cancel, the web demo's Stop button) at its
next denoising step.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from vgen.images import to_uint8
from vgen.models.blockdiff import BlockContext, BlockDiffusionTransformer
from vgen.models.conditioning import Condition, PrefixCondition, cat_conditions
from vgen.models.rolling_cache import CachePolicy, RollingKVCache
from vgen.samplers.base import MAX_CFG_SCALE
from vgen.samplers.logits import cfg_merge
from vgen.samplers.options import check_options, option

REFRESH_MODES = ("none", "recompute")
SOLVERS = ("euler", "renoise")
SWITCH_MODES = ("recache", "recache-keep-sink", "plain", "reset")
Target = int | str  # what a stream is conditioned on: a class id (class models) or a prompt (text models)
MAX_STEPS = 1000  # denoising steps of one block: distilled streams take 1-8, flow matching rarely above 100
MAX_SHIFT = 100  # schedules in use shift by 1 to 10; at 100 every level from 0.1 up is moved above 0.9
# frames (and blocks, each a frame or more) of a model's trained length, which the context must fit: Self-Forcing's
# Wan model attends over 21 latent frames
MAX_FRAMES = 1024


def shift_noise_levels(sigma: torch.Tensor, shift: float) -> torch.Tensor:
    """Noise levels in [0, 1] warped by ``shift``: sigma' = shift sigma / (1 + (shift - 1) sigma), which keeps 0
    and 1 and moves every level in between up for shift > 1 (Wan's and SD3's schedule shift)."""
    if not shift > 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    return shift * sigma / (1 + (shift - 1) * sigma)


def flow_sigmas(steps: int, shift: float) -> torch.Tensor:
    """Noise levels 1 -> 0 in ``steps`` Euler steps, [steps + 1], warped by ``shift``: more of the steps at high
    noise for shift > 1, as Wan and Self-Forcing do."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    return shift_noise_levels(torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64), shift).float()


@dataclass(frozen=True)
class StreamConfig:
    """The chunk-wise schedule, guidance and context of a stream. Frame counts are in frames and must be whole
    blocks; ``sink_frames + retrieved_blocks * frames_per_block + window_frames`` plus one block must fit the
    frames the model was trained on (that is the attended sequence's longest position)."""

    steps: int = option(4, "denoising steps per block", at_least=1, at_most=MAX_STEPS)
    first_steps: int = option(8, "denoising steps of the first block", at_least=1, at_most=MAX_STEPS)
    shift: float = option(3.0, "flow-matching schedule shift", above=0, at_most=MAX_SHIFT)
    solver: str = option("euler", "denoising step: Euler on the flow ODE, or predict the clean block and noise it "
                                  "afresh to the next level (renoise)", choices=SOLVERS)
    context_noise: float = option(0.0, "noise level of the cache-writing forward", at_least=0, below=1)
    cfg_scale: float = option(1.0, "classifier-free guidance scale", at_least=0, at_most=MAX_CFG_SCALE,
                              note="guidance only above 1")
    cfg_min_sigma: float = option(0.0, "guide only the steps starting at this noise level or above (0 = every step)",
                                  at_least=0, at_most=1)
    sink_frames: int = option(2, "sink frames kept for good", at_least=0, at_most=MAX_FRAMES)
    window_frames: int = option(12, "local window in frames", at_least=0, at_most=MAX_FRAMES)
    retrieved_blocks: int = option(0, "past blocks retrieved by similarity (BlockVid's sparse context)", at_least=0,
                                   at_most=MAX_FRAMES)
    bank_blocks: int = option(0, "evicted blocks kept for retrieval", at_least=0, at_most=MAX_FRAMES)
    refresh: str = option("none", "after an eviction, keep the cached keys (none) or re-encode the kept blocks "
                                  "(recompute)", choices=REFRESH_MODES)
    switch: str = option("recache", "at a switch of target: re-encode the cached blocks under the new condition "
                                    "(recache; recache-keep-sink keeps the sinks), keep the cache (plain), or empty "
                                    "it (reset: a cut)", choices=SWITCH_MODES)

    def __post_init__(self) -> None:
        check_options(self)
        if self.refresh == "recompute" and self.context_noise > 0:
            raise ValueError("refresh='recompute' re-encodes the kept blocks from clean frames; it needs "
                             "context_noise=0")
        if self.retrieved_blocks and not self.bank_blocks:
            raise ValueError("retrieved_blocks > 0 needs a bank of evicted blocks (bank_blocks > 0)")

    def policy(self, frames_per_block: int, train_frames: int) -> CachePolicy:
        """The cache policy in blocks, checked against the model's block length and trained length."""
        for name in ("sink_frames", "window_frames"):
            if getattr(self, name) % frames_per_block:
                raise ValueError(f"{name}={getattr(self, name)} is not a whole number of {frames_per_block}-frame "
                                 f"blocks")
        if self.window_frames < frames_per_block:
            raise ValueError(f"the window ({self.window_frames} frames) is smaller than a block "
                             f"({frames_per_block} frames)")
        policy = CachePolicy(self.sink_frames // frames_per_block, self.window_frames // frames_per_block,
                             self.retrieved_blocks, self.bank_blocks)
        attended = (policy.context_blocks + 1) * frames_per_block
        if attended > train_frames:
            raise ValueError(f"sinks ({self.sink_frames}) + retrieved ({self.retrieved_blocks} blocks) + window "
                             f"({self.window_frames}) + a block = {attended} frames exceed the {train_frames} "
                             f"frames the model was trained on")
        return policy


class StreamControl:
    """Thread-safe steering of a running stream: :meth:`switch_to` (a class id or a prompt) takes effect at the
    next block; :meth:`pause` holds the stream before its next block until :meth:`resume`; :meth:`stop` ends it
    after the current block, :meth:`cancel` at the current block's next denoising step (the unfinished block is
    dropped)."""

    def __init__(self) -> None:
        self._running = threading.Event()
        self._running.set()
        self._stopped = threading.Event()
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self._target: Target | None = None

    def switch_to(self, target: Target) -> None:
        """Switch every stream of the batch to ``target`` at the next block; the stream checks it when it reads
        it (a target the model does not take is its ValueError, before that block)."""
        with self._lock:
            self._target = target

    def set_class(self, class_id: int) -> None:
        """Switch to class ``class_id`` at the next block."""
        self.switch_to(int(class_id))

    def pending_switch(self) -> Target | None:
        """The target asked for since the last call (then forgotten), or None."""
        with self._lock:
            target, self._target = self._target, None
            return target

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def stop(self) -> None:
        self._stopped.set()
        self._running.set()

    def cancel(self) -> None:
        self._cancelled.set()
        self.stop()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def wait_if_paused(self) -> None:
        while not self._running.wait(timeout=0.1):
            pass


@dataclass
class StreamBlock:
    """One finished block: uint8 frames [B, F, S, S, 3] (F = the block's frames, fewer for a final partial
    block), the index of its first frame, its class ids (class streams; [] for text streams, whose ``prompts``
    name each stream's prompt), its wall time, the bank blocks it retrieved and the whole clean block as the model
    denoised it (``latents`` [B, frames_per_block, ...]: latent frames for a latent model, before decoding).
    ``switched`` marks the first block under a new target, and ``recache_s`` the part of its ``latency_s`` spent
    re-encoding the cache for it."""

    frames: np.ndarray
    start_frame: int
    block_index: int
    class_ids: list[int]
    latency_s: float
    retrieved: list[list[int]] | None = None
    latents: torch.Tensor | None = None
    prompts: list[str] | None = None
    recache_s: float = 0.0
    switched: bool = False


@dataclass
class StreamProfile:
    """Per-block latency and resident memory of a stream; :meth:`report` is the JSON profiling record."""

    frames_per_block: int
    latencies_s: list[float] = field(default_factory=list)
    memory_mb: list[float] = field(default_factory=list)
    frames: int = 0

    def add(self, block: StreamBlock) -> None:
        self.latencies_s.append(block.latency_s)
        self.memory_mb.append(resident_memory_mb())
        self.frames += block.frames.shape[1]

    def report(self) -> dict:
        lat = np.asarray(self.latencies_s or [float("nan")])
        total = float(np.sum(self.latencies_s))
        return {"blocks": len(self.latencies_s), "frames": self.frames, "frames_per_block": self.frames_per_block,
                "total_s": total, "fps": self.frames / total if total > 0 else None,
                "block_latency_s": {"mean": float(lat.mean()), "median": float(np.median(lat)),
                                    "p95": float(np.percentile(lat, 95)), "first": float(lat[0])},
                "resident_memory_mb": {"first_block": self.memory_mb[0] if self.memory_mb else None,
                                       "last_block": self.memory_mb[-1] if self.memory_mb else None,
                                       "peak": max(self.memory_mb, default=None)},
                "per_block_latency_s": self.latencies_s}


def resident_memory_mb() -> float:
    """This process's resident set size now, in MiB (Linux ``/proc``; elsewhere the peak so far)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):  # no /proc: the peak so far is the best figure there is
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class BlockStreamer:
    """Generates a stream from a :class:`BlockDiffusionTransformer` under a :class:`StreamConfig`. A model in a
    tokenizer's latent space comes with ``decode`` (latent frames [B, F, h, w, C] -> frames [B, F, S, S, 3] in
    [-1, 1], e.g. :meth:`~vgen.tokenizers.kl.KLTokenizer.decode_frames`), run on each block before it is yielded;
    a pixel-space model's blocks are clamped to [-1, 1] instead. ``pixels`` says which the model is (default:
    pixels when there is no ``decode``); a latent stream without ``decode`` (training rollouts, which read
    :attr:`StreamBlock.latents`) yields its latents' raw uint8 view as frames. A text model streams prompts, which
    ``encode`` turns into its condition (e.g. :meth:`~vgen.models.word_encoder.WordTextEncoder.condition`)."""

    def __init__(self, model: BlockDiffusionTransformer, config: StreamConfig = StreamConfig(),
                 decode: Callable[[torch.Tensor], torch.Tensor] | None = None, pixels: bool | None = None,
                 encode: Callable[[Sequence[str]], PrefixCondition] | None = None) -> None:
        self.model, self.config, self.decode, self.encode = model.eval(), config, decode, encode
        self.pixels = decode is None if pixels is None else pixels
        self.policy = config.policy(model.frames_per_block, model.config.train_frames)
        if self.is_text and encode is None:
            raise ValueError("a text model streams prompts: give BlockStreamer its text encoder (encode)")

    @property
    def guided(self) -> bool:
        return self.config.cfg_scale > 1.0

    @property
    def is_text(self) -> bool:
        """Whether the model is conditioned on prompts (else on class ids)."""
        return self.model.is_text

    def new_cache(self, batch_size: int) -> RollingKVCache:
        m, p = self.model.config, next(self.model.parameters())
        rows = 2 * batch_size if self.guided else batch_size
        return RollingKVCache(m.n_layer, rows, m.n_head, m.head_dim, m.tokens_per_block, self.policy, p.dtype,
                              p.device)

    def condition(self, targets: Sequence[Target]) -> Condition:
        """The model's condition for one target per stream, with its null rows after it when the stream is guided
        (the batch ``[cond; null]``): class ids for a class model, the encoded prompts for a text model. The wrong
        kind of target, a blank prompt and a class out of range are each a one-line ValueError."""
        device = next(self.model.parameters()).device
        if self.is_text:
            for t in targets:
                if not isinstance(t, str):
                    raise ValueError(f"the model is prompt-conditioned: give a prompt, not the class id {t!r}")
                if not t.strip():
                    raise ValueError("a prompt is empty: give the text of what to draw")
            cond = self.encode(list(targets)).to(device)
        else:
            for t in targets:
                if isinstance(t, str):
                    raise ValueError(f"the model is class-conditional: give a class id, not the prompt {t!r}")
            cond = torch.tensor([int(t) for t in targets], device=device)
        self.model.check_condition(cond)
        return cat_conditions([cond, self.model.null_condition(cond)]) if self.guided else cond

    def _velocity(self, x: torch.Tensor, sigma: float, cond: Condition, context: BlockContext | None):
        """Velocity of a block: guided (CFG on the velocity, the doubled batch's second half unconditional) when
        the stream is guided and ``sigma`` is inside the guidance interval, else from the conditional rows alone
        (``cond`` and ``context`` hold both halves while the stream is guided)."""
        guided = self.guided and sigma >= self.config.cfg_min_sigma
        if guided:
            x = torch.cat([x, x])
        elif self.guided:
            cond = cond[:len(x)]
            context = None if context is None else context.rows(len(x))
        s = torch.full((len(x),), sigma, device=x.device)
        v, _ = self.model.forward_block(x, s, cond, context)
        if not guided:
            return v
        return cfg_merge(*v.chunk(2), self.config.cfg_scale)

    def _step(self, x: torch.Tensor, v: torch.Tensor, s: float, s_next: float,
              generator: torch.Generator) -> torch.Tensor:
        """One denoising step from level ``s`` to ``s_next`` along the path x_s = (1 - s) x_0 + s noise, whose
        velocity is noise - x_0: Euler on the ODE, or the predicted x_0 = x - s v taken to ``s_next`` with fresh
        noise (the last step, to 0, is the prediction itself)."""
        if self.config.solver == "euler":
            return x + (s_next - s) * v
        clean = x - s * v
        if s_next == 0:
            return clean
        return (1 - s_next) * clean + s_next * torch.randn(x.shape, generator=generator, device=x.device)

    @torch.no_grad()
    def stream(self, targets: Sequence[Target], num_frames: int, seed: int | None = 0,
               generator: torch.Generator | None = None, control: StreamControl | None = None,
               progress: bool = False, cache: RollingKVCache | None = None,
               switches: Sequence[tuple[int, Target | Sequence[Target]]] = ()) -> Iterator[StreamBlock]:
        """Yield the blocks of ``len(targets)`` videos of ``num_frames`` frames each, in order, one target (class
        id or prompt, as the model takes) per video. ``switches`` ((frame, target) pairs, frames increasing inside
        the stream) switch every video to the target, or each video to its own (a list of one target per video),
        before the block holding the frame (the last switch into a block wins); ``control.switch_to`` switches
        every video at the next block. Every argument is checked before the
        first block. ``cache`` (empty, from :meth:`new_cache`) may be passed to inspect it afterwards."""
        model, cfg = self.model, self.config
        targets = list(targets)
        if not targets:
            raise ValueError("no class ids or prompts: ask for at least one video")
        if num_frames <= 0:
            raise ValueError(f"frames must be > 0, got {num_frames}")
        fpb, size = model.frames_per_block, model.config.frame_size
        check_switch_frames([frame for frame, _ in switches], num_frames)
        scheduled: dict[int, Target] = {}
        for frame, target in switches:
            scheduled[frame // fpb] = self._switch_targets(frame, target, len(targets))
        cond = self.condition(targets)
        device = next(model.parameters()).device
        if generator is None:
            generator = torch.Generator(device=device).manual_seed(0 if seed is None else seed)
        num_blocks = -(-num_frames // fpb)
        cache = self.new_cache(len(targets)) if cache is None else cache
        if cache.pushed:
            raise ValueError("stream needs an empty cache")
        resident = _Resident()
        text = self.is_text
        bar = tqdm(total=num_frames, desc="stream", unit="frame", disable=not progress)
        try:
            for k in range(num_blocks):
                switched = scheduled.get(k)
                if control is not None:
                    control.wait_if_paused()
                    if control.stopped:
                        return
                    pending = control.pending_switch()
                    switched = switched if pending is None else [pending] * len(targets)
                start = time.perf_counter()
                recache_s = 0.0
                if switched is not None:
                    targets = switched
                    cond = self.condition(targets)
                    recache_s = self._switch(cache, cond, resident)
                    if control is not None and control.cancelled:
                        return
                kvs, context_blocks, picked = cache.context()
                context = model.prepare_context(kvs, context_blocks * fpb)
                sigmas = flow_sigmas(cfg.steps if context_blocks else cfg.first_steps, cfg.shift).tolist()
                x = torch.randn(len(targets), fpb, size, size, model.config.channels, generator=generator,
                                device=device)
                for s, s_next in zip(sigmas[:-1], sigmas[1:]):
                    if control is not None and control.cancelled:
                        return
                    x = self._step(x, self._velocity(x, s, cond, context), s, s_next, generator)
                clean = x.clamp(-1.0, 1.0) if self.pixels else x
                self._write_block(cache, clean, cond, context, generator, resident)
                shown = clean[:, :min(fpb, num_frames - k * fpb)]
                frames = to_uint8(shown if self.decode is None else self.decode(shown))
                latency = time.perf_counter() - start
                bar.update(frames.shape[1])
                yield StreamBlock(frames, k * fpb, k, [] if text else [int(t) for t in targets], latency,
                                  None if picked is None else [[cache.bank_ids[i] for i in row]
                                                               for row in picked[:len(targets)].tolist()],
                                  clean, list(targets) if text else None, recache_s, switched is not None)
        finally:
            bar.close()

    def _switch_targets(self, frame: int, target: Target | Sequence[Target], videos: int) -> list[Target]:
        """The targets of every video after a switch at ``frame`` to ``target`` (one for all, or a list of one
        per video), checked as :meth:`condition` checks them."""
        if isinstance(target, (list, tuple)):
            if len(target) != videos:
                raise ValueError(f"switch at frame {frame}: {len(target)} targets for {videos} videos; give one "
                                 f"target for all or one per video")
            targets = list(target)
        else:
            targets = [target] * videos
        self.condition(targets)
        return targets

    def _switch(self, cache: RollingKVCache, cond: Condition, resident: _Resident) -> float:
        """Apply a switch to ``cond`` (the full condition, null rows included when guided) to the cache, as
        ``config.switch`` says; returns the seconds spent re-encoding it (0 when nothing was)."""
        mode = self.config.switch
        if mode == "plain" or not resident.frames:
            return 0.0
        if mode == "reset":
            cache.clear()
            resident.clear()
            return 0.0
        first = min(self.policy.sink_blocks, len(resident.frames)) if mode == "recache-keep-sink" else 0
        resident.conds[first:] = [cond] * (len(resident.frames) - first)
        if first == len(resident.frames):
            return 0.0
        start = time.perf_counter()
        kvs = self.model.clean_context(self._rows(torch.cat(resident.frames, dim=1)), cond)
        t = first * cache.block_tokens
        cache.replace([(k[:, :, t:], v[:, :, t:]) for k, v in kvs], first)
        return time.perf_counter() - start

    def _rows(self, frames: torch.Tensor) -> torch.Tensor:
        """Clean frames as the cache's rows: twice over (conditional and null rows) when the stream is guided."""
        return torch.cat([frames, frames]) if self.guided else frames

    def _write_block(self, cache: RollingKVCache, clean: torch.Tensor, cond: Condition,
                     context: BlockContext | None, generator: torch.Generator, resident: _Resident) -> None:
        """The cache forward: the block at ``context_noise`` (clean by default) writes its keys/values; its clean
        frames and condition join the resident record (the evicted block's leave it)."""
        cfg = self.config
        x = self._rows(clean)
        if cfg.context_noise > 0:
            noise = torch.randn(x.shape, generator=generator, device=x.device)
            x = (1 - cfg.context_noise) * x + cfg.context_noise * noise
        s = torch.full((len(x),), cfg.context_noise, device=x.device)
        _, kvs = self.model.forward_block(x, s, cond, context)
        evicted = cache.push(kvs)
        resident.frames.append(clean)
        resident.conds.append(cond)
        if evicted is None:
            return
        del resident.frames[self.policy.sink_blocks], resident.conds[self.policy.sink_blocks]
        if cfg.refresh == "recompute":
            cache.replace(self.model.clean_context(self._rows(torch.cat(resident.frames, dim=1)),
                                                   resident.condition()))


@dataclass
class _Resident:
    """The clean frames [B, frames_per_block, ...] and the condition of each block resident in the cache, in
    cache order: what a re-encoding reads (a few KB; bounded by the cache's resident blocks)."""

    frames: list[torch.Tensor] = field(default_factory=list)
    conds: list[Condition] = field(default_factory=list)

    def clear(self) -> None:
        self.frames.clear()
        self.conds.clear()

    def condition(self) -> Condition:
        """The condition of the resident blocks for a whole-clip pass: one when they share it, else class ids
        per block [B, blocks]; a text model's pass takes one caption, the newest block's (blocks drawn under
        several prompts, after a ``plain`` switch, are re-encoded under the prompt in force)."""
        if all(c is self.conds[0] for c in self.conds):
            return self.conds[0]
        if isinstance(self.conds[-1], PrefixCondition):
            return self.conds[-1]
        return torch.stack(self.conds, dim=1)


def check_switch_frames(frames: Sequence[int], num_frames: int) -> None:
    """Raise a ValueError naming the first bad switch unless every frame lies inside the stream (``0 < frame <
    num_frames``; frame 0 is the stream's own target) and the frames strictly increase in the order given."""
    last = 0
    for frame in frames:
        if not 0 < frame < num_frames:
            raise ValueError(f"switch at frame {frame}: a switch frame must lie in 1..{num_frames - 1} "
                             f"(the stream has {num_frames} frames)")
        if frame <= last:
            raise ValueError(f"switch at frame {frame} comes after the switch at frame {last}: switch frames "
                             f"must increase in the order given")
        last = frame
