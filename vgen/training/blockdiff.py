"""Recipe: train the block-diffusion video model on moving-shapes clips (``vgen train blockdiff``).

Diffusion forcing. Every block of a training clip gets its own noise level, so the model learns to denoise a
block from any mix of clean and noisy context, the clean context that streaming gives it included. A block is
clean (noise level 0, no loss: there is nothing to predict) with probability ``clean_prob``, otherwise its level
is uniform in (0, 1). The loss is the mean squared error of the velocity over the noisy blocks. A window of
``train_frames`` consecutive frames is cut from each clip at a random start.

Pixels or latents. The first recipe (``SHAPES_BLOCKDIFF``) denoises 32-px pixels. The latent recipe
(``SHAPES_LATENT_BLOCKDIFF``, the recipe of ``shapes-blockdiff-cfg`` and of its distilled ``shapes-blockdiff``)
denoises 64-px clips as the shipped KL tokenizer's 16 x 16 x 4 latent frames, 512 tokens a clip of 8 frames (half
the pixel recipe's 1,024), decoded per block when streamed. Its transformer can first learn single frames
(``SHAPES_LATENT_IMAGE_DIFF``, a class-conditional image diffusion model with the same weights) and start the
video run from them (``init_from``), as the video token models start from the image model.

Guidance distillation (``teacher``). A student starts from a trained model's weights and regresses its plain
conditional velocity on the teacher's classifier-free-guided one, over the same diffusion-forcing clips (Meng et
al., 2023, "On distillation of guided diffusion models", first stage). The student then streams at CFG 1: one
forward at batch 1 per step and per cache write, where the guided teacher runs batch 2.

Two levers on the first block, which streams generate without context and whose shape the later blocks keep:
``noise_shift`` warps the training noise levels up (as the sampler's ``shift`` warps its steps), so more of the
training goes to the high levels where a block's layout and shape are decided; ``lone_block_share`` is the share of
steps whose windows are cut into single blocks, each then trained as a first block, with as many tokens a step.

Hard classes: ``class_repeats`` gives the classes a model draws worst more of the training: each of their clips is
listed that many times in an epoch's shuffle.

Augmentation: a random time reversal per clip (a bouncing, spinning shape played backwards is another valid clip
of the same class), and for pixels a random horizontal flip (a latent frame flipped is not the latent of the
flipped frame, so latents are not flipped).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from vgen.data.clips import SHAPES_CLIPS, ClipsConfig, cached_clips
from vgen.data.shapes import CLASS_NAMES
from vgen.hub import CheckpointError, from_pretrained, load_weights, save_pretrained
from vgen.models.blockdiff import BlockDiffConfig, BlockDiffusionTransformer
from vgen.models.conditioning import Condition, cat_conditions
from vgen.samplers.logits import cfg_merge
from vgen.samplers.streaming import BlockStreamer, StreamBlock, StreamConfig, shift_noise_levels
from vgen.tokenizers.kl import KLTokenizer
from vgen.training.trainer import (
    RunDefaults,
    TrainConfig,
    Trainer,
    TrainingData,
    class_repeat_counts,
    index_batches,
    latest_checkpoint,
    repeated_items,
    save_array_atomic,
)

SHAPES_BLOCKDIFF = BlockDiffConfig()  # 2-frame blocks of 8 x 8 patches, 16 training frames, dim 192, 4 layers
# 8 latent frames of 16 x 16 x 4 (64-px clips through shapes-c2i-continuous's KL), 2 x 2 patches: 64 tokens a frame
SHAPES_LATENT_BLOCKDIFF = BlockDiffConfig(frame_size=16, channels=4, patch_size=2, frames_per_block=2,
                                          train_frames=8, dim=256, n_layer=6, n_head=8)
SHAPES_LATENT_IMAGE_DIFF = replace(SHAPES_LATENT_BLOCKDIFF, frames_per_block=1, train_frames=1)


# auto: bf16 autocast where the CPU multiplies bf16 natively (a step of 16 latent clips: 1.27 s against 2.53 s in
# fp32 on a 2-core AVX512-BF16 EPYC, benchmarks/blockdiff_step.py), fp32 where bf16 is emulated
BLOCKDIFF_RUN = RunDefaults(steps=2400, lr=6e-4, batch_size=8, warmup_steps=100, num_items=5000, precision="auto")
TEACHER_CFG = 5.0  # the teacher's CFG scale that a distilled student learns to stream without guidance


@dataclass(frozen=True)
class BlockDiffRecipe:
    """Clips, batch, the share of clean blocks, the training noise levels' ``noise_shift`` (1: uniform), the
    share of steps trained on lone blocks, ``class_repeats`` (class name -> how many times each of its clips is
    shown an epoch; other classes once) and, for guidance distillation, the share of steps on the student's own
    streams (:class:`Rollouts` of up to ``rollout_blocks`` blocks, ``rollout_steps`` Euler steps a block)."""

    num_clips: int = 6000
    batch_size: int = 8
    clean_prob: float = 0.3
    noise_shift: float = 1.0
    lone_block_share: float = 0.0
    class_repeats: dict[str, int] = field(default_factory=dict)
    rollout_share: float = 0.0
    rollout_blocks: int = 100
    rollout_steps: int = 3

    def __post_init__(self) -> None:
        if not 0 < self.noise_shift < math.inf:
            raise ValueError(f"noise_shift must be a finite number > 0, got {self.noise_shift}")
        for name in ("lone_block_share", "rollout_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("rollout_blocks", "rollout_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        class_repeat_counts(self.class_repeats, CLASS_NAMES)


def clips_to_tensor(clips: np.ndarray) -> torch.Tensor:
    """uint8 clips [B, T, S, S, 3] -> float in [-1, 1] (a copy: a memory-mapped cache is read-only)."""
    return torch.from_numpy(np.array(clips, dtype=np.float32)).div_(127.5).sub_(1.0)


@dataclass
class NoisedClip:
    """Clips at an independent noise level per block: ``x_t`` [B, T, ...], ``sigma`` [B, blocks], the ``noise``
    drawn and ``weight`` [B, T] (1 on the frames of noisy blocks, 0 on clean ones)."""

    x_t: torch.Tensor
    sigma: torch.Tensor
    noise: torch.Tensor
    weight: torch.Tensor


def noise_blocks(frames: torch.Tensor, frames_per_block: int, clean_prob: float,
                 noise_shift: float = 1.0, context_blocks: int = 0) -> NoisedClip:
    """Diffusion forcing's inputs: each block clean with probability ``clean_prob``, else at a uniform level
    warped by ``noise_shift``; the first ``context_blocks`` blocks are always clean."""
    b, t = frames.shape[:2]
    blocks = t // frames_per_block
    sigma = shift_noise_levels(torch.rand(b, blocks, device=frames.device), noise_shift)
    # a lone block is never clean: it would carry no loss and be context for nothing
    clean = torch.rand(b, blocks, device=frames.device) < (clean_prob if blocks > 1 else 0.0)
    clean[:, :context_blocks] = True
    sigma = torch.where(clean, torch.zeros_like(sigma), sigma)
    per_frame = sigma.repeat_interleave(frames_per_block, dim=1)[:, :, None, None, None]
    noise = torch.randn_like(frames)
    weight = (~clean).repeat_interleave(frames_per_block, dim=1).float()
    return NoisedClip((1 - per_frame) * frames + per_frame * noise, sigma, noise, weight)


def noisy_block_mse(v: torch.Tensor, target: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Mean squared error of velocities over the frames of noisy blocks."""
    err = (v - target).pow(2).mean(dim=(2, 3, 4))  # [B, T]
    return (err * weight).sum() / weight.sum().clamp_min(1.0)


def diffusion_forcing_loss(model: BlockDiffusionTransformer, frames: torch.Tensor, class_ids: torch.Tensor,
                           clean_prob: float, noise_shift: float = 1.0) -> tuple[torch.Tensor, dict]:
    """Flow-matching loss with an independent noise level per block (clean blocks carry no loss)."""
    clip = noise_blocks(frames, model.frames_per_block, clean_prob, noise_shift)
    v = model(clip.x_t, clip.sigma, class_ids)
    return noisy_block_mse(v, clip.noise - frames, clip.weight), {"noisy_frac": float(clip.weight.mean())}


@torch.no_grad()
def guided_velocity(teacher: BlockDiffusionTransformer, x_t: torch.Tensor, sigma: torch.Tensor,
                    cond: Condition, cfg_scale: float) -> torch.Tensor:
    """The teacher's classifier-free-guided velocity over whole clips under ``cond`` (class ids or a caption), as
    its stream computes it per block (the unconditional half sees its own unconditional context)."""
    v = teacher(torch.cat([x_t, x_t]), torch.cat([sigma, sigma]),
                cat_conditions([cond, teacher.null_condition(cond)]))
    return cfg_merge(*v.chunk(2), cfg_scale)


def guidance_distillation_loss(student: BlockDiffusionTransformer, teacher: BlockDiffusionTransformer,
                               frames: torch.Tensor, class_ids: torch.Tensor, clean_prob: float,
                               cfg_scale: float, noise_shift: float = 1.0,
                               context_blocks: int = 0) -> tuple[torch.Tensor, dict]:
    """The student's conditional velocity against the teacher's guided one, on diffusion-forcing clips (the first
    ``context_blocks`` blocks clean)."""
    clip = noise_blocks(frames, student.frames_per_block, clean_prob, noise_shift, context_blocks)
    target = guided_velocity(teacher, clip.x_t, clip.sigma, class_ids, cfg_scale)
    v = student(clip.x_t, clip.sigma, class_ids)
    return noisy_block_mse(v, target, clip.weight), {"noisy_frac": float(clip.weight.mean())}


class Rollouts:
    """Streams of the model in training, advanced one block a training step (Self-Forcing's remedy for exposure
    bias, with its cost spread over the steps). :meth:`next` returns, per stream, the clean blocks its cache holds
    (sinks, then the window, as ``stream`` keeps them) followed by the block just drawn after them, and the
    streams' classes. A batch of ``batch_size`` streams of random classes runs for a random number of blocks, up to
    ``max_blocks``; then a new batch starts. So the contexts come from every depth of long streams, where a stream
    drifts, and the model learns what to do there."""

    def __init__(self, model: BlockDiffusionTransformer, config: StreamConfig, batch_size: int, max_blocks: int,
                 pixels: bool) -> None:
        self.model, self.config, self.batch_size, self.max_blocks = model, config, batch_size, max_blocks
        self.pixels = pixels
        self.policy = config.policy(model.frames_per_block, model.config.train_frames)
        self.blocks: Iterator[StreamBlock] = iter(())
        self.resident: list[torch.Tensor] = []
        self.class_ids = torch.zeros(batch_size, dtype=torch.long)

    def _start(self) -> None:
        device = next(self.model.parameters()).device
        self.class_ids = torch.randint(0, self.model.num_classes, (self.batch_size,))
        length = int(torch.randint(1, self.max_blocks + 1, ()))
        generator = torch.Generator(device=device).manual_seed(int(torch.randint(2**62, ())))
        streamer = BlockStreamer(self.model, self.config, pixels=self.pixels)
        self.blocks = streamer.stream(self.class_ids.tolist(), length * self.model.frames_per_block,
                                      generator=generator)
        self.resident = []

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Frames [batch, (resident blocks + 1) * frames_per_block, ...] and class ids [batch]."""
        training = self.model.training
        try:
            block = next(self.blocks)
        except StopIteration:
            self._start()
            block = next(self.blocks)
        finally:
            self.model.train(training)  # the streamer puts the model in eval mode
        clip = torch.cat([*self.resident, block.latents], dim=1)
        self.resident.append(block.latents)
        if len(self.resident) > self.policy.sink_blocks + self.policy.window_blocks:
            del self.resident[self.policy.sink_blocks]  # the oldest window block leaves, as in the cache
        return clip, self.class_ids.to(clip.device)


def augment(clips: torch.Tensor, flip: bool = True) -> torch.Tensor:
    """Random time reversal and (with ``flip``) horizontal flip, each per clip with probability 1/2."""
    flipped = torch.rand(len(clips)) < 0.5
    reverse = torch.rand(len(clips)) < 0.5
    if flip:
        clips = torch.where(flipped[:, None, None, None, None], clips.flip(3), clips)
    return torch.where(reverse[:, None, None, None, None], clips.flip(1), clips)


def random_windows(clips: torch.Tensor, length: int) -> torch.Tensor:
    """A window of ``length`` consecutive frames of each clip [B, T, ...], at a uniformly random start."""
    starts = torch.randint(0, clips.shape[1] - length + 1, (len(clips),))
    return torch.stack([clip[s:s + length] for clip, s in zip(clips, starts.tolist())])


def lone_blocks(frames: torch.Tensor, class_ids: torch.Tensor, frames_per_block: int) -> tuple[torch.Tensor,
                                                                                                  torch.Tensor]:
    """Windows [B, T, ...] cut into their blocks, each a window of its own [B * T / frames_per_block,
    frames_per_block, ...], with the class of its clip."""
    b, t = frames.shape[:2]
    blocks = t // frames_per_block
    return (frames.reshape(b * blocks, frames_per_block, *frames.shape[2:]),
            class_ids.repeat_interleave(blocks))


def cached_clip_latents(kl_dir: str | Path, data_dir: str | Path, count: int, cache_dir: str | Path,
                        clips: ClipsConfig, device: str = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """Latent frames [N, T, h, w, C] (float16, the KL tokenizer's scaled posterior means) and labels of the first
    ``count`` training clips, encoded on ``device`` and cached in ``cache_dir``."""
    path = Path(cache_dir) / f"train_clip_latents_{count}.npy"
    videos, labels = cached_clips(data_dir, "train", count, clips)
    if not path.exists():
        kl = from_pretrained(kl_dir, map_location=device).eval()
        latents = [kl.encode_frames(clips_to_tensor(videos[i:i + 32]).to(device)).half().cpu().numpy()
                   for i in tqdm(range(0, count, 32), desc="encode clips", unit="batch")]
        save_array_atomic(np.concatenate(latents), path)
    return np.load(path, mmap_mode="r"), np.asarray(labels)


def check_latent_fit(config: BlockDiffConfig, kl: torch.nn.Module, clips: ClipsConfig) -> None:
    """A latent model's frames must be the KL tokenizer's latent frames of the clips' frames."""
    if not isinstance(kl, KLTokenizer):
        raise ValueError(f"a latent block-diffusion model takes a KL tokenizer, got a {type(kl).__name__}")
    if kl.config.image_size != clips.frame_size:
        raise ValueError(f"the tokenizer takes {kl.config.image_size}-px frames, the clips have {clips.frame_size} px")
    kl.check_latent_frames(config.frame_size, config.channels)


def start_from(model: BlockDiffusionTransformer, init_from: str | Path) -> None:
    """Load a block-diffusion export of the same transformer (e.g. the single-frame image model into the video
    model: blocks and frames per clip are not weights), or raise :class:`~vgen.hub.CheckpointError`."""
    source = from_pretrained(init_from)
    if not isinstance(source, BlockDiffusionTransformer):
        raise CheckpointError(f"{init_from} holds a {type(source).__name__}, not a block-diffusion model")
    load_weights(model, source.state_dict(), source=str(init_from))


def train_blockdiff(run_dir: str | Path, data_dir: str | Path, train: TrainConfig,
                    recipe: BlockDiffRecipe = BlockDiffRecipe(), config: BlockDiffConfig = SHAPES_BLOCKDIFF,
                    clips: ClipsConfig = SHAPES_CLIPS, max_minutes: float | None = None,
                    tokenizer_dir: str | Path | None = None,
                    init_from: str | Path | None = None, teacher: str | Path | None = None,
                    teacher_cfg: float = 1.0) -> BlockDiffusionTransformer:
    """Train (or resume) a block-diffusion run in ``run_dir`` on pixels, or on latent frames of the KL tokenizer in
    ``tokenizer_dir``; a new run may start from the block-diffusion export ``init_from`` (resumes ignore it). With
    ``teacher`` (a block-diffusion model folder), the run distils the teacher's guidance at ``teacher_cfg`` into a
    student of its architecture started from its weights (``config`` and ``init_from`` do not apply; the student
    has no class dropout), on the student's own streams for ``recipe.rollout_share`` of the steps (a resumed run
    starts new streams). The EMA model is exported to ``run_dir/export``."""
    teacher_model = None
    if teacher is not None:
        teacher_model = from_pretrained(teacher, map_location=train.device)
        if not isinstance(teacher_model, BlockDiffusionTransformer):
            raise CheckpointError(f"{teacher} holds a {type(teacher_model).__name__}, not a block-diffusion model")
        if not teacher_cfg > 1.0:
            raise ValueError(f"guidance distillation needs a teacher CFG scale > 1, got {teacher_cfg}")
        teacher_model.eval().requires_grad_(False)
        config, init_from = replace(teacher_model.config, class_dropout_prob=0.0), teacher
    if recipe.rollout_share and teacher_model is None:
        raise ValueError("rollout_share trains a student on its own streams against a teacher: give a teacher")
    if clips.num_frames < config.train_frames:
        raise ValueError(f"clips of {clips.num_frames} frames do not fit a model of {config.train_frames} frames")
    run_dir = Path(run_dir)
    if tokenizer_dir is None:
        if clips.frame_size != config.frame_size:
            raise ValueError(f"clips of {clips.frame_size} px do not fit a pixel model of {config.frame_size} px")
        videos, labels = cached_clips(data_dir, "train", recipe.num_clips, clips)
    else:
        check_latent_fit(config, from_pretrained(tokenizer_dir), clips)
        videos, labels = cached_clip_latents(tokenizer_dir, data_dir, recipe.num_clips, run_dir, clips, train.device)
    labels_t = torch.from_numpy(np.asarray(labels))
    model = BlockDiffusionTransformer(config)
    started = init_from is not None and latest_checkpoint(run_dir) is None
    if started:
        start_from(model, init_from)
    trainer = Trainer(model, train, run_dir, recipe, TrainingData.of(data_dir, clips, videos, labels))
    if started:  # the log says what the run started from
        trainer.log({"step": 0, "init_from": str(init_from),
                     **({"teacher_cfg": teacher_cfg} if teacher_model is not None else {})})
    items = torch.from_numpy(repeated_items(labels_t.numpy(), class_repeat_counts(recipe.class_repeats, CLASS_NAMES)))
    batches = (items[idx] for idx in index_batches(len(items), recipe.batch_size, train.seed, trainer.step))
    fpb = config.frames_per_block
    rollouts = None
    if recipe.rollout_share:  # streams whose context (a sink block and a window) fills the trained frames
        rollouts = Rollouts(trainer.model, StreamConfig(steps=recipe.rollout_steps, sink_frames=fpb,
                                                        window_frames=config.train_frames - 2 * fpb),
                            recipe.batch_size, recipe.rollout_blocks, pixels=tokenizer_dir is None)

    def step_fn(idx: torch.Tensor) -> tuple[torch.Tensor, dict]:
        if rollouts is not None and bool(torch.rand(()) < recipe.rollout_share):
            clip, labels = rollouts.next()  # the student's own stream: its context, the block it just drew
            loss, metrics = guidance_distillation_loss(model, teacher_model, clip, labels, 0.0, teacher_cfg,
                                                       recipe.noise_shift, context_blocks=clip.shape[1] // fpb - 1)
            return loss, {**metrics, "lone_blocks": 0.0, "rollout": 1.0}
        order = idx.sort().values.numpy()  # sorted reads from the memory map
        frames = (clips_to_tensor(videos[order]) if tokenizer_dir is None
                  else torch.from_numpy(np.asarray(videos[order], dtype=np.float32)))
        frames = augment(random_windows(frames, config.train_frames), flip=tokenizer_dir is None).to(train.device)
        labels = labels_t[order].to(train.device)
        lone = bool(torch.rand(()) < recipe.lone_block_share)
        if lone:
            frames, labels = lone_blocks(frames, labels, config.frames_per_block)
        if teacher_model is not None:
            loss, metrics = guidance_distillation_loss(model, teacher_model, frames, labels, recipe.clean_prob,
                                                       teacher_cfg, recipe.noise_shift)
        else:
            loss, metrics = diffusion_forcing_loss(model, frames, labels, recipe.clean_prob, recipe.noise_shift)
        return loss, {**metrics, "lone_blocks": float(lone), "rollout": 0.0}

    trainer.fit(batches, step_fn, max_minutes)
    save_pretrained(trainer.ema.model, run_dir / "export")
    return trainer.ema.model
