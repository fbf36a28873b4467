"""Recipe: train an NBP next-block model on tokenised moving-shapes clips (``vgen train nbp``).

Clips (:mod:`vgen.data.clips`) are tokenised frame by frame with a frozen image VQ and cached next to the run; a
clip's codes are its ``T`` frames of ``h x w`` codes in raster order. The loss is NBP's: one teacher-forced pass
under the block-causal mask over ``[class, begin-of-video x B, blocks 0 .. K-2]`` and the cross-entropy against
every token, with LlamaGen's 10% class dropout for the null class guidance needs.

Sizes. Default clips are 16 frames of 32x32 pixels; with a per-frame VQ of downsample factor 4 (``SHAPES_FRAME_VQ``)
that is 16 x 8 x 8 = 1024 tokens, generated in 16 frame blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from vgen.data.clips import SHAPES_CLIPS, ClipsConfig, cached_clips
from vgen.hub import from_pretrained, save_pretrained
from vgen.models.nbp import NBPConfig, NBPTransformer
from vgen.training.ar import SHAPES_GPT, tokenize_split
from vgen.training.tokenizer import SHAPES_FRAME_VQ
from vgen.training.trainer import TrainConfig, Trainer, index_batches, save_array_atomic

# shapes-video-nbp: the shapes AR model's width and depth over 16 frames of 8 x 8 tokens in frame blocks; grid and
# vocabulary follow the tokenizer and clips a run is given
SHAPES_VIDEO_NBP = NBPConfig(grid=(16, 8, 8), block="frame", vocab_size=SHAPES_FRAME_VQ.codebook_size,
                             dim=SHAPES_GPT.dim, n_layer=SHAPES_GPT.n_layer, n_head=SHAPES_GPT.n_head,
                             multiple_of=SHAPES_GPT.multiple_of, num_classes=SHAPES_GPT.num_classes,
                             class_dropout_prob=0.1, token_dropout_p=0.0, resid_dropout_p=0.0, ffn_dropout_p=0.0)




@dataclass(frozen=True)
class NBPRecipe:
    num_clips: int = 4000
    batch_size: int = 16


def nbp_loss(model: NBPTransformer, class_ids: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Mean cross-entropy over every token of ``tokens`` [B, N] and the top-1 accuracy (a Trainer step's form)."""
    logits = model(class_ids, tokens)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1))
    return loss, {"acc": float((logits.argmax(-1) == tokens).float().mean())}


def cached_clip_codes(tokenizer_dir: str | Path, data_dir: str | Path, count: int, cache_dir: str | Path,
                      clips: ClipsConfig = SHAPES_CLIPS) -> tuple[np.ndarray, np.ndarray]:
    """Codes [N, T*h*w] (int16, frame by frame) and labels of the first ``count`` training clips, cached."""
    path = Path(cache_dir) / f"train_clip_codes_{count}.npy"
    videos, labels = cached_clips(data_dir, "train", count, clips)
    if not path.exists():
        frames = np.asarray(videos).reshape(-1, clips.frame_size, clips.frame_size, 3)
        save_array_atomic(tokenize_split(from_pretrained(tokenizer_dir), frames).reshape(count, -1), path)
    return np.load(path), np.asarray(labels)


def video_config(tokenizer: torch.nn.Module, clips: ClipsConfig, config: NBPConfig) -> NBPConfig:
    """``config`` on the token grid and vocabulary that ``tokenizer`` gives ``clips``."""
    factor = tokenizer.downsample_factor
    if clips.frame_size % factor:
        raise ValueError(f"frame size {clips.frame_size} is not a multiple of the tokenizer's downsample factor "
                         f"{factor}")
    side = clips.frame_size // factor
    return replace(config, grid=(clips.num_frames, side, side), vocab_size=tokenizer.codebook_size)


def train_nbp(run_dir: str | Path, tokenizer_dir: str | Path, data_dir: str | Path, train: TrainConfig,
              recipe: NBPRecipe = NBPRecipe(), config: NBPConfig = SHAPES_VIDEO_NBP,
              clips: ClipsConfig = SHAPES_CLIPS, max_minutes: float | None = None) -> NBPTransformer:
    """Train (or resume) an NBP run in ``run_dir``; the EMA model is exported to ``run_dir/export``."""
    run_dir = Path(run_dir)
    model = NBPTransformer(video_config(from_pretrained(tokenizer_dir), clips, config))
    codes, labels = cached_clip_codes(tokenizer_dir, data_dir, recipe.num_clips, run_dir, clips)
    codes_t, labels_t = torch.from_numpy(codes.astype(np.int64)), torch.from_numpy(labels)
    trainer = Trainer(model, train, run_dir)
    batches = index_batches(len(codes), recipe.batch_size, train.seed, trainer.step)
    trainer.fit(batches, lambda idx: nbp_loss(model, labels_t[idx], codes_t[idx]), max_minutes)
    save_pretrained(trainer.ema.model, run_dir / "export")
    return trainer.ema.model
