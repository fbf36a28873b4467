"""``vgen sample``: images as a grid (or a video model's clips as an mp4 / GIF / frame grid), with the sampler's
stats and acceptance map."""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from vgen.apps.options import (
    IMAGE_SUFFIXES,
    UsageError,
    add_checkpoint_args,
    add_device_args,
    add_model_args,
    add_negative_prompt_arg,
    add_overwrite_flag,
    add_sampler_args,
    add_sampler_option_flags,
    check_writable,
    class_label,
    load_pipeline,
    negative_prompt_args,
    output_name,
    plural,
    sampler_options,
    sampling_overrides,
)
from vgen.eval.videos import read_video
from vgen.images import CAPTION_WIDTH, captioned_grid, image_grid
from vgen.pipelines import PipelineOutput, default_sampler, tile_clips
from vgen.pipelines.inputs import check_prompts, read_prompt_file
from vgen.samplers import SamplerStats, get_sampler
from vgen.video_io import VIDEO_FORMATS, write_video
from vgen.visualize import acceptance_figure, clip_acceptance_figure


def add_sample_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sample", help="generate images and save them as a grid",
                       description="Generate images of classes, or of prompts for a text-to-image model. With no "
                                   "arguments: a grid of every class from the embedded default model.")
    add_model_args(p)
    gen = p.add_argument_group("what to draw")
    gen.add_argument("--class-id", type=class_label, action="append", dest="class_ids", metavar="CLASS",
                     help="class to generate, by id or name (repeatable; `vgen models` lists the names; default: "
                          "every class in turn)")
    gen.add_argument("--prompt", action="append", dest="prompts",
                     help="text-to-image model: what to draw (repeatable)")
    gen.add_argument("--prompt-file", default=None,
                     help="text-to-image model: a text file of prompts, one a line (blank lines skipped)")
    add_negative_prompt_arg(gen)
    gen.add_argument("--num-images", type=int, default=None,
                     help="images (clips) in all, the classes or prompts repeated in turn (default: one per class "
                          "or prompt given)")
    gen.add_argument("--seed", type=int, default=0, help="random seed: the same seed draws the same images")
    gen.add_argument("--context", default=None,
                     help="video model: a clip (.mp4, .gif) whose first --context-frames frames every clip continues")
    gen.add_argument("--context-frames", type=int, default=1, help="frames of --context given")
    gen.add_argument("--num-frames", type=int, default=None,
                     help="video model: frames per clip (default: the model's window); longer clips are drawn "
                          "window by window, each continuing the last --window-context frames")
    gen.add_argument("--window-context", type=int, default=None,
                     help="video model: frames each later window continues (default: half the window)")
    sampling = add_sampler_args(p, option_flags=False)
    sampling.add_argument("--batch-size", type=int, default=None,
                          help="images (clips) drawn at once (default: 1 for a speculative sampler on a CPU, where a "
                               "batch runs until its slowest image is done and every pass costs more per image; "
                               "else up to 64)")
    sampling.add_argument("--compare", action="store_true",
                          help="draw the same images again with the model's one-token-per-pass sampler (ar), same "
                               "seed and batch size, and print the step compression and latency ratio against it")
    out = p.add_argument_group("output")
    out.add_argument("--out", default=None,
                     help="image grid to write; for a video model an .mp4, .gif or frame-grid .png (default: "
                          "MODEL_SAMPLER.png, such as shapes-c2i_ar.png; MODEL_SAMPLER.mp4 for a video model)")
    out.add_argument("--fps", type=int, default=8, help="frames per second of a video output")
    out.add_argument("--cols", type=int, default=None, help="grid columns (default: up to 8)")
    out.add_argument("--captions", action=argparse.BooleanOptionalAction, default=None,
                     help=f"write each image's prompt (or class name) under it, the image enlarged to "
                          f"{CAPTION_WIDTH} px wide (nearest neighbour) so the words fit (default: on for a "
                          f"text-to-image model, off for a class model)")
    out.add_argument("--stats", default=None,
                     help="write the sampler's stats as JSON here, with the per-token data of the acceptance map")
    out.add_argument("--acceptance-map", default=None,
                     help="write each image beside the map of the forward pass that produced each token (for a "
                          "video model: each clip's frames above their maps), a colour bar of the passes under them")
    add_overwrite_flag(out)
    add_device_args(out)
    add_sampler_option_flags(p)
    add_checkpoint_args(p)
    p.set_defaults(func=run_sample)


def run_sample(args: argparse.Namespace) -> None:
    check_writable(args.out, IMAGE_SUFFIXES | set(VIDEO_FORMATS), args.overwrite)
    check_writable(args.stats, {".json"}, args.overwrite)
    check_writable(args.acceptance_map, IMAGE_SUFFIXES, args.overwrite)
    if args.cols is not None and args.cols < 1:
        raise UsageError(f"--cols must be >= 1, got {args.cols}")
    if args.fps < 1:
        raise UsageError(f"--fps must be >= 1, got {args.fps}")
    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {args.batch_size}")
    options = sampler_options(args)
    if args.sampler is not None:
        get_sampler(args.sampler, **options)  # bad names and settings fail before the model loads
    if args.context is not None and not Path(args.context).is_file():
        raise UsageError(f"--context {args.context} is not a file")
    pipe = load_pipeline(args)
    negative = negative_prompt_args(args, pipe)
    if args.out is None:
        suffix = ".mp4" if hasattr(pipe, "num_frames") else ".png"
        args.out = output_name(pipe.info.name, args.sampler or default_sampler(pipe.model), suffix)
        check_writable(args.out, None, args.overwrite)
    batch_size = args.batch_size or (1 if one_at_a_time(args.sampler, args.device) else None)
    if args.compare and default_sampler(pipe.model) not in ONE_PER_PASS:
        raise UsageError(f"--compare draws with a one-token-per-pass sampler; {pipe.info.name} draws several tokens "
                         f"a pass ({default_sampler(pipe.model)}): `vgen bench --reference-model` compares it with "
                         f"a next-token model")
    if hasattr(pipe, "num_frames"):
        return run_sample_video(args, pipe, options, batch_size)
    for flag, value in (("--context", args.context), ("--num-frames", args.num_frames),
                        ("--window-context", args.window_context)):
        if value is not None:
            raise UsageError(f"{flag} is for video models; {pipe.info.name} generates images")
    if Path(args.out).suffix.lower() not in IMAGE_SUFFIXES:
        raise UsageError(f"{pipe.info.name} generates images; write them to one of {sorted(IMAGE_SUFFIXES)}, "
                         f"not {Path(args.out).suffix}")
    start = time.perf_counter()
    prompts = read_prompts(args)
    if args.class_ids and getattr(pipe, "text_conditional", False):
        raise UsageError(f"{pipe.info.name} is a text-to-image model: it draws what --prompt or --prompt-file "
                         f"describes, not --class-id")
    if prompts is None and getattr(pipe, "text_conditional", False):
        if not pipe.info.example_prompts:
            raise UsageError(f"{pipe.info.name} is a text-to-image model: give --prompt or --prompt-file")
        prompts = list(pipe.info.example_prompts)
    request = dict(num_images=args.num_images, seed=args.seed, progress=not args.no_progress, prompt=prompts,
                   batch_size=batch_size, **negative, **sampling_overrides(args))
    out = pipe(args.class_ids, sampler=args.sampler, **request, **options)
    elapsed = time.perf_counter() - start
    cols = args.cols or min(8, len(out.images))
    grid_of(out, pipe, cols, args.captions).save(args.out)
    if args.acceptance_map:
        acceptance_figure(out.images, out.stats.accept_step, pipe.model.grid, min(4, cols)).save(args.acceptance_map)
    stats = {**out.stats.to_dict(per_token=True), **pass_figures(out.stats, math.prod(pipe.model.grid)),
             "model": pipe.info.name, "class_ids": out.class_ids, "prompts": out.prompts, "total_time_s": elapsed}
    if args.compare:
        stats["compare"] = compared(out.stats, pipe(args.class_ids, sampler=default_sampler(pipe.model), **request),
                                    stats["next_token_forward_passes"])
    if args.stats:
        Path(args.stats).write_text(json.dumps(stats, indent=1))
    print(f"wrote {plural(len(out.images), 'image')} to {args.out}: {passes_summary(stats)}")
    if args.compare:
        print(compare_summary(stats))


def grid_of(out, pipe, cols: int, captions: bool | None):
    """The images as one grid, with each prompt or class name under its image when ``captions`` (None: when the
    images were drawn from prompts)."""
    if captions is None:
        captions = bool(out.prompts)
    if not captions:
        return image_grid(out.images, cols)
    names = out.prompts or [pipe.class_name(c) for c in out.class_ids]
    return captioned_grid(out.images, names, cols)


def read_prompts(args: argparse.Namespace) -> list[str] | None:
    """The prompts of --prompt and --prompt-file, in that order; None when neither is given."""
    if args.prompts is None and args.prompt_file is None:
        return None
    prompts = []
    if args.prompts is not None:
        try:
            prompts = [check_prompts(prompt, "--prompt")[0] for prompt in args.prompts]
        except ValueError as e:
            raise UsageError(str(e)) from None
    if args.prompt_file is not None:
        try:
            prompts += read_prompt_file(args.prompt_file)
        except ValueError as e:
            raise UsageError(f"--prompt-file: {e}") from None
    return prompts


ONE_PER_PASS = ("ar", "continuous-ar")  # the samplers that draw one token per forward pass


def one_at_a_time(sampler: str | None, device: str) -> bool:
    """Whether ``vgen sample`` draws one image at a time unless told otherwise: for a speculative sampler (one that
    verifies drafts) on a CPU, where a batch runs until its slowest image is done and a pass costs more for each
    image it carries, so drafting cuts the time of one image, not of a batch."""
    return sampler is not None and get_sampler(sampler).lossless is not None and torch.device(device).type == "cpu"


def pass_figures(stats: SamplerStats, next_token: int) -> dict:
    """The passes behind each image: ``passes_per_image`` (the target passes until each image's last token, on
    average), ``next_token_forward_passes`` (one per token), ``step_compression`` (their ratio),
    ``images_per_batch`` and ``batches``."""
    chunks = stats.details.get("chunks", 1)
    if stats.accept_step is None:
        per_image = stats.forward_passes / chunks
    else:
        per_image = float(stats.accept_step.amax(dim=1).double().mean())
    return {"passes_per_image": per_image, "next_token_forward_passes": next_token,
            "step_compression": next_token / per_image, "images_per_batch": math.ceil(stats.batch_size / chunks),
            "batches": chunks}


def compared(stats: SamplerStats, reference: PipelineOutput, next_token: int) -> dict:
    """The figures of ``--compare``: the one-token-per-pass run's sampler, passes per image and sampling time, and
    the step compression and latency ratio against it."""
    ref = pass_figures(reference.stats, next_token)["passes_per_image"]
    mine = pass_figures(stats, next_token)["passes_per_image"]
    return {"sampler": reference.stats.sampler, "passes_per_image": ref, "wall_time_s": reference.stats.wall_time_s,
            "step_compression": ref / mine, "latency_ratio": reference.stats.wall_time_s / stats.wall_time_s}


def passes_summary(stats: dict) -> str:
    """The closing line's figures: passes per image (against next-token AR's one per token when the sampler takes
    another number), the batches, the sampling time."""
    per_image, next_token = stats["passes_per_image"], stats["next_token_forward_passes"]
    passes = count_text(per_image)
    if abs(per_image - next_token) < 1e-9:
        counted = f"{passes} forward passes per image, one per token"
    else:
        counted = (f"{passes} forward passes per image where next-token AR takes {next_token} "
                   f"({stats['step_compression']:.2f}x fewer)")
    size, batches = stats["images_per_batch"], stats["batches"]
    return (f"{counted}, in {plural(batches, 'batch', 'batches')} of {size}; {stats['wall_time_s']:.2f} s "
            f"sampling")


def count_text(value: float) -> str:
    """A mean count as the closing lines show it: a whole number as one, else to one decimal."""
    return str(round(value)) if value == round(value) else f"{value:.1f}"


def compare_summary(stats: dict) -> str:
    """The line ``--compare`` adds: the reference run and the step compression and latency ratio against it."""
    ref = stats["compare"]
    return (f"{ref['sampler']}, same seed and batches: {count_text(ref['passes_per_image'])} forward passes per image, "
            f"{ref['wall_time_s']:.2f} s sampling; {stats['sampler']} took {ref['step_compression']:.2f}x fewer "
            f"passes and ran {ref['latency_ratio']:.2f}x as fast")


def run_sample_video(args: argparse.Namespace, pipe, options: dict, batch_size: int | None) -> None:
    """``vgen sample`` for a video pipeline: the clips side by side as one mp4 / GIF, or a frame-grid PNG."""
    if args.compare:
        raise UsageError(f"--compare is for image models; {pipe.info.name} generates videos")
    if Path(args.out).suffix.lower() not in VIDEO_FORMATS:
        raise UsageError(f"{pipe.info.name} generates videos; write them to one of {', '.join(VIDEO_FORMATS)}, "
                         f"not {Path(args.out).suffix}")
    context = None
    if args.context is not None:
        context = read_video(Path(args.context))
        if not 0 < args.context_frames <= len(context):
            raise UsageError(f"--context-frames must be between 1 and the {len(context)} frames of {args.context}, "
                             f"got {args.context_frames}")
        context = context[:args.context_frames]
    start = time.perf_counter()
    out = pipe(args.class_ids, num_videos=args.num_images, sampler=args.sampler, seed=args.seed,
               progress=not args.no_progress, context=context, num_frames=args.num_frames,
               window_context=args.window_context, batch_size=batch_size, **sampling_overrides(args), **options)
    elapsed = time.perf_counter() - start
    clip = tile_clips(out.videos, args.cols or min(4, len(out.videos)))
    write_video(clip, args.out, fps=args.fps)
    grid = (out.videos.shape[1], *pipe.model.grid[1:])
    if args.acceptance_map:
        clip_acceptance_figure(out.videos, out.stats.accept_step, grid).save(args.acceptance_map)
    stats = {**out.stats.to_dict(per_token=True), **pass_figures(out.stats, math.prod(grid)), "model": pipe.info.name,
             "class_ids": out.class_ids, "total_time_s": elapsed,
             "frames_per_second": out.videos.shape[0] * out.videos.shape[1] / out.stats.wall_time_s}
    if args.stats:
        Path(args.stats).write_text(json.dumps(stats, indent=1))
    print(f"wrote {plural(len(out.videos), 'clip')} of {plural(out.videos.shape[1], 'frame')} to {args.out}: "
          f"{passes_summary(stats).replace('per image', 'per clip')}")
