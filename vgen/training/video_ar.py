"""Recipe: train a next-token video AR model on tokenised moving-shapes clips (``vgen train ar --video``).

The model is the LlamaGen GPT with ``frames`` set (:mod:`vgen.models.llamagen`): a clip's per-frame codes
(:mod:`vgen.training.clip_codes`) in raster order, frame after frame, one token per step. It is the baseline the
parallel video models (NBP, video NAR) are measured against, and the target that the speculative samplers
accelerate on video (their ``vertical`` draft init copies the same cell of the previous frame). The loss is the
image AR's next-token cross-entropy with LlamaGen's 10% class dropout.

Two recipes, by clip geometry. On 32-px clips (the frame tokenizer's 8 x 8 codes a frame) the model has 3-D RoPE
and starts from scratch. On 64-px clips (the image tokenizer's 16 x 16 codes) each frame is rotated as an image
(``rope="spatial"``), so a run starts from ``shapes-c2i`` (frame 0 is then that image model's computation) or,
closer still, from ``shapes-video-nbp`` (:func:`warm_start`), whose layers already carry a clip's class and motion
from frame to frame.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from vgen.data.clips import SHAPES_CLIPS, SHAPES_CLIPS_64, SHAPES_CLIPS_64_LONG, ClipsConfig
from vgen.hub import CheckpointError, from_pretrained, load_weights
from vgen.models.llamagen import GPTConfig, LlamaGenGPT
from vgen.models.nbp import NBPTransformer
from vgen.training.ar import SHAPES_GPT, next_token_loss
from vgen.training.clip_codes import CLIP_RECIPE, ClipRecipe, clip_grid, fit_on_clips
from vgen.training.tokenizer import SHAPES_FRAME_VQ
from vgen.training.trainer import TrainConfig, latest_checkpoint

# shapes-video-ar: the shapes AR model's width and depth (as SHAPES_VIDEO_NBP) over 16 frames of 8 x 8 tokens; the
# grid and vocabulary follow the tokenizer and clips a run is given
SHAPES_VIDEO_AR = replace(SHAPES_GPT, vocab_size=SHAPES_FRAME_VQ.codebook_size, frames=16, block_size=16 * 8 * 8)
# on 64-px clips: the image model's 16 x 16 codes a frame, each frame rotated as an image, no dropout (as
# SHAPES_VIDEO_NBP_64, which can start it)
SHAPES_VIDEO_AR_64 = replace(SHAPES_GPT, frames=SHAPES_CLIPS_64.num_frames,
                             block_size=SHAPES_CLIPS_64.num_frames * SHAPES_GPT.block_size, rope="spatial",
                             token_dropout_p=0.0, resid_dropout_p=0.0, ffn_dropout_p=0.0)
# the 16-frame 64-px clips: the same model, its frames set by video_ar_config
VIDEO_AR_RECIPES = {SHAPES_CLIPS: SHAPES_VIDEO_AR, SHAPES_CLIPS_64: SHAPES_VIDEO_AR_64,
                    SHAPES_CLIPS_64_LONG: SHAPES_VIDEO_AR_64}


def video_ar_config(tokenizer: torch.nn.Module, clips: ClipsConfig, config: GPTConfig | None = None) -> GPTConfig:
    """``config`` (default: the recipe for ``clips``, else ``SHAPES_VIDEO_AR``) on the frames, frame size and
    vocabulary that ``tokenizer`` gives ``clips``."""
    config = config or VIDEO_AR_RECIPES.get(clips, SHAPES_VIDEO_AR)
    frames, rows, cols = clip_grid(tokenizer, clips)
    return replace(config, frames=frames, block_size=frames * rows * cols, vocab_size=tokenizer.codebook_size)


def warm_start(model: LlamaGenGPT, source: torch.nn.Module, name: str = "source model") -> None:
    """Start a next-token video AR ``model`` from ``source``, every weight by name:

    - a next-token image model of the frame grid (``rope="spatial"`` models only): its blocks, embeddings, final
      norm and output layer; the per-frame embedding stays zero, so every frame starts out as that image model;
    - an NBP video model on the same grid with the same rotary kind: everything but its begin-of-video slots. NBP
      feeds a slot the token one block back, this model the token one step back, so the layers must adapt, but
      what they know of a clip (its class, its motion) carries over.

    Anything else is a :class:`~vgen.hub.CheckpointError`."""
    config = model.config
    if isinstance(source, NBPTransformer):
        if (tuple(source.config.grid), source.config.rope) != (config.grid, config.rope):
            raise CheckpointError(f"{name} is an NBP model over grid {tuple(source.config.grid)} with "
                                  f"rope={source.config.rope!r}; this model is {config.grid} with "
                                  f"rope={config.rope!r}")
        load_weights(model, source.state_dict(), source=name, ignore=("bov",))
        return
    if not isinstance(source, LlamaGenGPT) or source.config.frames != 1 or source.text_conditional:
        raise CheckpointError(f"{name} holds a {type(source).__name__}, not a class-conditional next-token image "
                              f"model or an NBP video model to start from")
    if config.rope != "spatial":
        raise CheckpointError(f"{name} is an image model: it can start only a video model that rotates each frame "
                              f"as an image (rope='spatial'), not rope={config.rope!r}")
    own = {k: v for k, v in model.state_dict().items() if k.startswith("frame_embedding.")}
    load_weights(model, {**source.state_dict(), **own}, source=name)


def train_video_ar(run_dir: str | Path, tokenizer_dir: str | Path, data_dir: str | Path, train: TrainConfig,
                   recipe: ClipRecipe = CLIP_RECIPE, config: GPTConfig | None = None,
                   clips: ClipsConfig = SHAPES_CLIPS, max_minutes: float | None = None,
                   init_from: str | Path | None = None) -> LlamaGenGPT:
    """Train (or resume) a next-token video AR run in ``run_dir``; the EMA model is exported to ``run_dir/export``.
    ``init_from`` starts a new run from an image model or an NBP export (:func:`warm_start`); resumes ignore it."""
    model = LlamaGenGPT(video_ar_config(from_pretrained(tokenizer_dir), clips, config))
    if init_from is not None and latest_checkpoint(run_dir) is None:
        warm_start(model, from_pretrained(init_from), name=str(init_from))
    return fit_on_clips(run_dir, model, tokenizer_dir, data_dir, train, recipe, clips, max_minutes, next_token_loss)
