"""Recipe: train a NAR neighbouring-AR model on tokenised shapes images or clips (``vgen train nar``).

Teacher-forced: one full pass under the proximity mask over the whole, unshifted token grid. Every cell's logits
are the mean of the dimension-oriented heads that predict it from its available predecessors (the first cell:
every head at the class position), and the loss is the cross-entropy of those logits against all N tokens, as NAR
trains (``model(cond_idx, idx=z, targets=z, mask=proximity_mask)``). Each head thus learns its own direction's
targets through the average the sampler uses. LlamaGen's class dropout (in ``model.train()``) trains the null
class that guidance needs.

Warm start from next-token AR (vgen's addition; NAR trains from scratch). ``shapes-nar`` has the shapes AR model's
blocks, embeddings and 2-D rotary table, and its slot ``1 + p`` holds token ``p`` as in AR, so the AR model's
weights carry over block for block. Both heads start from AR's final norm and output layer: the right head's
target (the next token in the row) is AR's own target away from the row ends, and the below head's shares its
vocabulary embedding.

Warm start from NBP, for video. ``SHAPES_VIDEO_NAR`` has ``SHAPES_VIDEO_NBP``'s width, depth and frame
vocabulary. NBP's output at a slot predicts the same cell one block later: one frame later in frame blocks (the
target of NAR's next-frame head), one row below in row blocks (the below head's). Every block and both embeddings
carry over and every head starts from NBP's output layer (NBP's begin-of-video slots are dropped). NBP rotates
slot ``1 + p`` with the position of the token it predicts, one block ahead of NAR's; rotary attention depends only
on offsets between slots, and these are unchanged.

Warm start from an image NAR, for 64-px video. ``SHAPES_VIDEO_NAR_64`` lays 8 frames of the image
tokenizer's 16 x 16 codes with ``rope="spatial"`` (each frame rotated as an image) and the image model's trunk
depth, so ``shapes-nar``'s blocks, embeddings and right / below heads carry over by name; the next-frame head's
extra block and the head itself, and the per-frame embedding (zero), keep their initialisation.

Frame 0 first, for video (``--image-first``). In the 3-D order frame 0's cells are drawn beside later
frames' cells and see some of them, so an image NAR's start is lost on frame 0. With ``image_first`` frame 0 is laid
out as an image (:mod:`vgen.models.nar`): started from an image NAR, the video model draws frame 0 exactly as that
model draws an image from the first step, and, as in NBP's recipe, ``first_frames`` other frames of each clip also
train frame 0 alone (:func:`~vgen.training.clip_codes.with_first_frames`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from vgen.data.clips import SHAPES_CLIPS, SHAPES_CLIPS_64, SHAPES_CLIPS_64_LONG, ClipsConfig
from vgen.data.shapes import data_config
from vgen.hub import CheckpointError, from_pretrained, load_weights
from vgen.models.nar import NARConfig, NARTransformer
from vgen.training.ar import SHAPES_GPT, cached_codes
from vgen.training.clip_codes import CLIP_RECIPE, ClipRecipe, fit_on_clips, video_config, with_first_frames
from vgen.training.tokenizer import SHAPES_FRAME_VQ
from vgen.training.trainer import RunDefaults, TrainConfig, TrainingData, fit_on_codes, latest_checkpoint

_GPT_SIZE = dict(dim=SHAPES_GPT.dim, n_head=SHAPES_GPT.n_head, multiple_of=SHAPES_GPT.multiple_of,
                 num_classes=SHAPES_GPT.num_classes, class_dropout_prob=SHAPES_GPT.class_dropout_prob,
                 token_dropout_p=0.0, resid_dropout_p=0.0, ffn_dropout_p=0.0)
# shapes-nar: the shapes AR model's width, vocabulary and classes on its 16x16 grid, with one block fewer in the
# trunk so that trunk + the below head's extra block match its 8 blocks (a fair speed comparison)
SHAPES_NAR = NARConfig(grid=(SHAPES_GPT.grid_size,) * 2, vocab_size=SHAPES_GPT.vocab_size,
                       n_layer=SHAPES_GPT.n_layer - 1, **_GPT_SIZE)
# shapes-video-nar: the same 8 blocks (6 in the trunk, one more per extra head) over the clips' 16 x 8 x 8 codes
SHAPES_VIDEO_NAR = NARConfig(grid=(16, 8, 8), vocab_size=SHAPES_FRAME_VQ.codebook_size,
                             n_layer=SHAPES_GPT.n_layer - 2, **_GPT_SIZE)
# 64-px clips in the image tokenizer's codes, each frame rotated as an image, shapes-nar's trunk: an image NAR model
# starts it (9 blocks: shapes-nar's 8 and the next-frame head's)
SHAPES_VIDEO_NAR_64 = NARConfig(grid=(SHAPES_CLIPS_64.num_frames,) + SHAPES_NAR.grid, vocab_size=SHAPES_NAR.vocab_size,
                                n_layer=SHAPES_NAR.n_layer, rope="spatial", **_GPT_SIZE)
VIDEO_NAR_RECIPES = {SHAPES_CLIPS: SHAPES_VIDEO_NAR, SHAPES_CLIPS_64: SHAPES_VIDEO_NAR_64,
                     SHAPES_CLIPS_64_LONG: replace(SHAPES_VIDEO_NAR_64, grid=(SHAPES_CLIPS_64_LONG.num_frames,
                                                                              *SHAPES_VIDEO_NAR_64.grid[1:]))}
# other frames of each clip that an image-first video model's frame 0 also learns from (with_first_frames); NBP's
# H100 run used 2 as well
VIDEO_NAR_FIRST_FRAMES = 2


# fp32: bf16 autocast measured about 1.5x slower (1.6 against 2.4 s for a batch of 8, 1 thread)
NAR_RUN = RunDefaults(steps=3000, lr=1e-3, batch_size=32, warmup_steps=100, num_items=24000, precision="fp32")


@dataclass(frozen=True)
class NARRecipe:
    num_items: int = 24000  # images
    batch_size: int = 32


def warm_start(model: NARTransformer, state: dict[str, torch.Tensor], source: str = "AR model") -> None:
    """Load a next-token (LlamaGen AR) or next-block (NBP) model's state into ``model``: blocks and embeddings by
    name, every head from its final norm and output layer (NBP's begin-of-video slots have no NAR counterpart).
    A state of another size is a :class:`~vgen.hub.CheckpointError`."""
    if "norm.weight" not in state or "output.weight" not in state:
        raise CheckpointError(f"{source} is not a next-token or next-block model: it has no final norm.weight and "
                              f"output.weight to start the NAR heads from")
    kept = {k: v for k, v in state.items() if not k.startswith(("norm.", "output.")) and k != "bov"}
    for a in range(len(model.heads)):
        kept[f"heads.{a}.norm.weight"] = state["norm.weight"]
        kept[f"heads.{a}.output.weight"] = state["output.weight"]
    load_weights(model, kept, source=source)


def from_image_nar(model: NARTransformer, state: dict[str, torch.Tensor], source: str = "image NAR model") -> None:
    """Start a video NAR ``model`` from an image NAR model's ``state`` of the same trunk depth: every block,
    embedding and the right and below heads by name (the heads read the same blocks in both); the next-frame
    head, its extra block and a per-frame embedding keep their initialisation. Any other difference is a
    :class:`~vgen.hub.CheckpointError`."""
    own = {k: v for k, v in model.state_dict().items()
           if k.startswith((f"layers.{len(model.layers) - 1}.", f"heads.{model.config.rank - 1}.", "frame_embedding."))}
    if any(k in state for k in own):
        blocks = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("layers."))
        raise CheckpointError(f"{source} has {blocks} blocks; a video NAR model of {len(model.layers)} starts from "
                              f"an image NAR model of {len(model.layers) - 1} (the same trunk depth)")
    load_weights(model, {**state, **own}, source=source)


def _initialise(model: NARTransformer, run_dir: Path, init_from: str | Path | None) -> None:
    """A new run starts from ``init_from`` (a NAR export, an image NAR export for a video model, or an AR or NBP
    export to warm-start from); resumes ignore it."""
    if init_from is None or latest_checkpoint(run_dir) is not None:
        return
    source = from_pretrained(init_from)
    if isinstance(source, NARTransformer) and source.config.rank < model.config.rank:
        from_image_nar(model, source.state_dict(), source=str(init_from))
    elif isinstance(source, NARTransformer):
        load_weights(model, source.state_dict(), source=str(init_from))
    else:
        warm_start(model, source.state_dict(), source=str(init_from))


def train_nar(run_dir: str | Path, tokenizer_dir: str | Path, data_dir: str | Path, train: TrainConfig,
              recipe: NARRecipe = NARRecipe(), config: NARConfig = SHAPES_NAR, max_minutes: float | None = None,
              init_from: str | Path | None = None) -> NARTransformer:
    """Train (or resume) an image NAR run on tokenised shapes images; the EMA model goes to ``run_dir/export``."""
    run_dir = Path(run_dir)
    codes, labels = cached_codes(tokenizer_dir, data_dir, "train", recipe.num_items, run_dir)
    model = NARTransformer(config)
    _initialise(model, run_dir, init_from)
    data = TrainingData.of(data_dir, data_config(data_dir), codes, labels)
    return fit_on_codes(run_dir, model, codes, labels, train, recipe, data, max_minutes)


def train_video_nar(run_dir: str | Path, tokenizer_dir: str | Path, data_dir: str | Path, train: TrainConfig,
                    recipe: ClipRecipe = CLIP_RECIPE, config: NARConfig = SHAPES_VIDEO_NAR,
                    clips: ClipsConfig = SHAPES_CLIPS, max_minutes: float | None = None,
                    init_from: str | Path | None = None,
                    evaluate: Callable[[torch.nn.Module], dict] | None = None,
                    first_frames: int = 0) -> NARTransformer:
    """Train (or resume) a video NAR run on per-frame codes of the clips as NBP's runs do (:func:`fit_on_clips`:
    clips also played backwards, ``evaluate`` such as a :func:`clip_probe` every ``recipe.eval_every`` steps); the
    EMA model goes to ``run_dir/export``. ``first_frames`` other frames of each clip also train frame 0 alone
    (:func:`with_first_frames`), which needs ``config.image_first``."""
    if first_frames and not config.image_first:
        raise ValueError(f"first_frames={first_frames} trains frame 0 alone, which needs a model that draws frame 0 "
                         f"first (image_first=True)")
    loss_fn = with_first_frames(first_frames)  # a bad count fails before anything loads
    model = NARTransformer(video_config(from_pretrained(tokenizer_dir), clips, config))
    _initialise(model, Path(run_dir), init_from)
    return fit_on_clips(run_dir, model, tokenizer_dir, data_dir, train, recipe, clips, max_minutes, loss_fn,
                        evaluate)
