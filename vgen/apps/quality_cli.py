"""``vgen quality``: token statistics and the domain classifier's class accuracy of a model's samples (images,
clips, or a streaming model's streams), printed as a short summary with a per-class table; ``--json`` writes every
figure (the confusion matrix too), per-class figures keyed by class name."""

from __future__ import annotations

import argparse
import dataclasses
import json
import textwrap
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vgen import pipelines
from vgen.apps.options import (
    IMAGE_SUFFIXES,
    UsageError,
    add_overwrite_flag,
    add_sampler_args,
    add_stream_args,
    check_count,
    check_writable,
    device_name,
    plural,
    refuse_stream_args,
    sampler_options,
    sampling_params,
    stream_overrides,
)
from vgen.data.clips import ClipsConfig
from vgen.data.scenes import evaluation_prompts, render_scenes
from vgen.data.shapes import CLASS_NAMES, SPLIT_SEEDS
from vgen.eval.classifier import load_scene_judge, load_shapes_classifier
from vgen.eval.quality import accuracy_by_request, attribute_accuracy, class_accuracy, clip_quality, token_statistics
from vgen.hub import from_pretrained
from vgen.images import image_grid
from vgen.models.classifier import AttributeClassifier
from vgen.models.conditioning import cat_conditions
from vgen.pipelines import StreamPipeline, default_sampler
from vgen.samplers import Sampler, get_sampler
from vgen.training.classifier import reconstruct


def add_quality_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quality", help="token statistics and class (or prompt) accuracy of a model's samples",
                       description="Sample --num-images images or clips (classes in turn), then report the mean "
                                   "entropy and median top-1 probability of the token distributions they were drawn "
                                   "from (discrete-token models), and the domain classifier's class accuracy on "
                                   "them (on every frame of a clip, with a motion check against real clips). A "
                                   "streaming (block-diffusion) model is measured on --num-frames-long streams. A "
                                   "text-to-image model of the scenes domain draws held-out prompts that state "
                                   "every attribute, and the scene judge reads each attribute back from the "
                                   "pixels.")
    p.add_argument("--model", default="shapes-c2i", help="embedded model name or pipeline folder")
    p.add_argument("--num-images", type=int, default=512, help="images (clips) to sample, the classes in turn")
    p.add_argument("--batch-size", type=int, default=64, help="images (clips) sampled at once")
    p.add_argument("--seed", type=int, default=0, help="random seed of the samples")
    add_sampler_args(p)  # unset: the model's recommended values
    add_stream_args(p)  # a streaming model takes these and --cfg-scale, no token flags
    p.add_argument("--num-frames", type=int, default=None,
                   help="video models: frames per clip (default: the length the model was trained on; a token "
                        "model draws longer clips window by window)")
    p.add_argument("--window-context", type=int, default=None,
                   help="video token models: frames each later window continues (default: half the window)")
    p.add_argument("--grid", default=None, help="also write a grid, one row per class, of the first samples")
    p.add_argument("--json", default=None, help="write every figure here (JSON), the confusion matrix included")
    add_overwrite_flag(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--no-token-stats", action="store_true",
                   help="skip the token statistics, whose teacher-forced pass over every sample costs about as "
                        "much as sampling on long clips")
    p.add_argument("--device", type=device_name, default="cpu",
                   help="where the model samples (the judges run on the CPU)")
    p.add_argument("--judge", default=None,
                   help="text-to-image models: a scene judge folder (default: the shipped shapes-scene-judge)")
    p.set_defaults(func=run_quality)


def run_quality(args: argparse.Namespace) -> None:
    check_writable(args.grid, IMAGE_SUFFIXES, args.overwrite)
    check_writable(args.json, {".json"}, args.overwrite)
    check_count("--num-images", args.num_images)
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.num_frames is not None and args.num_frames < 2:
        raise UsageError(f"--num-frames must be >= 2 (the motion check compares frames), got {args.num_frames}")
    if args.sampler is not None:
        get_sampler(args.sampler, **sampler_options(args))  # bad settings fail before the model loads
    pipe = pipelines.load(args.model, device=args.device)
    if isinstance(pipe, StreamPipeline):
        if args.sampler is not None or sampler_options(args):
            raise UsageError(f"--sampler and its options are for token models; {pipe.info.name} streams")
        if args.window_context is not None:
            raise UsageError(f"--window-context is for video token models; {pipe.info.name} streams")
        return write_quality(pipe, stream_quality(pipe, args), args.json)
    if not isinstance(pipe, pipelines.ImagePipeline):
        raise UsageError(f"vgen quality measures token models (images or clips); {pipe.info.name} is not one")
    refuse_stream_args(args, pipe.info.name)
    video = hasattr(pipe, "num_frames")
    for flag, value in (("--num-frames", args.num_frames), ("--window-context", args.window_context)):
        if value is not None and not video:
            raise UsageError(f"{flag} is for video models; {pipe.info.name} generates images")
    if pipe.text_conditional:
        return write_prompt_quality(prompt_quality(pipe, args), args.json)
    if args.judge is not None:
        raise UsageError(f"--judge reads text-to-image samples; {pipe.info.name} is class-conditional")
    params, sampler = sampling_params(pipe, args), chosen_sampler(pipe, args)
    n_cls = pipe.num_classes
    classes = [i % n_cls for i in range(args.num_images)]
    tokens, images = [], []
    generator = torch.Generator(pipe.device).manual_seed(args.seed)
    clip_options = {"num_frames": args.num_frames, "window_context": args.window_context} if video else {}
    for i in range(0, args.num_images, args.batch_size):
        out = pipe(classes[i:i + args.batch_size], generator=generator, progress=not args.no_progress,
                   sampler=sampler, batch_size=args.batch_size, **params.to_dict(), **clip_options)
        tokens.append(out.tokens)
        images.extend(out.videos if video else out.images)
    tokens_t = torch.cat(tokens)
    if video:  # a clip longer than the window: the statistics of its first window
        tokens_t = tokens_t[:, :pipe.model.num_tokens]
    figures = {"model": pipe.info.name, "sampler": sampler_figures(sampler), "sampling": params.to_dict(),
               "seed": args.seed}
    # continuous tokens are drawn from densities: no entropy or top-1 there
    if not (args.no_token_stats or tokens_t.is_floating_point()):
        figures.update(token_statistics(pipe.model, tokens_t, torch.tensor(classes), params))
    if video:
        figures.update(clip_figures(pipe, np.stack(images), classes, args.grid))
    else:
        pixels = torch.from_numpy(np.stack([np.array(im) for im in images]))
        pixels = pixels.permute(0, 3, 1, 2).float().div(127.5).sub(1)
        figures.update(class_accuracy(load_shapes_classifier(), pixels, classes))
        if args.grid:
            per_class = max(1, min(8, args.num_images // n_cls))
            rows = [images[c + n_cls * j] for c in range(n_cls) for j in range(per_class)
                    if c + n_cls * j < len(images)]
            image_grid(rows, per_class).save(args.grid)
    write_quality(pipe, figures, args.json)


def chosen_sampler(pipe, args: argparse.Namespace) -> Sampler:
    """``--sampler`` with its option flags, or the model's plain sampler with them."""
    return get_sampler(args.sampler or default_sampler(pipe.model), **sampler_options(args))


def sampler_figures(sampler: Sampler) -> dict:
    """The sampler as the figures record it: its name and the options that differ from its defaults."""
    default = type(sampler)()
    return {"name": sampler.name, "options": {k: v for k, v in dataclasses.asdict(sampler).items()
                                              if getattr(default, k) != v}}


def sampler_text(figures: dict) -> str:
    """``lantern lantern_delta=0.3``: the sampler of the summary's first line."""
    return " ".join([figures["sampler"]["name"], *(f"{k}={v}" for k, v in figures["sampler"]["options"].items())])


def write_quality(pipe, figures: dict, path: str | None) -> None:
    """Key the per-class figures by class name, write every figure to ``path`` (JSON) and print the summary."""
    figures["per_class"] = {pipe.class_name(int(c)): v for c, v in figures["per_class"].items()}
    if path:
        Path(path).write_text(json.dumps(figures, indent=1))
    print(quality_summary(figures, misread(pipe, figures["confusion"])))


def misread(pipe, confusion: list[list[int]], most: int = 3) -> str:
    """``square as circle 9, heart 4; triangle as crescent 7``: the classes (of the domain classifier) that samples
    of each requested class were seen as instead, at most ``most`` of them, the most frequent first."""
    parts = []
    for wanted, row in enumerate(confusion):
        wrong = sorted(((n, seen) for seen, n in enumerate(row) if seen != wanted and n), key=lambda x: -x[0])
        if wrong:
            parts.append(f"{pipe.class_name(wanted)} as " + ", ".join(f"{CLASS_NAMES[seen]} {n}"
                                                                      for n, seen in wrong[:most]))
    return "; ".join(parts)


def quality_summary(figures: dict, misreadings: str = "") -> str:
    """A few lines: what was sampled and how, the figures, what the missed classes were seen as (``misreadings``), and
    a table of the per-class accuracy."""
    count = plural(figures["num_clips"], "clip") if "num_clips" in figures else plural(figures["num_images"], "image")
    settings = ", ".join(f"{k} {v}" for k, v in figures["sampling"].items())
    skip = ("model", "sampler", "sampling", "seed", "per_class", "confusion", "num_images", "num_clips")
    shown = {k: figures[k] for k in sorted(figures, key=lambda k: k != "class_accuracy") if k not in skip}
    sampler = f", {sampler_text(figures)}" if "sampler" in figures else ""  # a stream has no token sampler
    lines = [f"{figures['model']}: {count}, seed {figures['seed']}{sampler} ({settings})",
             "; ".join(f"{k} {_figure(v)}" for k, v in shown.items() if not isinstance(v, dict))]
    lines += [f"{k}: " + "; ".join(f"{name} {_figure(x)}" for name, x in v.items())
              for k, v in shown.items() if isinstance(v, dict)]
    lines += [f"misread: {misreadings}"] if misreadings else []
    text = "\n".join(textwrap.fill(line, 110, subsequent_indent="  ") for line in lines)
    names = list(figures["per_class"])
    widths = [max(len(name), 4) for name in names]
    header = "class     " + "  ".join(name.rjust(w) for name, w in zip(names, widths))
    row = "accuracy  " + "  ".join(f"{x:.2f}".rjust(w) for x, w in zip(figures["per_class"].values(), widths))
    return f"{text}\n{header}\n{row}"


def prompt_quality(pipe, args: argparse.Namespace) -> dict:
    """``vgen quality`` for a text-to-image pipeline: ``--num-images`` held-out prompts stating every attribute
    (:func:`~vgen.data.scenes.evaluation_prompts`), each attribute read back by the scene judge, and the token
    statistics under the prompts' condition; ``--grid`` gets the first 64 samples."""
    if args.judge is not None and not Path(args.judge).is_dir():
        raise UsageError(f"--judge {args.judge} is not a folder")
    judge = from_pretrained(args.judge) if args.judge else load_scene_judge()
    if not isinstance(judge, AttributeClassifier):
        raise UsageError(f"--judge {args.judge} holds a {type(judge).__name__}, not a scene judge")
    params, sampler = sampling_params(pipe, args), chosen_sampler(pipe, args)
    prompts, attributes = evaluation_prompts(args.num_images)
    tokens, images, conds = [], [], []
    generator = torch.Generator(pipe.device).manual_seed(args.seed)
    for i in range(0, args.num_images, args.batch_size):
        batch = prompts[i:i + args.batch_size]
        out = pipe(prompt=batch, generator=generator, progress=not args.no_progress, sampler=sampler,
                   batch_size=args.batch_size, **params.to_dict())
        tokens.append(out.tokens)
        images.extend(out.images)
        conds.append(pipe.prompt_encoder(batch))
    pixels = np.stack([np.array(im) for im in images])
    figures = {"model": pipe.info.name, "sampler": sampler_figures(sampler), "sampling": params.to_dict(),
               "seed": args.seed, "num_images": args.num_images,
               "attribute_accuracy": attribute_accuracy(judge, pixels, attributes),
               "by_request": accuracy_by_request(judge, pixels, attributes),
               "ceiling": scene_ceiling(pipe, judge, attributes)}
    if not args.no_token_stats:
        figures.update(token_statistics(pipe.model, torch.cat(tokens), cat_conditions(conds), params))
    if args.grid:
        image_grid(images[:64], 8).save(args.grid)
    return figures


def scene_ceiling(pipe, judge: AttributeClassifier, attributes: np.ndarray) -> dict:
    """The judge on the held-out prompts' own scenes (``real``) and on the pipeline tokenizer's reconstructions of
    them (``reconstructed``): what a model whose tokens were perfect would score."""
    # the scenes evaluation_prompts captions, at the pipeline's image size
    real = render_scenes(SPLIT_SEEDS["test"], 0, len(attributes), pipe.info.image_size)[0]
    return {"real": attribute_accuracy(judge, real, attributes),
            "reconstructed": attribute_accuracy(judge, reconstruct(pipe.tokenizer, real), attributes)}


def write_prompt_quality(figures: dict, path: str | None) -> None:
    """Write every figure to ``path`` (JSON) and print a few lines: the setup, the token statistics, the share
    of samples showing each attribute their prompt stated, those shares per requested value and size, and the
    ceiling."""
    if path:
        Path(path).write_text(json.dumps(figures, indent=1))
    settings = ", ".join(f"{k} {v}" for k, v in figures["sampling"].items())
    accuracy = figures["attribute_accuracy"]
    statistics = (f"mean_entropy_nats {_figure(figures['mean_entropy_nats'])}; median_top1_prob "
                  f"{_figure(figures['median_top1_prob'])}\n" if "mean_entropy_nats" in figures else "")
    print(f"{figures['model']}: {plural(figures['num_images'], 'held-out prompt')}, seed {figures['seed']}, "
          f"{sampler_text(figures)} ({settings})\n" + statistics
          + "attribute  " + "  ".join(name.rjust(max(10, len(name))) for name in accuracy) + "\n"
          + "accuracy   " + "  ".join(f"{x:.2f}".rjust(max(10, len(name))) for name, x in accuracy.items()))
    by_request = figures["by_request"]
    lines = [f"{name} by requested {name}: " + "; ".join(f"{value} {x:.2f}" for value, x in values.items())
             for name, values in by_request["per_value"].items()]
    lines += [f"{size} objects: " + "; ".join(f"{name} {x:.2f}" for name, x in values.items())
              for size, values in by_request.get("by_size", {}).items()]
    lines += [f"ceiling, the prompts' scenes {how}: " + "; ".join(f"{name} {x:.2f}" for name, x in values.items())
              for how, values in (("as drawn", figures["ceiling"]["real"]),
                                  ("through the tokenizer", figures["ceiling"]["reconstructed"]))]
    print("\n".join(textwrap.fill(line, 110, subsequent_indent="  ") for line in lines))


def _figure(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def stream_quality(pipe, args: argparse.Namespace) -> dict:
    """``vgen quality`` for a streaming pipeline: clips of ``--num-frames`` streamed in batches (seed
    ``--seed`` plus the batch's first index), judged as the token video models' clips are."""
    frames = pipe.model.config.train_frames if args.num_frames is None else args.num_frames
    options = stream_overrides(args)
    try:
        config = pipe.stream_config(**options)
    except ValueError as e:
        raise UsageError(str(e)) from None
    classes = [i % pipe.num_classes for i in range(args.num_images)]
    videos = [pipe(classes[i:i + args.batch_size], num_frames=frames, seed=args.seed + i,
                   progress=not args.no_progress, batch_size=args.batch_size, **options).videos
              for i in range(0, args.num_images, args.batch_size)]
    figures = {"model": pipe.info.name, "sampling": dataclasses.asdict(config), "seed": args.seed,
               "num_frames": frames}
    return {**figures, **clip_figures(pipe, np.concatenate(videos), classes, args.grid)}


def clip_figures(pipe, videos, classes: list[int], grid: str | None) -> dict:
    """``vgen quality`` for a video pipeline: :func:`~vgen.eval.quality.clip_quality` of the clips
    [N, T, H, W, 3] against real clips of the same length; ``grid`` gets one clip per class, a row of frames
    each."""
    length = videos.shape[1]
    clips = ClipsConfig(**pipe.info.data) if pipe.info.data else ClipsConfig(frame_size=pipe.info.image_size)
    figures = {**clip_quality(videos, classes, dataclasses.replace(clips, num_frames=length)), "num_frames": length}
    if grid:
        first = [classes.index(c) for c in range(pipe.num_classes) if c in classes]
        frames = [Image.fromarray(frame) for i in first for frame in videos[i]]
        image_grid(frames, length).save(grid)
    return figures
