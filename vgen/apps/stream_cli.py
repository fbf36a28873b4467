"""``vgen stream``: stream an unbounded video from a block-diffusion model into an mp4 / GIF, block by block.

A class model streams a class (``--class-id``), a text model a prompt (``--prompt``); ``--switch FRAME:VALUE``
changes it from the block holding that frame on, re-encoding the cached context as ``--switch-mode`` says.
Frames reach the file as each block completes (a fragmented mp4). Ctrl-C (or SIGTERM) ends the stream after the
block in hand and closes the file normally (exit status 130); a crash or a kill leaves the fragments written so
far, which play. ``--profile`` writes the per-block latency, frames per second, memory, switches and re-cache time.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from vgen.apps.options import (
    UsageError,
    add_device_args,
    add_option_flags,
    add_overwrite_flag,
    check_count,
    check_writable,
    class_label,
    load_pipeline,
    output_name,
    plural,
    recommended_defaults,
    set_options,
    stream_settings,
)
from vgen.interrupts import graceful_stop
from vgen.pipelines import StreamPipeline, available_models
from vgen.pipelines.inputs import check_prompts, check_switches
from vgen.samplers.options import declarations
from vgen.samplers.streaming import StreamConfig, StreamControl, StreamProfile
from vgen.video_io import StreamingVideoWriter

CLASS_STREAM_MODEL = "shapes-blockdiff"  # the embedded model `vgen stream` plays when no model is named
TEXT_STREAM_MODEL = "shapes-t2v-stream"  # ... and when a prompt is given
SWITCH_MODE = "switch"  # the StreamConfig field --switch-mode sets (--switch itself names the switches)


def parse_switch(text: str) -> tuple[int, str]:
    """``FRAME:VALUE`` -> (frame, VALUE): split on the first colon, so that a prompt may hold colons. The value is
    read once the model is loaded (a prompt for a text model, a class id or name for a class model)."""
    frame, colon, value = text.partition(":")
    try:
        if not colon:
            raise ValueError
        return int(frame), value
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected FRAME:VALUE (a frame number, then a prompt or a class id or "
                                         f"name), got {text!r}") from None


def add_stream_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stream", help="stream a long video from a block-diffusion model (mp4 / GIF)",
                       description="Generate a video of any length block by block with a bounded (rolling) "
                                   "key/value cache, writing each block as soon as it is denoised: a class model "
                                   "streams a class, a text model a prompt, and --switch changes it mid-stream.")
    p.add_argument("--model", default=None,
                   help=f"embedded model name or pipeline folder (default: {CLASS_STREAM_MODEL}, or "
                        f"{TEXT_STREAM_MODEL} with --prompt)")
    p.add_argument("--class-id", type=class_label, default=None, metavar="CLASS",
                   help="class models: the class of the video, by id or name (`vgen models` lists the names; "
                        "default: 0)")
    p.add_argument("--prompt", default=None,
                   help="text models: what the video shows (default: the model's first example prompt)")
    p.add_argument("--switch", dest="switches", type=parse_switch, action="append", default=[],
                   metavar="FRAME:VALUE",
                   help="from the block holding FRAME on, stream VALUE instead: a prompt (text models) or a class "
                        "id or name (class models); repeatable, frames increasing as given")
    modes = declarations(StreamConfig)[SWITCH_MODE]
    p.add_argument("--switch-mode", choices=modes.spec.choices, default=None,
                   help=f"{modes.spec.help} (unset: the model's recommended value, else {modes.default})")
    p.add_argument("--frames", "--num-frames", dest="frames", type=int, default=160,
                   help="frames to generate (--num-frames, as the other commands spell it, is the same flag)")
    p.add_argument("--seed", type=int, default=0, help="random seed: the same seed draws the same video")
    settings = stream_settings()
    add_option_flags(p.add_argument_group("schedule and context (unset = the model's recommended value)"),
                     settings, recommended_defaults(settings))
    o = p.add_argument_group("output")
    o.add_argument("--out", default=None, help=".mp4 (crash-safe, fragmented) or .gif (default: MODEL_stream.mp4, "
                                                 "such as shapes-blockdiff_stream.mp4)")
    o.add_argument("--fps", type=int, default=8, help="frames per second of the video file")
    o.add_argument("--profile", default=None, help="write the profiling report (JSON) here")
    add_overwrite_flag(o)
    add_device_args(o)
    p.set_defaults(func=run_stream)


def default_model(prompted: bool) -> str:
    """The embedded model to stream when ``--model`` is not given: the text model for a prompt."""
    if not prompted:
        return CLASS_STREAM_MODEL
    if TEXT_STREAM_MODEL not in available_models():
        raise UsageError(f"{TEXT_STREAM_MODEL} is not installed, and --prompt needs a text streaming model: pass "
                         f"--model with a text block-diffusion pipeline folder (`vgen train package` writes one)")
    return TEXT_STREAM_MODEL


def stream_condition(args: argparse.Namespace, pipe: StreamPipeline) -> dict:
    """What the stream starts with, as :meth:`StreamPipeline.stream_blocks` takes it: the prompt of a text model
    (its first example prompt when none is given), the class id of a class model."""
    name = pipe.info.name
    if not pipe.is_text:
        if args.prompt is not None:
            raise UsageError(f"{name} is a class streaming model: it takes --class-id, not --prompt (a prompt needs "
                             f"a text model such as {TEXT_STREAM_MODEL})")
        return {"class_ids": [pipe.class_id(0 if args.class_id is None else args.class_id)]}
    if args.class_id is not None:
        raise UsageError(f"{name} is a text streaming model: it streams what --prompt says, not --class-id")
    if args.prompt is None:
        if not pipe.example_prompts:
            raise UsageError(f"{name} is a text streaming model: give --prompt")
        return {"prompt": pipe.example_prompts[0]}
    return {"prompt": args.prompt}


def read_switches(args: argparse.Namespace, pipe: StreamPipeline) -> list[tuple[int, int | str]]:
    """The switches in the order given, each value read for the model: a prompt for a text model (a number is
    refused: it would be a class id), a class id or name for a class model; frames checked by
    :func:`~vgen.pipelines.inputs.check_switches`."""
    pairs = []
    for frame, value in args.switches:
        where = f"--switch {frame}:{value}"
        if not pipe.is_text:
            pairs.append((frame, pipe.class_id(class_label(value))))
            continue
        if isinstance(class_label(value), int):
            raise UsageError(f"{where}: {pipe.info.name} is a text streaming model: switch to a prompt, not a "
                             f"class id")
        pairs.append((frame, check_prompts(value, where, many=False)[0]))
    return check_switches(pairs, args.frames)


def run_stream(args: argparse.Namespace) -> None:
    check_writable(args.out, {".mp4", ".gif"}, args.overwrite)
    check_writable(args.profile, {".json"}, args.overwrite)
    check_count("--frames (--num-frames)", args.frames)
    if args.fps <= 0:
        raise UsageError(f"--fps must be > 0, got {args.fps}")
    if args.prompt is not None:
        args.prompt = check_prompts(args.prompt, "--prompt", many=False)[0]
    args.model = args.model or default_model(args.prompt is not None)
    pipe = load_pipeline(args, streaming=True)
    if not isinstance(pipe, StreamPipeline):
        raise UsageError(f"{pipe.info.name} is not a streaming (block-diffusion) model; try --model "
                         f"{CLASS_STREAM_MODEL}")
    if args.out is None:
        args.out = output_name(pipe.info.name, "stream", ".mp4")
        check_writable(args.out, None, args.overwrite)
    condition = stream_condition(args, pipe)
    switches = read_switches(args, pipe)
    options = set_options(args, stream_settings())
    if args.switch_mode is not None:
        options[SWITCH_MODE] = args.switch_mode
    control = StreamControl()
    profile = StreamProfile(pipe.frames_per_block)
    recache_ms = []
    # every argument is checked here, before the file is opened; the blocks come as they are iterated
    blocks = pipe.stream_blocks(num_frames=args.frames, switches=dict(switches), seed=args.seed, control=control,
                                progress=not args.no_progress, **condition, **options)
    with graceful_stop() as stop_requested, StreamingVideoWriter(
            args.out, fps=args.fps, keyframe_every=max(args.fps, pipe.frames_per_block)) as writer:
        for block in blocks:
            writer.write(block.frames[0])
            profile.add(block)
            recache_ms.append(block.recache_s * 1000)
            if stop_requested():  # Ctrl-C / SIGTERM: keep this block, then end the stream and close the file
                control.stop()
        interrupted = stop_requested()
    report = {**profile.report(), "model": pipe.info.name, "class_id": condition.get("class_ids", [None])[0],
              "prompt": condition.get("prompt"), "switches": switches, "recache_ms": recache_ms, "seed": args.seed,
              "config": asdict(pipe.stream_config(**options)), "out": args.out, "interrupted": interrupted}
    if args.profile:
        Path(args.profile).write_text(json.dumps(report, indent=1))
    fps = report["fps"] or 0.0
    print(f"{'interrupted: ' if interrupted else ''}wrote {plural(writer.frames_written, 'frame')} to {args.out} "
          f"({fps:.1f} frames/s generated, {report['block_latency_s']['mean'] * 1000:.0f} ms per block of "
          f"{plural(pipe.frames_per_block, 'frame')})", file=sys.stderr if interrupted else sys.stdout)
    if interrupted:
        raise KeyboardInterrupt
