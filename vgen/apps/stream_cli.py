"""``vgen stream``: stream an unbounded video from a block-diffusion model into an mp4 / GIF, block by block.

Frames reach the file as each block completes (a fragmented mp4). Ctrl-C (or SIGTERM) ends the stream after the
block in hand and closes the file normally (exit status 130); a crash or a kill leaves the fragments written so
far, which play. ``--profile`` writes the per-block latency, frames per second and memory report.
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
from vgen.pipelines import StreamPipeline
from vgen.samplers.streaming import StreamControl, StreamProfile
from vgen.video_io import StreamingVideoWriter


def parse_switch(text: str) -> tuple[int, int | str]:
    """``FRAME:CLASS`` -> (frame, class id or name)."""
    try:
        frame, label = text.split(":")
        return int(frame), class_label(label)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected FRAME:CLASS (a frame number and a class id or name), "
                                         f"got {text!r}") from None


def add_stream_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stream", help="stream a long video from a block-diffusion model (mp4 / GIF)",
                       description="Generate a class-conditional video of any length block by block with a bounded "
                                   "(rolling) key/value cache, writing each block as soon as it is denoised.")
    p.add_argument("--model", default="shapes-blockdiff", help="embedded model name or pipeline folder")
    p.add_argument("--class-id", type=class_label, default=0, metavar="CLASS",
                   help="class of the video, by id or name (`vgen models` lists the names)")
    p.add_argument("--switch", type=parse_switch, action="append", default=[], metavar="FRAME:CLASS",
                   help="change the class from the block holding this frame on (repeatable)")
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


def run_stream(args: argparse.Namespace) -> None:
    check_writable(args.out, {".mp4", ".gif"}, args.overwrite)
    check_writable(args.profile, {".json"}, args.overwrite)
    check_count("--frames (--num-frames)", args.frames)
    if args.fps <= 0:
        raise UsageError(f"--fps must be > 0, got {args.fps}")
    pipe = load_pipeline(args, streaming=True)
    if not isinstance(pipe, StreamPipeline):
        raise UsageError(f"{pipe.info.name} is not a streaming (block-diffusion) model; try --model shapes-blockdiff")
    if args.out is None:
        args.out = output_name(pipe.info.name, "stream", ".mp4")
        check_writable(args.out, None, args.overwrite)
    class_id = pipe.class_id(args.class_id)
    for frame, _ in args.switch:
        if frame < 0:
            raise UsageError(f"--switch frame must be >= 0, got {frame}")
    switch_ids = sorted((frame, pipe.class_id(label)) for frame, label in args.switch)
    options = set_options(args, stream_settings())
    control = StreamControl()
    first_class, switches = class_id, list(switch_ids)
    while switches and switches[0][0] < pipe.frames_per_block:  # a switch inside the first block starts it
        first_class = switches.pop(0)[1]
    profile = StreamProfile(pipe.frames_per_block)
    # every argument is checked here, before the file is opened; the blocks come as they are iterated
    blocks = pipe.stream_blocks([first_class], args.frames, seed=args.seed, control=control,
                                progress=not args.no_progress, **options)
    with graceful_stop() as stop_requested, StreamingVideoWriter(
            args.out, fps=args.fps, keyframe_every=max(args.fps, pipe.frames_per_block)) as writer:
        for block in blocks:
            writer.write(block.frames[0])
            profile.add(block)
            if stop_requested():  # Ctrl-C / SIGTERM: keep this block, then end the stream and close the file
                control.stop()
            next_start = block.start_frame + block.frames.shape[1] + pipe.frames_per_block - 1
            while switches and switches[0][0] <= next_start:
                control.set_class(switches.pop(0)[1])
        interrupted = stop_requested()
    report = {**profile.report(), "model": pipe.info.name, "class_id": class_id, "switches": switch_ids,
              "seed": args.seed, "config": asdict(pipe.stream_config(**options)), "out": args.out,
              "interrupted": interrupted}
    if args.profile:
        Path(args.profile).write_text(json.dumps(report, indent=1))
    fps = report["fps"] or 0.0
    print(f"{'interrupted: ' if interrupted else ''}wrote {plural(writer.frames_written, 'frame')} to {args.out} "
          f"({fps:.1f} frames/s generated, {report['block_latency_s']['mean'] * 1000:.0f} ms per block of "
          f"{plural(pipe.frames_per_block, 'frame')})", file=sys.stderr if interrupted else sys.stdout)
    if interrupted:
        raise KeyboardInterrupt
