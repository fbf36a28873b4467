"""Recipe: train the block-diffusion video model on moving-shapes clips (``vgen train blockdiff``).

Diffusion forcing. Every block of a training clip gets its own noise level, so the model learns to denoise a
block from any mix of clean and noisy context, the clean context that streaming gives it included. A block is
clean (noise level 0, no loss: there is nothing to predict) with probability ``clean_prob``, otherwise its level
is uniform in (0, 1). The loss is the mean squared error of the velocity over the noisy blocks.

Augmentation: a random horizontal flip and a random time reversal per clip (a bouncing, spinning shape played
backwards is another valid clip of the same class).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vgen.data.clips import SHAPES_CLIPS, ClipsConfig, cached_clips
from vgen.hub import save_pretrained
from vgen.models.blockdiff import BlockDiffConfig, BlockDiffusionTransformer
from vgen.training.trainer import TrainConfig, Trainer, index_batches

SHAPES_BLOCKDIFF = BlockDiffConfig()  # 2-frame blocks of 8 x 8 patches, 16 training frames, dim 192, 4 layers


@dataclass(frozen=True)
class BlockDiffRecipe:
    num_clips: int = 6000
    batch_size: int = 8
    clean_prob: float = 0.3


def clips_to_tensor(clips: np.ndarray) -> torch.Tensor:
    """uint8 clips [B, T, S, S, 3] -> float in [-1, 1]."""
    return torch.from_numpy(np.ascontiguousarray(clips)).float().div(127.5).sub(1.0)


def diffusion_forcing_loss(model: BlockDiffusionTransformer, frames: torch.Tensor, class_ids: torch.Tensor,
                           clean_prob: float) -> tuple[torch.Tensor, dict]:
    """Flow-matching loss with an independent noise level per block (clean blocks carry no loss)."""
    b, t = frames.shape[:2]
    blocks = t // model.frames_per_block
    sigma = torch.rand(b, blocks)
    clean = torch.rand(b, blocks) < clean_prob
    sigma = torch.where(clean, torch.zeros_like(sigma), sigma)
    per_frame = sigma.repeat_interleave(model.frames_per_block, dim=1)[:, :, None, None, None]
    noise = torch.randn_like(frames)
    x_t = (1 - per_frame) * frames + per_frame * noise
    v = model(x_t, sigma, class_ids)
    err = (v - (noise - frames)).pow(2).mean(dim=(2, 3, 4))  # [B, T]
    weight = (~clean).repeat_interleave(model.frames_per_block, dim=1).float()
    loss = (err * weight).sum() / weight.sum().clamp_min(1.0)
    return loss, {"noisy_frac": float(weight.mean())}


def augment(clips: torch.Tensor) -> torch.Tensor:
    """Random horizontal flip and time reversal, each per clip with probability 1/2."""
    flip = torch.rand(len(clips)) < 0.5
    reverse = torch.rand(len(clips)) < 0.5
    clips = torch.where(flip[:, None, None, None, None], clips.flip(3), clips)
    return torch.where(reverse[:, None, None, None, None], clips.flip(1), clips)


def train_blockdiff(run_dir: str | Path, data_dir: str | Path, train: TrainConfig,
                    recipe: BlockDiffRecipe = BlockDiffRecipe(), config: BlockDiffConfig = SHAPES_BLOCKDIFF,
                    clips: ClipsConfig = SHAPES_CLIPS, max_minutes: float | None = None) -> BlockDiffusionTransformer:
    """Train (or resume) a block-diffusion run in ``run_dir``; the EMA model is exported to ``run_dir/export``."""
    if clips.frame_size != config.frame_size or clips.num_frames < config.train_frames:
        raise ValueError(f"clips of {clips.num_frames} frames of {clips.frame_size} px do not fit a model of "
                         f"{config.train_frames} frames of {config.frame_size} px")
    run_dir = Path(run_dir)
    videos, labels = cached_clips(data_dir, "train", recipe.num_clips, clips)
    labels_t = torch.from_numpy(np.asarray(labels))
    model = BlockDiffusionTransformer(config)
    trainer = Trainer(model, train, run_dir)
    batches = index_batches(len(labels_t), recipe.batch_size, train.seed, trainer.step)

    def step_fn(idx: torch.Tensor) -> tuple[torch.Tensor, dict]:
        order = idx.sort().values.numpy()  # sorted reads from the memory map
        frames = augment(clips_to_tensor(videos[order][:, :config.train_frames]))
        return diffusion_forcing_loss(model, frames, labels_t[order], recipe.clean_prob)

    trainer.fit(batches, step_fn, max_minutes)
    save_pretrained(trainer.ema.model, run_dir / "export")
    return trainer.ema.model
