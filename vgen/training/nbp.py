"""Recipe: train an NBP next-block model on tokenised moving-shapes clips (``vgen train nbp``).

Clips are tokenised frame by frame (:mod:`vgen.training.clip_codes`). The loss is NBP's: one teacher-forced pass
under the block-causal mask over ``[class, begin-of-video x B, blocks 0 .. K-2]`` (hybrid: block 0 under a causal
mask, :mod:`vgen.models.nbp`) and the cross-entropy against every token, with LlamaGen's 10% class dropout for
the null class guidance needs.

Sizes. Default clips are 16 frames of 32x32 pixels; with a per-frame VQ of downsample factor 4 (``SHAPES_FRAME_VQ``)
that is 16 x 8 x 8 = 1024 tokens, generated in 128 row blocks of 8, the first row token by token (135 passes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from vgen.data.clips import SHAPES_CLIPS, SHAPES_CLIPS_64, SHAPES_CLIPS_64_LONG, ClipsConfig
from vgen.hub import CheckpointError, from_pretrained, load_weights
from vgen.models.llamagen import LlamaGenGPT
from vgen.models.nbp import NBPConfig, NBPTransformer
from vgen.training.ar import SHAPES_GPT
from vgen.training.clip_codes import CLIP_RECIPE, ClipRecipe, fit_on_clips, video_config, with_first_frames
from vgen.training.tokenizer import SHAPES_FRAME_VQ
from vgen.training.trainer import RunDefaults, TrainConfig, latest_checkpoint

# the 32-px recipe: the shapes AR model's width and depth over 16 frames of 8 x 8 tokens in row blocks, NBP's own
# layout (one latent row a step); grid and vocabulary follow the tokenizer and clips a run is given. Hybrid start
# (row 0 token by token, 8 + 127 = 135 passes): block 0 drawn independently given the class gives noise clips.
# Row blocks rather than frame blocks: a row sees the rows above it in its own frame, and at 548 steps a row model
# predicted the codes a moving outline changes better than a frame model at 2,634 (docs/backbones.md)
SHAPES_VIDEO_NBP = NBPConfig(grid=(16, 8, 8), block="row", hybrid=True, vocab_size=SHAPES_FRAME_VQ.codebook_size,
                             dim=SHAPES_GPT.dim, n_layer=SHAPES_GPT.n_layer, n_head=SHAPES_GPT.n_head,
                             multiple_of=SHAPES_GPT.multiple_of, num_classes=SHAPES_GPT.num_classes,
                             class_dropout_prob=0.1, token_dropout_p=0.0, resid_dropout_p=0.0, ffn_dropout_p=0.0)

# shapes-video-nbp, on 64-px clips: the image tokenizer's 16 x 16 codes a frame, each frame rotated as an
# image (rope="spatial") and all of frame 0 token by token (hybrid_blocks = 16 rows), so that the next-token image
# model shapes-c2i starts it (warm_start); then one row a pass: 256 + 112 = 368 passes for 8 frames
SHAPES_VIDEO_NBP_64 = replace(SHAPES_VIDEO_NBP, grid=(SHAPES_CLIPS_64.num_frames, SHAPES_GPT.grid_size,
                                                      SHAPES_GPT.grid_size),
                              vocab_size=SHAPES_GPT.vocab_size, hybrid_blocks=SHAPES_GPT.grid_size, rope="spatial")
VIDEO_NBP_RECIPES = {SHAPES_CLIPS: SHAPES_VIDEO_NBP, SHAPES_CLIPS_64: SHAPES_VIDEO_NBP_64,
                     SHAPES_CLIPS_64_LONG: replace(SHAPES_VIDEO_NBP_64, grid=(SHAPES_CLIPS_64_LONG.num_frames,
                                                                              *SHAPES_VIDEO_NBP_64.grid[1:]))}


def video_nbp_config(clips: ClipsConfig, block: str | None = None, rope: str | None = None,
                     hybrid_blocks: int | None = None) -> NBPConfig:
    """The recipe for ``clips`` (``VIDEO_NBP_RECIPES``, else ``SHAPES_VIDEO_NBP``) with the settings given. Another
    block kind keeps the recipe's token-by-token start in tokens (the 64-px recipe's frame 0 is 16 rows or one frame
    block) unless ``hybrid_blocks`` is given."""
    base = VIDEO_NBP_RECIPES.get(clips, SHAPES_VIDEO_NBP)
    config = replace(base, block=block or base.block, rope=rope or base.rope, hybrid_blocks=1)
    return replace(config, hybrid_blocks=hybrid_blocks or max(1, base.first_tokens // config.block_size))

# frames of each clip that frame 0 also learns from as first frames (docs/backbones.md)
FIRST_FRAMES = 8
# fp32: bf16 autocast measured 1.7x slower (4.7 against 8.1 s for a batch of 4, 1 thread)
NBP_RUN = RunDefaults(steps=20000, lr=1e-3, batch_size=16, warmup_steps=500, num_items=4000, precision="fp32")


def warm_start(model: NBPTransformer, state: dict[str, torch.Tensor], source: str = "NBP model") -> None:
    """Start ``model`` from another model's state, every weight by name.

    - Another NBP model, which may have another block kind (frame blocks into row blocks): as many begin-of-video
      rows as both have (a row model has W, a frame model H * W; rows the source lacks keep their initialisation).
      It may also have fewer frames (an 8-frame model starts a 16-frame one): the later frames' embeddings start as
      the source's last frame's, so each later frame starts out placed as the last frame the source was trained on.
    - A next-token image model (LlamaGen's GPT) of the frame grid: its blocks, embeddings, final norm and output
      layer; the begin-of-video slots (and a ``rope="spatial"`` model's per-frame embedding, zero) keep their
      initialisation. With ``rope="spatial"`` the hybrid block 0 is then that image model's own computation, each
      slot one raster step later (the extra begin-of-video slot aside), so a video model starts out drawing its
      first frame as the image model draws images (docs/models/shapes-video-nbp.md).

    Any other difference is a :class:`~vgen.hub.CheckpointError`."""
    own = {k: v for k, v in model.state_dict().items() if k == "bov" or k.startswith("frame_embedding.")}
    if "bov" not in state:
        if "tok_embeddings.weight" not in state or "output.weight" not in state:
            raise CheckpointError(f"{source} is neither an NBP model (no begin-of-video slots, bov) nor a next-token "
                                  f"model (no tok_embeddings and output weights)")
        load_weights(model, {**state, **own}, source=source)
        return
    bov = model.bov.detach().clone()
    rows = min(len(bov), len(state["bov"]))
    bov[:rows] = state["bov"][:rows]
    load_weights(model, {**own, **state, "bov": bov, **longer_frame_embedding(model, state, source)}, source=source)


def longer_frame_embedding(model: NBPTransformer, state: dict[str, torch.Tensor],
                           source: str) -> dict[str, torch.Tensor]:
    """The per-frame embedding of a ``rope="spatial"`` model over more frames than the NBP ``state`` it starts
    from: the source's rows, then its last row for every later frame ({} where either model has none). A source of
    more frames than the model is a :class:`~vgen.hub.CheckpointError`."""
    key = "frame_embedding.weight"
    if key not in state or not hasattr(model, "frame_embedding"):
        return {}
    frames, learnt = model.frame_embedding.num_embeddings, state[key]
    if len(learnt) > frames:
        raise CheckpointError(f"{source} was trained on {len(learnt)} frames; it can start a model of as many frames "
                              f"or more, not one of {frames}")
    return {key: torch.cat([learnt, learnt[-1:].expand(frames - len(learnt), -1)])}


def train_nbp(run_dir: str | Path, tokenizer_dir: str | Path, data_dir: str | Path, train: TrainConfig,
              recipe: ClipRecipe = CLIP_RECIPE, config: NBPConfig = SHAPES_VIDEO_NBP,
              clips: ClipsConfig = SHAPES_CLIPS, max_minutes: float | None = None,
              first_frames: int = FIRST_FRAMES,
              evaluate: Callable[[torch.nn.Module], dict] | None = None,
              init_from: str | Path | None = None) -> NBPTransformer:
    """Train (or resume) an NBP run in ``run_dir`` (:func:`with_first_frames`), running ``evaluate`` (e.g.
    :func:`~vgen.training.clip_codes.clip_probe`) every ``recipe.eval_every`` steps; the EMA model is exported to
    ``run_dir/export``. ``init_from`` starts a new run from an NBP export or a next-token image model
    (:func:`warm_start`); resumes ignore it."""
    loss_fn = with_first_frames(first_frames)  # a bad count fails before anything loads
    model = NBPTransformer(video_config(from_pretrained(tokenizer_dir), clips, config))
    if init_from is not None and latest_checkpoint(run_dir) is None:
        source = from_pretrained(init_from)
        if not isinstance(source, NBPTransformer | LlamaGenGPT) or getattr(source.config, "frames", 1) != 1:
            raise CheckpointError(f"{init_from} holds a {type(source).__name__}, not an NBP model or a next-token "
                                  f"image model to start from")
        warm_start(model, source.state_dict(), source=str(init_from))
    return fit_on_clips(run_dir, model, tokenizer_dir, data_dir, train, recipe, clips, max_minutes, loss_fn,
                        evaluate)
