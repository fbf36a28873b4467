"""Recipe: train a next-token video AR model on tokenised moving-shapes clips (``vgen train ar --video``).

The model is the LlamaGen GPT with ``frames`` set (:mod:`vgen.models.llamagen`): a clip's per-frame codes
(:mod:`vgen.training.clip_codes`) in raster order, frame after frame, one token per step, with 3-D RoPE. It is the
baseline the parallel video models (NBP, video NAR) are measured against, and the target that the speculative
samplers accelerate on video (their ``vertical`` draft init copies the same cell of the previous frame). The loss is
the image AR's next-token cross-entropy with LlamaGen's 10% class dropout.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from vgen.data.clips import SHAPES_CLIPS, ClipsConfig
from vgen.hub import from_pretrained
from vgen.models.llamagen import GPTConfig, LlamaGenGPT
from vgen.training.ar import SHAPES_GPT, next_token_loss
from vgen.training.clip_codes import CLIP_RECIPE, ClipRecipe, clip_grid, fit_on_clips
from vgen.training.tokenizer import SHAPES_FRAME_VQ
from vgen.training.trainer import TrainConfig

# shapes-video-ar: the shapes AR model's width and depth (as SHAPES_VIDEO_NBP) over 16 frames of 8 x 8 tokens; the
# grid and vocabulary follow the tokenizer and clips a run is given
SHAPES_VIDEO_AR = replace(SHAPES_GPT, vocab_size=SHAPES_FRAME_VQ.codebook_size, frames=16, block_size=16 * 8 * 8)


def video_ar_config(tokenizer: torch.nn.Module, clips: ClipsConfig, config: GPTConfig) -> GPTConfig:
    """``config`` on the frames, frame size and vocabulary that ``tokenizer`` gives ``clips``."""
    frames, rows, cols = clip_grid(tokenizer, clips)
    return replace(config, frames=frames, block_size=frames * rows * cols, vocab_size=tokenizer.codebook_size)


def train_video_ar(run_dir: str | Path, tokenizer_dir: str | Path, data_dir: str | Path, train: TrainConfig,
                   recipe: ClipRecipe = CLIP_RECIPE, config: GPTConfig = SHAPES_VIDEO_AR,
                   clips: ClipsConfig = SHAPES_CLIPS, max_minutes: float | None = None) -> LlamaGenGPT:
    """Train (or resume) a next-token video AR run in ``run_dir``; the EMA model is exported to ``run_dir/export``."""
    model = LlamaGenGPT(video_ar_config(from_pretrained(tokenizer_dir), clips, config))
    return fit_on_clips(run_dir, model, tokenizer_dir, data_dir, train, recipe, clips, max_minutes, next_token_loss)
