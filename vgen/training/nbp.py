"""Recipe: train an NBP next-block model on tokenised moving-shapes clips (``vgen train nbp``).

Clips are tokenised frame by frame (:mod:`vgen.training.clip_codes`). The loss is NBP's: one teacher-forced pass
under the block-causal mask over ``[class, begin-of-video x B, blocks 0 .. K-2]`` (hybrid: block 0 under a causal
mask, :mod:`vgen.models.nbp`) and the cross-entropy against every token, with LlamaGen's 10% class dropout for
the null class guidance needs.

Sizes. Default clips are 16 frames of 32x32 pixels; with a per-frame VQ of downsample factor 4 (``SHAPES_FRAME_VQ``)
that is 16 x 8 x 8 = 1024 tokens, generated in 16 frame blocks after frame 0's 64 tokens one by one (79 passes).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from vgen.data.clips import SHAPES_CLIPS, ClipsConfig
from vgen.hub import from_pretrained
from vgen.models.nbp import NBPConfig, NBPTransformer
from vgen.training.ar import SHAPES_GPT
from vgen.training.clip_codes import CLIP_RECIPE, ClipRecipe, fit_on_clips, video_config
from vgen.training.tokenizer import SHAPES_FRAME_VQ
from vgen.training.trainer import TokenLoss, TrainConfig, token_grid_loss

# shapes-video-nbp: the shapes AR model's width and depth over 16 frames of 8 x 8 tokens in frame blocks; grid and
# vocabulary follow the tokenizer and clips a run is given. Hybrid start (frame 0 token by token, 16 + 63 = 79
# passes): the first run drew frame 0's 64 tokens independently given the class, and its clips were noise
SHAPES_VIDEO_NBP = NBPConfig(grid=(16, 8, 8), block="frame", hybrid=True, vocab_size=SHAPES_FRAME_VQ.codebook_size,
                             dim=SHAPES_GPT.dim, n_layer=SHAPES_GPT.n_layer, n_head=SHAPES_GPT.n_head,
                             multiple_of=SHAPES_GPT.multiple_of, num_classes=SHAPES_GPT.num_classes,
                             class_dropout_prob=0.1, token_dropout_p=0.0, resid_dropout_p=0.0, ffn_dropout_p=0.0)


# frames of each clip that the hybrid start also learns from as first frames (session 12: see docs/training.md §10)
FIRST_FRAMES = 8


def with_first_frames(first_frames: int) -> TokenLoss:
    """NBP's loss plus, for a hybrid model in frame blocks, the cross-entropy of block 0 alone on ``first_frames``
    frames drawn at random from each clip's frames ``1 .. T-1`` (same class): any frame of a clip is a frame of the
    class that a clip could start from. The token-by-token start otherwise learns from one frame per clip, and two
    runs without this never drew a shape in frame 0. Figures: ``acc`` of the clip, ``first_loss``, ``first_acc``."""
    if first_frames < 0:
        raise ValueError(f"first_frames must be >= 0, got {first_frames}")

    def loss_fn(model: NBPTransformer, class_ids: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, dict]:
        loss, figures = token_grid_loss(model, class_ids, tokens)
        if not first_frames or not model.hybrid or model.config.block != "frame":  # a later row is no first row
            return loss, figures
        b = model.block_size
        frames = tokens.reshape(len(tokens), -1, b)
        picked = torch.randint(1, frames.shape[1], (len(tokens), first_frames), device=tokens.device)
        blocks = frames[torch.arange(len(tokens), device=tokens.device)[:, None], picked].reshape(-1, b)
        logits = model.first_block_logits(class_ids.repeat_interleave(first_frames), blocks)
        first = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), blocks.reshape(-1))
        first_acc = float((logits.argmax(-1) == blocks).float().mean())
        return loss + first, figures | {"first_loss": float(first.detach()), "first_acc": first_acc}

    return loss_fn


def train_nbp(run_dir: str | Path, tokenizer_dir: str | Path, data_dir: str | Path, train: TrainConfig,
              recipe: ClipRecipe = CLIP_RECIPE, config: NBPConfig = SHAPES_VIDEO_NBP,
              clips: ClipsConfig = SHAPES_CLIPS, max_minutes: float | None = None,
              first_frames: int = FIRST_FRAMES,
              evaluate: Callable[[torch.nn.Module], dict] | None = None) -> NBPTransformer:
    """Train (or resume) an NBP run in ``run_dir`` (:func:`with_first_frames` for a hybrid model), running
    ``evaluate`` (e.g. :func:`~vgen.training.clip_codes.clip_probe`) every ``recipe.eval_every`` steps; the EMA
    model is exported to ``run_dir/export``."""
    loss_fn = with_first_frames(first_frames)  # a bad count fails before anything loads
    model = NBPTransformer(video_config(from_pretrained(tokenizer_dir), clips, config))
    return fit_on_clips(run_dir, model, tokenizer_dir, data_dir, train, recipe, clips, max_minutes, loss_fn,
                        evaluate)
