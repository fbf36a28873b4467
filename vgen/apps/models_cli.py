"""``vgen models``: each embedded model (or the pipeline folders named) with its kind, its classes and the sampling
settings it uses by default, read from the folder's configs without loading any weights."""

from __future__ import annotations

import argparse
import dataclasses
import json
import textwrap
from pathlib import Path

import torch

from vgen.hub import PIPELINE_CONFIG, CheckpointError, model_config
from vgen.pipelines import PipelineInfo, available_models, default_sampler, pipeline_folder
from vgen.pipelines.stream import MODEL_FOLDER
from vgen.samplers import SamplingParams
from vgen.samplers.options import merge_settings
from vgen.samplers.streaming import StreamConfig

ORDERS = {"raster": "next-token AR", "next-neighbour": "next-neighbour AR (NAR)", "next-block": "next-block AR (NBP)",
          "continuous": "continuous-token AR (diffusion head)"}
WIDTH = 110


def add_models_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list the embedded models: kind, classes and default sampling settings",
                       description="Each embedded model (or each pipeline folder named) with its kind, the class "
                                   "names that --class-id takes, and the sampling settings it uses unless told "
                                   "otherwise.")
    p.add_argument("models", nargs="*", metavar="MODEL",
                   help="embedded model names or pipeline folders (default: every embedded model)")
    p.set_defaults(func=run_models)


def run_models(args: argparse.Namespace) -> None:
    print("\n".join(describe(name) for name in args.models or available_models()))


def skeleton(folder: Path) -> torch.nn.Module:
    """The model saved in ``folder``, built from its config on the meta device: its layout, not its weights."""
    _, model_cls, config = model_config(folder)
    with torch.device("meta"):
        return model_cls(config)


def describe(name: str) -> str:
    """Three lines on the pipeline ``name``: its name and kind, its classes (a text model: example prompts), its
    default settings."""
    folder = pipeline_folder(name)
    try:
        info = PipelineInfo(**json.loads((folder / PIPELINE_CONFIG).read_text()))
    except (json.JSONDecodeError, TypeError) as e:
        raise CheckpointError(f"bad {folder / PIPELINE_CONFIG}: {e}") from None
    if (folder / MODEL_FOLDER).is_dir():
        model = skeleton(folder / MODEL_FOLDER)
        kind = (f"class-conditional streaming video for `vgen stream` ({info.image_size} px), block diffusion, "
                f"{model.frames_per_block}-frame blocks, trained on {model.config.train_frames} frames")
        settings = dataclasses.asdict(StreamConfig(**merge_settings(info.defaults, {})))
    else:
        model = skeleton(folder / "gpt")
        grid = tuple(model.grid)
        order = ORDERS.get(getattr(model, "token_order", "raster"), getattr(model, "token_order", "raster"))
        what = "text-to-image" if getattr(model, "text_conditional", False) else "class-conditional"
        media = f"video ({grid[0]} frames of {info.image_size} px)" if len(grid) == 3 else \
            f"images ({info.image_size} px)"
        kind = f"{what} {media}, {order}, {'x'.join(map(str, grid))} tokens"
        if (folder / "drafter").is_dir():
            kind += ", with a draft model" if order == ORDERS["continuous"] else ", with a draft head"
        settings = {"sampler": default_sampler(model),
                    **SamplingParams(**merge_settings(info.defaults, {})).to_dict()}
    if getattr(model, "text_conditional", False):
        examples = "; ".join(f'"{p}"' for p in info.example_prompts[:2]) or "none recorded"
        condition = f"prompts, e.g. {examples}"
    elif info.class_names:
        condition = f"classes: {', '.join(info.class_names)}"
    else:
        condition = f"classes: ids 0..{model.num_classes - 1} (no names recorded)"
    defaults = ", ".join(f"{k} {v}" for k, v in settings.items())
    lines = [f"{info.name}: {kind}", condition, f"defaults: {defaults}"]
    return "\n".join([textwrap.fill(lines[0], WIDTH, subsequent_indent="    ")] +
                     [textwrap.fill(line, WIDTH, initial_indent="  ", subsequent_indent="    ") for line in lines[1:]])
