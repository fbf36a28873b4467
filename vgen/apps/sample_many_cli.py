"""``vgen sample-many``: thousands of samples for evaluation, across processes with ``torchrun``, packed as ``.npz``.

    torchrun --nproc_per_node 8 -m vgen sample-many --num-samples 50000 --out samples/run --device cuda
    vgen sample-many --model shapes-t2i --prompts captions.txt --out samples/t2i
    torchrun --nproc_per_node 8 -m vgen sample-many --model FOLDER --prompts captions_val2014.json --subset 30000 \
        --out samples/coco30k --device cuda
    vgen sample-many --model FOLDER --prompts PartiPrompts.tsv --out samples/parti
    vgen sample-many --model FOLDER --prompts evaluation_metadata.jsonl --format geneval --out samples/geneval
    vgen sample-many --model shapes-blockdiff --num-samples 2048 --num-frames 16 --out samples/stream
    vgen sample-many --model shapes-video-nbp --num-samples 2048 --num-frames 16 --out samples/nbp16

The logic (seeds, labels, sharding, resuming, packing) is :mod:`vgen.eval.sample_many`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vgen.apps.options import (
    UsageError,
    add_checkpoint_args,
    add_device_args,
    add_model_args,
    add_overwrite_flag,
    add_prompt_set_args,
    add_sampler_args,
    add_stream_args,
    check_count,
    check_suffix,
    check_writable,
    class_label,
    load_pipeline,
    plural,
    read_prompt_set_args,
    refuse_stream_args,
    sampler_options,
    sampling_params,
    stream_overrides,
)
from vgen.eval.sample_many import LongClips, SamplePlan, StreamClips, init_distributed, sample_many
from vgen.pipelines import StreamPipeline, VideoPipeline, default_sampler
from vgen.samplers import Sampler, SamplingParams, get_sampler


def add_sample_many_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sample-many", help="many samples across processes (torchrun), resumable, packed as .npz",
                       description="Draw --num-samples images (or a video model's clips) into --out as numbered "
                                   "PNGs (a clip as its frames top to bottom; sharded over the processes of "
                                   "`torchrun --nproc_per_node N -m vgen sample-many ...`), then pack them as an "
                                   "ADM-style .npz (arr_0: uint8 [N, H, W, 3] or clips [N, T, H, W, 3], arr_1: "
                                   "labels; for a text-to-image model's --prompts, arr_1: prompt numbers, "
                                   "prompts: the prompts, ids: their source's ids, and categories and challenges "
                                   "where the set has them). Rerunning the same command resumes: it keeps the PNGs "
                                   "already drawn with the same settings (a folder of other settings is refused), "
                                   "redraws damaged ones and draws the rest; the .npz is packed once all are drawn, "
                                   "and one that exists is replaced only with --overwrite. Sample i depends only on "
                                   "i and the settings, not on the number of processes.")
    add_model_args(p)
    gen = add_sampler_args(p)
    add_stream_args(p)
    gen.add_argument("--num-samples", type=int, default=None,
                     help="images (clips) to draw and pack, exactly: the last batch is cut short (default with "
                          "prompts: one per prompt; required otherwise)")
    gen.add_argument("--class-id", type=class_label, action="append", dest="class_ids", metavar="CLASS",
                     help="draw labels only from these classes, by id or name (repeatable; `vgen models` lists the "
                          "names; default: every class)")
    gen.add_argument("--balanced", action="store_true",
                     help="classes in turn (every class equally often) instead of uniformly random labels")
    add_prompt_set_args(gen)
    gen.add_argument("--seed", type=int, default=0, help="global seed")
    gen.add_argument("--batch-size", type=int, default=32,
                     help="samples per forward batch on each process (default: 32)")
    gen.add_argument("--num-frames", type=int, default=None,
                     help="a video model's frames per clip (default: the length it was trained on): a streaming "
                          "(block-diffusion) model streams them with its recommended settings under the stream "
                          "flags set and --cfg-scale as its guidance; a token model draws a longer clip window by "
                          "window")
    gen.add_argument("--window-context", type=int, default=None,
                     help="a video token model's frames each later window continues (default: half the window)")
    out = p.add_argument_group("output")
    out.add_argument("--out", required=True, help="folder of PNGs (created with its parents; rerun to resume)")
    out.add_argument("--npz", default=None, help="packed file to write (default: the --out folder's name + .npz)")
    add_overwrite_flag(out)
    add_device_args(out)
    add_checkpoint_args(p)
    p.set_defaults(func=run_sample_many)


def run_sample_many(args: argparse.Namespace) -> None:
    prompt_set = read_prompt_set_args(args)
    if args.num_samples is None:
        if prompt_set is None:
            raise UsageError("give --num-samples N, or a text-to-image model's --prompts FILE (one sample a prompt)")
        args.num_samples = len(prompt_set)
    check_count("--num-samples", args.num_samples)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {args.out} exists and is not a folder")
    npz = args.npz or str(out.with_name(out.name + ".npz"))
    check_suffix(npz, {".npz"})
    if Path(npz).exists():  # refused before any work; a new one's folder is made and checked once all else is
        check_writable(npz, None, args.overwrite)
    if prompt_set is not None and (args.class_ids or args.balanced):
        raise UsageError(f"--class-id and --balanced are for a class model; {prompt_flag(args)}'s prompts go in "
                         f"turn")
    if args.sampler is not None:
        get_sampler(args.sampler, **sampler_options(args))  # bad settings fail before the model loads
    ctx = init_distributed(args.device)
    try:
        args.device = ctx.device
        pipe = load_pipeline(args, streaming=True)
        if isinstance(pipe, StreamPipeline):
            if args.window_context is not None:
                raise UsageError(f"--window-context is for video token models; {pipe.info.name} streams")
            sampler, params = None, stream_clips(pipe, args)
        else:
            refuse_stream_args(args, pipe.info.name)
            sampler = get_sampler(args.sampler or default_sampler(pipe.model), **sampler_options(args))
            params = sampling_params(pipe, args)
            if args.num_frames is not None or args.window_context is not None:
                params = long_clips(pipe, args, sampler, params)
        text_conditional = getattr(pipe, "text_conditional", False)  # a streaming model is class-conditional
        if prompt_set is not None and not text_conditional:
            raise UsageError(f"{prompt_flag(args)} is for a text-to-image model; {pipe.info.name} is "
                             f"class-conditional (draw its classes with --class-id, or all of them by default)")
        if text_conditional and prompt_set is None:
            raise UsageError(f"{pipe.info.name} is a text-to-image model: give its prompts with --prompts FILE "
                             f"(COCO captions, PartiPrompts, GenEval metadata or one prompt a line)")
        plan = (SamplePlan(args.seed, args.batch_size, prompt_set=prompt_set) if prompt_set is not None else
                SamplePlan(args.seed, args.batch_size, tuple(pipe.class_list(args.class_ids)), args.balanced))
        for path in (out, Path(npz)):  # once every setting is checked: a refused command leaves no folders
            make_parents(path)
        check_writable(npz)
        result = sample_many(pipe, out, args.num_samples, plan, sampler, params, npz, ctx, not args.no_progress)
    finally:
        ctx.close()
    for damage in result.damaged:
        print(f"vgen: warning: {damage}; drew it again", file=sys.stderr)
    if result.npz is not None:
        print(f"wrote {plural(result.num_samples, 'sample')} to {result.npz} (drew {result.generated} in this run on "
              f"{ctx.world_size} process{'es' if ctx.world_size > 1 else ''}, kept {result.reused} from before)")


def prompt_flag(args: argparse.Namespace) -> str:
    """The flag that gave the prompts, as messages name it."""
    return "--prompts" if args.prompts is not None else "--prompt-file"


def stream_clips(pipe: StreamPipeline, args: argparse.Namespace) -> StreamClips:
    """A streaming model's clips: --num-frames long (default: its trained length), streamed with its recommended
    settings under the stream flags set and --cfg-scale."""
    frames = pipe.model.config.train_frames if args.num_frames is None else args.num_frames
    check_count("--num-frames", frames)
    return StreamClips(pipe.stream_config(**stream_overrides(args)), frames)


def long_clips(pipe, args: argparse.Namespace, sampler: Sampler, params: SamplingParams) -> LongClips:
    """A video token model's clips of --num-frames (default: its window), window by window with ``sampler``."""
    if not isinstance(pipe, VideoPipeline):
        flag = "--num-frames" if args.num_frames is not None else "--window-context"
        raise UsageError(f"{flag} is for video models; {pipe.info.name} generates images")
    frames = pipe.num_frames if args.num_frames is None else args.num_frames
    check_count("--num-frames", frames)
    pipe.check_window_context(args.window_context, frames, sampler)
    return LongClips(params, frames, args.window_context)


def make_parents(path: Path) -> None:
    """Create the folders above ``path`` (``--out samples/run`` in a fresh checkout)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create the folder of {path}: {e.strerror or e}") from None
