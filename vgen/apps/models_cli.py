"""The listing commands. ``vgen models``: each embedded model (or the pipeline folders named) with its kind, its
classes (a text model: its words by attribute) and the sampling settings it uses by default, then the shipped judges,
read from the folders' configs without loading any weights. ``vgen samplers``: each registered sampler on one line:
whether it is lossless, the models it fits and what it does."""

from __future__ import annotations

import argparse
import dataclasses
import json
import textwrap
from pathlib import Path

import torch

from vgen.data.scenes import words_by_attribute
from vgen.data.shapes import CLASS_NAMES
from vgen.eval.classifier import SHIPPED_CLASSIFIER, SHIPPED_SCENE_JUDGE, SHIPPED_VIDEO_CLASSIFIER
from vgen.hub import ASSETS, PIPELINE_CONFIG, CheckpointError, model_config
from vgen.models.word_encoder import WordEncoderConfig
from vgen.pipelines import PipelineInfo, available_models, default_sampler, pipeline_folder
from vgen.pipelines.stream import MODEL_FOLDER
from vgen.samplers import SamplingParams, available_samplers, get_sampler
from vgen.samplers.base import MODEL_KINDS
from vgen.samplers.options import merge_settings
from vgen.samplers.streaming import StreamConfig

WIDTH = 110
JUDGES = (SHIPPED_CLASSIFIER, SHIPPED_SCENE_JUDGE, SHIPPED_VIDEO_CLASSIFIER)
# what each judge's network is used for, by its model class
JUDGE_USES = {"ShapesClassifier": "class accuracy and FID features of image models (vgen quality, vgen bench, "
                                  "vgen eval)",
              "AttributeClassifier": "how faithfully a text-to-image model draws its prompts (vgen quality, vgen "
                                     "bench)",
              "ShapesVideoClassifier": "clip class accuracy and FVD features of video models (vgen quality, vgen "
                                       "bench, vgen eval)"}
LOSSLESS = {True: "lossless", False: "lossy", None: "plain"}


def add_models_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list the embedded models: kind, classes and default sampling settings",
                       description="Each embedded model (or each pipeline folder named) with its kind, the class "
                                   "names that --class-id takes (a text-to-image model: the words its prompts use), "
                                   "and the sampling settings it uses unless told otherwise; then the shipped "
                                   "judges, which score samples and draw none.")
    p.add_argument("models", nargs="*", metavar="MODEL",
                   help="embedded model or judge names, or pipeline folders (default: every embedded model and "
                        "judge)")
    p.set_defaults(func=run_models)


def add_samplers_parser(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("samplers", help="list the samplers: lossless or not, the models they fit, what they do",
                   description="Each registered sampler on one line: lossless (its tokens follow the plain "
                               "sampler's distribution), lossy, or plain (the plain sampler of its models); the "
                               "models it fits; what it does.").set_defaults(func=run_samplers)


def run_models(args: argparse.Namespace) -> None:
    print("\n".join(describe_judge(name) if name in JUDGES else describe(name)
                    for name in args.models or [*available_models(), *JUDGES]))


def run_samplers(args: argparse.Namespace) -> None:
    print("\n".join(sampler_line(name) for name in available_samplers()))


def sampler_line(name: str) -> str:
    """One registered sampler: its name, lossless / lossy / plain, the models it fits, what it does."""
    cls = type(get_sampler(name))
    return f"{name:<14}{LOSSLESS[cls.lossless]:<10}{MODEL_KINDS.get(cls.token_order, cls.token_order)}: " \
           f"{cls.description}"


def vocabulary_lines(words: tuple[str, ...]) -> list[str]:
    """A word-level text encoder's ``words`` by attribute (:func:`~vgen.data.scenes.words_by_attribute`), a line
    each: ``shape: box, circle, ...``."""
    groups = words_by_attribute(words)
    lines = [f"{name}: {', '.join(group)}" for name, group in groups.items()]
    if "colour" in groups and "background" in groups:
        index = list(groups).index("background")
        lines[index] += " (and the colours)"
    return lines


def describe_judge(name: str) -> str:
    """Two lines on the shipped judge ``name``: what it reads (from its config) and what it is used for."""
    class_name, _, config = model_config(ASSETS / name)
    if class_name == "AttributeClassifier":
        reads = (f"reads a scene's {', '.join(f'{n} ({k} values)' for n, k in config.attributes)} from "
                 f"{config.image_size}-px images")
    elif class_name == "ShapesVideoClassifier":
        reads = f"classifies clips of {config.num_frames} frames of {config.image_size} px into {config.num_classes} " \
                f"classes"
    else:
        reads = f"classifies {config.image_size}-px images into {config.num_classes} classes"
    if getattr(config, "num_classes", None) == len(CLASS_NAMES):
        reads += f" ({', '.join(CLASS_NAMES)})"
    lines = [f"{name}: judge (draws nothing), {reads}", f"used for: {JUDGE_USES[class_name]}"]
    return wrapped(lines)


def wrapped(lines: list[str]) -> str:
    """An entry: its first line, then the others indented, each wrapped at :data:`WIDTH`."""
    return "\n".join([textwrap.fill(lines[0], WIDTH, subsequent_indent="    ")] +
                     [textwrap.fill(line, WIDTH, initial_indent="  ", subsequent_indent="    ") for line in lines[1:]])


def skeleton(folder: Path) -> torch.nn.Module:
    """The model saved in ``folder``, built from its config on the meta device: its layout, not its weights."""
    _, model_cls, config = model_config(folder)
    with torch.device("meta"):
        return model_cls(config)


def pipeline_info(folder: Path) -> PipelineInfo:
    """What a pipeline folder's ``pipeline.json`` records, read without loading any weights."""
    try:
        return PipelineInfo(**json.loads((folder / PIPELINE_CONFIG).read_text()))
    except (json.JSONDecodeError, TypeError) as e:
        raise CheckpointError(f"bad {folder / PIPELINE_CONFIG}: {e}") from None


def describe(name: str) -> str:
    """Three lines on the pipeline ``name``: its name and kind, its classes (a text model: example prompts), its
    default settings."""
    folder = pipeline_folder(name)
    info = pipeline_info(folder)
    if (folder / MODEL_FOLDER).is_dir():
        model = skeleton(folder / MODEL_FOLDER)
        what = "prompt-conditioned" if model.is_text else "class-conditional"
        kind = (f"{what} streaming video for `vgen stream` ({info.image_size} px), block diffusion, "
                f"{model.frames_per_block}-frame blocks, trained on {model.config.train_frames} frames")
        settings = dataclasses.asdict(StreamConfig(**merge_settings(info.defaults, {})))
    else:
        model = skeleton(folder / "gpt")
        grid = tuple(model.grid)
        order = MODEL_KINDS.get(getattr(model, "token_order", "raster"), getattr(model, "token_order", "raster"))
        what = "text-to-image" if getattr(model, "text_conditional", False) else "class-conditional"
        media = f"video ({grid[0]} frames of {info.image_size} px)" if len(grid) == 3 else \
            f"images ({info.image_size} px)"
        kind = f"{what} {media}, {order}, {'x'.join(map(str, grid))} tokens"
        if (folder / "drafter").is_dir():
            kind += ", with a draft model" if order == MODEL_KINDS["continuous"] else ", with a draft head"
        settings = {"sampler": default_sampler(model),
                    **SamplingParams(**merge_settings(info.defaults, {})).to_dict()}
    if getattr(model, "text_conditional", False) or getattr(model, "is_text", False):
        examples = "; ".join(f'"{p}"' for p in info.example_prompts[:2]) or "none recorded"
        condition = f"prompts, e.g. {examples}"
    elif info.class_names:
        condition = f"classes: {', '.join(info.class_names)}"
    else:
        condition = f"classes: ids 0..{model.num_classes - 1} (no names recorded)"
    defaults = ", ".join(f"{k} {v}" for k, v in settings.items())
    lines = [f"{info.name}: {kind}", condition, *words_line(folder), f"defaults: {defaults}"]
    return wrapped(lines)


def words_line(folder: Path) -> list[str]:
    """For a pipeline with a word-level text encoder, the line of the words its prompts use, by attribute; else
    none."""
    if not (folder / "text_encoder").is_dir():
        return []
    _, _, config = model_config(folder / "text_encoder")
    if not isinstance(config, WordEncoderConfig):
        return []
    lines = vocabulary_lines(config.vocabulary)
    known = sum(len(line.split(",")) for line in lines)
    return [f"a single shape, in {known} words: {'; '.join(lines)}"]
