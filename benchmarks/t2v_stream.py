"""Prompt-steered streams: prompt fidelity, prompt switches by switch mode, long-stream drift and speed of a
streaming model, every frame read by a judge (:mod:`vgen.eval.switching`).

1. **fidelity**: ``--streams`` streams of ``--fidelity-frames`` (16) frames of held-out prompts
   (:func:`vgen.data.moving_scenes.evaluation_prompts`); the share of frames showing the prompt's shape and colour,
   and the share of streams whose motion and size change read back as asked (:mod:`vgen.eval.motion`).
2. **switches**: for each of ``--modes`` (``StreamConfig.switch``), the ``--streams`` switch pairs
   (:func:`~vgen.data.moving_scenes.switch_pairs`: a new shape in a new colour, all else kept), each one stream of
   ``--frames`` frames switched once at ``--switch-frame`` to its own new prompt (``--batch-size`` streams drawn
   together); every mode draws the same noise, so the frames before the switch are the same. The share switched
   within 8 frames, the median latency, the cut spike and the flicker from 8 frames after the switch, beside the
   spikes of ``--real`` real moving-scene clips of as many frames (at the switch frame, and the largest of each
   clip) for reference.
3. **drift**: ``--long-streams`` streams of ``--long-frames`` frames; the share of right frames in each of 10
   chunks, and the first chunk's lead over the worst.
4. **speed**: one stream of ``--long-frames`` frames on ``--threads`` threads, switched every ``--speed-every``
   frames in the first mode: frames per second, block latency (the largest is a switch's), re-cache time and
   resident memory after the first and the last block (:class:`~vgen.samplers.streaming.StreamProfile`).

``--cfg-scale`` and ``--steps`` override the model's stream defaults for every part. A class-conditional stream is
measured the same way on classes: class ``i mod C`` for stream ``i``, switched to the next class, each frame read
by the shipped domain classifier. Writes ``--out`` (JSON) and the markdown table beside it (``.md``), and prints
the table.

    python benchmarks/t2v_stream.py --model shapes-t2v-stream --streams 200 --threads 2 \\
        --out docs/results/t2v_stream.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from tqdm.auto import tqdm

import vgen
from vgen.data import moving_scenes
from vgen.data.clips import SPLIT_SEEDS, ClipsConfig, render_clips
from vgen.data.moving_scenes import (
    ATTRIBUTE_VALUES,
    MovingScenesConfig,
    evaluation_prompts,
    render_moving_scenes,
    switch_pairs,
)
from vgen.eval.classifier import load_scene_judge, load_shapes_classifier
from vgen.eval.features import classifier_input
from vgen.eval.motion import motion_of
from vgen.eval.switching import (
    BASELINE_FRAMES,
    JUDGED,
    SPIKE_FRAMES,
    SWITCH_WINDOW,
    attribute_values,
    chunk_accuracy,
    cut_spike,
    frame_hits,
    judge_frames,
    largest_spike,
    measure_switch,
    switch_summary,
)
from vgen.hub import from_pretrained
from vgen.pipelines import StreamPipeline
from vgen.samplers.streaming import SWITCH_MODES, StreamProfile

CHUNKS = 10


class Task(NamedTuple):
    """What the streams are asked for and how their frames are read: one target per stream (a prompt, or a class
    id), the values the judge should read for it [N, A] (``names`` order), the judge (uint8 frames [..., S, S, 3]
    -> readings [..., A]), and for prompts each one's attributes by name (whose motion is read back too)."""

    targets: list
    wanted: np.ndarray
    names: tuple[str, ...]
    judge: Callable[[np.ndarray], np.ndarray]
    value_names: Sequence[str]  # the first judged attribute's values, named (for the figures by value)
    attributes: list[dict] | None = None

    def head(self, count: int) -> Task:
        """The first ``count`` streams' task."""
        return self._replace(targets=self.targets[:count], wanted=self.wanted[:count],
                             attributes=None if self.attributes is None else self.attributes[:count])


def tasks(pipe: StreamPipeline, count: int, seed: int, judge_dir: str | None) -> tuple[Task, Task, Task]:
    """The fidelity task, and a switch's before and after, for ``count`` streams."""
    if pipe.is_text:
        judge = from_pretrained(judge_dir) if judge_dir else load_scene_judge()

        def read(frames: np.ndarray) -> np.ndarray:
            return judge_frames(judge, frames, JUDGED)

        def task(items: Sequence[tuple[str, dict]]) -> Task:
            return Task([p for p, _ in items], np.stack([attribute_values(a) for _, a in items]), JUDGED, read,
                        ATTRIBUTE_VALUES[JUDGED[0]], [a for _, a in items])

        pairs = switch_pairs(count, seed=seed)
        return task(evaluation_prompts(count, seed=seed)), task([a for a, _ in pairs]), task([b for _, b in pairs])
    n, classifier = pipe.num_classes, load_shapes_classifier()
    first, second = [i % n for i in range(count)], [(i + 1) % n for i in range(count)]

    def read_class(frames: np.ndarray) -> np.ndarray:  # the shipped domain classifier's class of each frame
        flat = np.asarray(frames).reshape(-1, *frames.shape[-3:])
        return classifier.predict(classifier_input(flat, classifier)).numpy().reshape(*frames.shape[:-3], 1)

    def class_task(ids: list[int]) -> Task:
        return Task(ids, np.array(ids, np.int64)[:, None], ("class",), read_class, pipe.info.class_names)

    return class_task(first), class_task(first), class_task(second)


def request(pipe: StreamPipeline, targets: Sequence) -> dict:
    """The stream_blocks arguments asking for ``targets``."""
    return {"prompt": list(targets)} if pipe.is_text else {"class_ids": list(targets)}


def judged_hits(pipe: StreamPipeline, task: Task, num_frames: int, batch_size: int, seed: int, desc: str,
                keep: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-frame hits [N, T] of the task's streams, drawn ``batch_size`` at a time (seed + first index), each block
    judged as it comes, and with ``keep`` the streams' frames [N, T, S, S, 3] (else None: long streams are never
    held whole)."""
    hits = np.zeros((len(task.targets), num_frames), bool)
    videos = []
    with tqdm(total=len(task.targets) * num_frames, desc=desc, unit="frame") as bar:
        for start in range(0, len(task.targets), batch_size):
            rows, blocks = slice(start, start + batch_size), []
            for block in pipe.stream_blocks(num_frames=num_frames, seed=seed + start, batch_size=batch_size,
                                            **request(pipe, task.targets[rows])):
                frames = slice(block.start_frame, block.start_frame + block.frames.shape[1])
                hits[rows, frames] = frame_hits(task.judge(block.frames), task.wanted[rows, None])
                bar.update(block.frames.shape[0] * block.frames.shape[1])
                blocks += [block.frames] if keep else []
            videos += [np.concatenate(blocks, axis=1)] if keep else []
    return hits, np.concatenate(videos) if keep else None


def fidelity_figures(pipe: StreamPipeline, task: Task, args: argparse.Namespace) -> dict:
    """The share of right frames (all, by the first judged attribute's value, per stream) of short streams, and
    for prompts the share whose motion and size change read back as asked (:mod:`vgen.eval.motion`, the object
    found by the prompt's colour)."""
    hits, videos = judged_hits(pipe, task, args.fidelity_frames, args.batch_size, args.seed, "fidelity", keep=True)
    first = task.wanted[:, 0]
    figures = {"streams": len(task.targets), "frames": args.fidelity_frames, "frame_accuracy": float(hits.mean()),
               f"by_{task.names[0]}": {task.value_names[v]: float(hits[first == v].mean()) for v in np.unique(first)},
               "per_stream": hits.mean(1).tolist()}
    if task.attributes is not None:
        reads = [motion_of(v, a["colour"]) for v, a in zip(videos, task.attributes)]
        figures.update({"object_found": float(np.mean([m is not None for m, _ in reads])),
                        "motion_accuracy": float(np.mean([m == a["motion"] for (m, _), a in
                                                          zip(reads, task.attributes)])),
                        "growth_accuracy": float(np.mean([g == a["growth"] for (_, g), a in
                                                          zip(reads, task.attributes)]))})
    return figures


def switched_streams(pipe: StreamPipeline, first: Sequence, second: Sequence, num_frames: int, switch_frame: int,
                     seed: int, mode: str) -> np.ndarray:
    """Streams of ``first`` (one target each) switched each to its ``second`` at ``switch_frame`` in ``mode``,
    drawn together: uint8 [N, T, S, S, 3]."""
    blocks = pipe.stream_blocks(num_frames=num_frames, seed=seed, switches={switch_frame: list(second)}, switch=mode,
                                batch_size=len(first), **request(pipe, first))
    return np.concatenate([b.frames for b in blocks], axis=1)


def switch_figures(pipe: StreamPipeline, before: Task, after: Task, args: argparse.Namespace) -> dict:
    """Each mode's :func:`switch_summary` over the switch pairs (with every stream's latency), and the share of
    streams whose frames before the switch are the same in every mode (1.0: the modes are compared pairwise).
    ``--batch-size`` streams are drawn at once (seed + first index), each switching to its own target."""
    modes, first_frames, same = {}, [], []
    count = len(before.targets)
    for mode in args.modes:
        records = []
        with tqdm(total=count, desc=f"switch ({mode})", unit="stream") as bar:
            for start in range(0, count, args.batch_size):
                rows = slice(start, start + args.batch_size)
                videos = switched_streams(pipe, before.targets[rows], after.targets[rows], args.frames,
                                          args.switch_frame, args.seed + start, mode)
                if mode == args.modes[0]:
                    first_frames.extend(videos[:, :args.switch_frame])
                else:
                    same.extend(np.array_equal(first_frames[start + i], v[:args.switch_frame])
                                for i, v in enumerate(videos))
                records.extend(measure_switch(after.judge(v), v, after.wanted[start + i], args.switch_frame)
                               for i, v in enumerate(videos))
                bar.update(len(videos))
        modes[mode] = {**switch_summary(records), "latencies": [r["latency"] for r in records]}
    return {"modes": modes, "paired_before_switch": float(np.mean(same)) if same else None}


def real_spikes(pipe: StreamPipeline, count: int, num_frames: int, switch_frame: int) -> dict:
    """Cut spikes of real clips of the model's data (moving scenes for a text model, moving shapes for a class
    model) at the switch frame, and the largest of each clip."""
    frames = max(num_frames, BASELINE_FRAMES + SPIKE_FRAMES + 1)  # a whole window at least
    size = pipe.info.image_size
    if pipe.is_text:
        clips = render_moving_scenes(moving_scenes.SPLIT_SEEDS["val"], 0, count,
                                     MovingScenesConfig(num_frames=frames, frame_size=size))[0]
    else:
        data = pipe.info.data or {"frame_size": size}
        clips = render_clips(SPLIT_SEEDS["val"], 0, count, ClipsConfig(**{**data, "num_frames": frames}))[0]
    at_switch = [cut_spike(c, switch_frame) for c in clips]
    largest = [largest_spike(c) for c in clips]
    return {"clips": count, "frames": frames, "mean_spike_at_switch": float(np.mean(at_switch)),
            "mean_largest_spike": float(np.mean(largest)), "max_largest_spike": float(np.max(largest))}


def speed(pipe: StreamPipeline, task: Task, args: argparse.Namespace) -> dict:
    """One stream's speed and memory (switched every ``--speed-every`` frames in the first mode)."""
    profile, recache = StreamProfile(pipe.frames_per_block), []
    every = args.speed_every
    targets = task.targets
    switches = {f: targets[(f // every) % len(targets)] for f in range(every, args.long_frames, every)} if every else {}
    for block in pipe.stream_blocks(num_frames=args.long_frames, seed=args.seed, switches=switches,
                                    switch=args.modes[0], batch_size=1, progress=True, **request(pipe, targets[:1])):
        profile.add(block)
        if block.switched:
            recache.append(block.recache_s)
    report = profile.report()
    latencies = report.pop("per_block_latency_s")
    return {**report, "max_block_latency_s": max(latencies), "switches": len(switches), "mode": args.modes[0],
            "mean_recache_ms": 1000 * float(np.mean(recache)) if recache else None}


def number_or_dash(x: float | None, form: str) -> str:
    return "-" if x is None else format(x, form)


def markdown(record: dict) -> str:
    """The record as a short report: a line for fidelity, a table of the switch modes, a line each for drift and
    speed."""
    settings = "".join(f", {k} {v}" for k, v in record.get("settings", {}).items())
    lines = [f"{record['model']}{settings}: streams judged per frame on {', '.join(record['judged'])}.", ""]
    if "fidelity" in record:
        f = record["fidelity"]
        motion = (f"; the motion reads as asked in {f['motion_accuracy']:.1%} of the streams, the size change in "
                  f"{f['growth_accuracy']:.1%} (object found by its colour in {f['object_found']:.1%})"
                  if "motion_accuracy" in f else "")
        lines += [f"- fidelity: {f['frame_accuracy']:.1%} of the frames of {f['streams']} {f['frames']}-frame "
                  f"streams show what they ask for{motion}.", ""]
    if "switch" in record:
        s, real = record["switch"], record["switch"]["real"]
        lines += [f"Switch at frame {s['switch_frame']} of {s['frames']} ({s['streams']} streams); success: frames t "
                  f"and t+1 right with t + 1 < s + {SWITCH_WINDOW}; spike: the largest frame change of the 4 frames "
                  f"from s over the median of the 8 before (real clips: {real['mean_spike_at_switch']:.2f} at s, "
                  f"largest {real['mean_largest_spike']:.2f} on average, {real['max_largest_spike']:.2f} at most); "
                  f"flicker from s + {SWITCH_WINDOW}. Streams whose frames before the switch are equal in every mode: "
                  f"{number_or_dash(s['paired_before_switch'], '.0%')}.", "",
                  "| mode | switched within 8 | never | median latency | mean spike | label flicker | pixel flicker |",
                  "|---|---|---|---|---|---|---|"]
        for mode, m in s["modes"].items():
            lines.append(f"| {mode} | {m['within_window']:.1%} | {m['never']:.1%} | "
                         f"{number_or_dash(m['median_latency'], '.1f')} | {m['mean_spike']:.2f} | "
                         f"{number_or_dash(m['label_flicker'], '.3f')} | {number_or_dash(m['pixel_flicker'], '.2f')} |")
        lines.append("")
    if "drift" in record:
        d = record["drift"]
        chunks = " ".join(f"{a:.1%}" for a in d["per_chunk"])
        lines += [f"- drift over {d['frames']} frames ({d['streams']} streams): per chunk {chunks}; first chunk "
                  f"minus the worst: {100 * d['first_minus_worst']:.1f} points.", ""]
    if "speed" in record:
        p = record["speed"]
        mem = p["resident_memory_mb"]
        lines += [f"- speed: {p['fps']:.1f} fps on {record['threads']} threads over {p['frames']} frames with "
                  f"{p['switches']} switches ({p['mode']}, re-cache {number_or_dash(p['mean_recache_ms'], '.0f')} "
                  f"ms); block latency mean {1000 * p['block_latency_s']['mean']:.0f} ms, max "
                  f"{1000 * p['max_block_latency_s']:.0f} ms; memory {mem['first_block']:.0f} -> "
                  f"{mem['last_block']:.0f} MiB (first -> last block)."]
    return "\n".join(lines) + "\n"


PARTS = ("fidelity", "switch", "drift", "speed")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="shapes-t2v-stream", help="a streaming pipeline folder or shipped name")
    p.add_argument("--streams", type=int, default=200, help="streams of the fidelity and switch figures")
    p.add_argument("--fidelity-frames", type=int, default=16, help="frames of a fidelity stream")
    p.add_argument("--frames", type=int, default=48, help="frames of a switched stream")
    p.add_argument("--switch-frame", type=int, default=16, help="the switch's frame (a block's first)")
    p.add_argument("--modes", default=",".join(SWITCH_MODES), help="switch modes, comma-separated")
    p.add_argument("--long-streams", type=int, default=200)
    p.add_argument("--long-frames", type=int, default=600)
    p.add_argument("--speed-every", type=int, default=80, help="frames between the speed stream's switches (0: none)")
    p.add_argument("--real", type=int, default=64, help="real clips for the reference spikes")
    p.add_argument("--parts", default=",".join(PARTS), help=f"figures to measure, comma-separated of {PARTS}")
    p.add_argument("--batch-size", type=int, default=16, help="streams drawn at once (fidelity, switch, drift)")
    p.add_argument("--judge", default=None, help="a scene judge folder (default: the shipped shapes-scene-judge)")
    p.add_argument("--cfg-scale", type=float, default=None, help="stream at this CFG scale (default: the model's)")
    p.add_argument("--steps", type=int, default=None, help="denoising steps a block (default: the model's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default="t2v_stream.json", help="the JSON record; the table goes beside it (.md)")
    args = p.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    args.parts = [m for m in args.parts.split(",") if m]
    if not args.modes or set(args.modes) - set(SWITCH_MODES):
        p.error(f"--modes must name some of {', '.join(SWITCH_MODES)}, got {','.join(args.modes)!r}")
    if not args.parts or set(args.parts) - set(PARTS):
        p.error(f"--parts must name some of {', '.join(PARTS)}, got {','.join(args.parts)!r}")
    for name in ("streams", "frames", "long_streams", "long_frames", "real", "batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not 2 <= args.switch_frame < args.frames:
        p.error(f"--switch-frame must be in [2, --frames), got {args.switch_frame} of {args.frames}")
    if args.fidelity_frames < 3:
        p.error(f"--fidelity-frames must be >= 3 (a motion is read from 3 frames), got {args.fidelity_frames}")
    if args.long_frames < CHUNKS:
        p.error(f"--long-frames must be >= {CHUNKS} (one frame a chunk), got {args.long_frames}")
    if args.speed_every < 0:
        p.error(f"--speed-every must be >= 0, got {args.speed_every}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    pipe = vgen.load(args.model)
    overrides = {k: v for k, v in (("cfg_scale", args.cfg_scale), ("steps", args.steps)) if v is not None}
    pipe.info.defaults = {**pipe.info.defaults, **overrides}  # every stream below draws with these settings
    if args.switch_frame % pipe.frames_per_block:
        print(f"t2v_stream: --switch-frame {args.switch_frame} is not a block's first frame ({args.model} makes "
              f"blocks of {pipe.frames_per_block} frames)", file=sys.stderr)
        return 2
    out = Path(args.out)
    fidelity, before, after = tasks(pipe, max(args.streams, args.long_streams), args.seed, args.judge)
    record: dict = {"model": args.model, "threads": torch.get_num_threads(), "judged": list(fidelity.names),
                    "seed": args.seed, **({"settings": overrides} if overrides else {})}
    if "fidelity" in args.parts:
        record["fidelity"] = fidelity_figures(pipe, fidelity.head(args.streams), args)
    if "switch" in args.parts:
        record["switch"] = {"streams": args.streams, "frames": args.frames, "switch_frame": args.switch_frame,
                            **switch_figures(pipe, before.head(args.streams), after.head(args.streams), args),
                            "real": real_spikes(pipe, args.real, args.frames, args.switch_frame)}
    if "drift" in args.parts:
        hits, _ = judged_hits(pipe, fidelity.head(args.long_streams), args.long_frames, args.batch_size, args.seed,
                              "drift")
        per_chunk = chunk_accuracy(hits, CHUNKS)
        record["drift"] = {"streams": args.long_streams, "frames": args.long_frames, "per_chunk": per_chunk,
                           "first_minus_worst": per_chunk[0] - min(per_chunk)}
    if "speed" in args.parts:
        record["speed"] = speed(pipe, fidelity, args)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1))
    table = markdown(record)
    out.with_suffix(".md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
