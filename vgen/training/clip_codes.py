"""Token codes of the moving-shapes clips for the video token models (NBP, video NAR, next-token video AR).

Clips (:mod:`vgen.data.clips`) are tokenised frame by frame with a frozen per-frame VQ and cached next to the run;
a clip's codes are its ``T`` frames of ``h x w`` codes in raster order, which is the (frames, rows, columns) grid
every video token backbone uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
import torch.nn.functional as F

from vgen.data.clips import SHAPES_CLIPS, ClipsConfig, cached_clips, clip_classes
from vgen.eval.quality import clip_class_accuracy
from vgen.hub import from_pretrained
from vgen.pipelines import PipelineInfo, VideoPipeline
from vgen.training.ar import tokenize_split
from vgen.training.trainer import (
    TokenLoss,
    TrainConfig,
    TrainingData,
    every,
    fit_on_codes,
    save_array_atomic,
    token_grid_loss,
)

GridConfig = TypeVar("GridConfig")  # a backbone config with ``grid`` and ``vocab_size`` fields (NBP, NAR)


@dataclass(frozen=True)
class ClipRecipe:
    """How a video token model (NBP, video NAR, next-token video AR) sees the clips. ``time_reversed``: also train
    on every clip played backwards (:func:`with_time_reversed`), twice the first frames that a model drawing frame
    0 token by token learns from (added after NBP's second run, whose frame 0 was not a shape yet). ``eval_every``:
    steps between runs of a :func:`clip_probe`, when the recipe is given one."""

    num_clips: int = 4000
    batch_size: int = 16
    time_reversed: bool = True
    eval_every: int = 250


CLIP_RECIPE = ClipRecipe()


def cached_clip_codes(tokenizer_dir: str | Path, data_dir: str | Path, count: int, cache_dir: str | Path,
                      clips: ClipsConfig = SHAPES_CLIPS) -> tuple[np.ndarray, np.ndarray]:
    """Codes [N, T*h*w] (int16, frame by frame) and labels of the first ``count`` training clips, cached. Once the
    codes are cached the clips are not needed (the labels follow from the indices)."""
    path = Path(cache_dir) / f"train_clip_codes_{count}.npy"
    if not path.exists():
        videos, _ = cached_clips(data_dir, "train", count, clips)
        frames = np.asarray(videos).reshape(-1, clips.frame_size, clips.frame_size, 3)
        save_array_atomic(tokenize_split(from_pretrained(tokenizer_dir), frames).reshape(count, -1), path)
    return np.load(path), clip_classes(np.arange(count))


def fit_on_clips(run_dir: str | Path, model: torch.nn.Module, tokenizer_dir: str | Path, data_dir: str | Path,
                 train: TrainConfig, recipe: ClipRecipe, clips: ClipsConfig, max_minutes: float | None = None,
                 loss_fn: TokenLoss = token_grid_loss,
                 evaluate: Callable[[torch.nn.Module], dict] | None = None) -> torch.nn.Module:
    """Train (or resume) ``model`` on the codes of the recipe's clips (and the same clips played backwards when
    ``recipe.time_reversed``), running ``evaluate`` (e.g. :func:`clip_probe`) every ``recipe.eval_every`` steps;
    the EMA model is exported to ``run_dir/export`` and returned."""
    on_step = every(evaluate, recipe.eval_every)  # a bad interval fails before the clips are tokenised
    codes, labels = cached_clip_codes(tokenizer_dir, data_dir, recipe.num_clips, run_dir, clips)
    data = TrainingData.of(data_dir, clips, codes, labels)
    if recipe.time_reversed:
        codes, labels = with_time_reversed(codes, labels, clips.num_frames)
    return fit_on_codes(run_dir, model, codes, labels, train, recipe, data, max_minutes, loss_fn, on_step)


def with_first_frames(first_frames: int) -> TokenLoss:
    """The clip's teacher-forced loss plus, for a video grid, the cross-entropy of frame 0 alone on
    ``first_frames`` frames drawn at random from each clip's frames ``1 .. T-1`` (same class): any frame of a clip
    is a frame of the class that a clip could start from, and frame 0 otherwise learns from one frame per clip (two
    NBP runs without this never drew a shape in frame 0). The model must score a frame alone as its frame 0 (NBP:
    that frame as a prefix, so in row blocks its rows under the layout's start; NAR: with ``image_first``).
    Figures: ``acc`` of the clip, ``first_loss``, ``first_acc``."""
    if first_frames < 0:
        raise ValueError(f"first_frames must be >= 0, got {first_frames}")

    def loss_fn(model: torch.nn.Module, class_ids: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, dict]:
        loss, figures = token_grid_loss(model, class_ids, tokens)
        if not first_frames or len(model.grid) != 3:  # an image grid has no other frames
            return loss, figures
        size = model.grid[1] * model.grid[2]
        frames = tokens.reshape(len(tokens), -1, size)
        picked = torch.randint(1, frames.shape[1], (len(tokens), first_frames), device=tokens.device)
        chosen = frames[torch.arange(len(tokens), device=tokens.device)[:, None], picked].reshape(-1, size)
        logits = model(class_ids.repeat_interleave(first_frames), chosen)
        first = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), chosen.reshape(-1))
        first_acc = float((logits.argmax(-1) == chosen).float().mean())
        return loss + first, figures | {"first_loss": float(first.detach()), "first_acc": first_acc}

    return loss_fn


def clip_probe(tokenizer_dir: str | Path, clips: ClipsConfig = SHAPES_CLIPS, per_class: int = 4,
               cfg_scale: float = 3.0, seed: int = 0) -> Callable[[torch.nn.Module], dict]:
    """An ``evaluate(model)`` hook for a video token model: draw ``per_class`` clips per class with the model's
    own sampler and report what the per-frame domain classifier says of them (:func:`clip_class_accuracy`): the
    clips' class accuracy, all frames' and frame 0's alone, the frame a model draws from the class only."""
    tokenizer = from_pretrained(tokenizer_dir)
    info = PipelineInfo(name="probe", image_size=clips.frame_size)

    def evaluate(model: torch.nn.Module) -> dict:
        was_training = model.training
        classes = [c for c in range(model.num_classes) for _ in range(per_class)]
        tokenizer.to(next(model.parameters()).device)
        out = VideoPipeline(model, tokenizer, info)(classes, seed=seed, cfg_scale=cfg_scale)
        model.train(was_training)
        figures = clip_class_accuracy(out.videos, classes)
        return {"probe_class_accuracy": figures["class_accuracy"], "probe_frame_accuracy": figures["frame_accuracy"],
                "probe_first_frame_accuracy": clip_class_accuracy(out.videos[:, :1], classes)["frame_accuracy"]}

    return evaluate


def with_time_reversed(codes: np.ndarray, labels: np.ndarray, num_frames: int) -> tuple[np.ndarray, np.ndarray]:
    """The clips' codes [N, T*h*w] followed by the same clips played backwards (frame order reversed), labels
    repeated: [2N, T*h*w]. A clip run backwards is a clip of the same class (a glide, bounce and spin reversed), and
    its last frame becomes a first frame, which a video model otherwise sees once per clip. With a per-frame VQ the
    codes of a reversed clip are the reversed codes."""
    if codes.shape[1] % num_frames:
        raise ValueError(f"{codes.shape[1]} codes per clip do not split into {num_frames} frames")
    backwards = codes.reshape(len(codes), num_frames, -1)[:, ::-1].reshape(codes.shape)
    return np.concatenate([codes, backwards]), np.concatenate([labels, labels])


def clip_grid(tokenizer: torch.nn.Module, clips: ClipsConfig) -> tuple[int, int, int]:
    """The (frames, rows, columns) of codes that ``tokenizer`` gives ``clips``."""
    factor = tokenizer.downsample_factor
    if clips.frame_size % factor:
        raise ValueError(f"frame size {clips.frame_size} is not a multiple of the tokenizer's downsample factor "
                         f"{factor}")
    side = clips.frame_size // factor
    return clips.num_frames, side, side


def video_config(tokenizer: torch.nn.Module, clips: ClipsConfig, config: GridConfig) -> GridConfig:
    """``config`` on the token grid and vocabulary that ``tokenizer`` gives ``clips``."""
    return replace(config, grid=clip_grid(tokenizer, clips), vocab_size=tokenizer.codebook_size)
