"""Long-video streaming: speed, memory and quality of block-diffusion streaming, for several cache / schedule
settings in one run on the same model and seeds.

For every setting (``label=key:value,...`` over :class:`vgen.samplers.streaming.StreamConfig`):

- **speed and memory**: one video of ``--frames`` frames streamed alone (batch 1, as ``vgen stream`` runs),
  with its frames per second, per-block latency and resident memory after every block (first, last, peak);
- **quality**: ``--videos`` videos (classes in turn) of ``--frames`` frames streamed as one batch; the domain
  classifier's accuracy on every frame, per-chunk clarity and subject probability and their drift (VDE, linear
  and log weights, 10 chunks), the share of videos that collapse into texture (``vgen.eval.drift``), and FVD in
  vgen's domain video features of 16-frame windows against real validation clips: the first window
  (short-horizon quality) and every window (all of the stream). The FVD between two real sets of the same sizes
  is printed as the noise floor.

Writes ``streaming.json``, ``streaming.md``, ``streaming.png`` (per-chunk measures and memory per block) and a GIF
of the first setting's videos into ``--out``.

    python benchmarks/streaming.py --model shapes-blockdiff --frames 80 --videos 8 --real 256 --threads 2 \
        --settings default "4-steps=steps:4" --data-dir runs/stream-real64 --out docs/results/streaming
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

import vgen
from vgen.data.clips import ClipsConfig, cached_clips
from vgen.eval.drift import drift_report, windows
from vgen.eval.evaluate import EvalSettings, frechet_report
from vgen.images import image_grid
from vgen.pipelines import tile_clips
from vgen.samplers.streaming import StreamProfile
from vgen.video_io import write_video
from vgen.visualize import line_plot

DEFAULT_SETTINGS = ["default", "no-sink=sink_frames:0,window_frames:14", "recompute=refresh:recompute",
                    "sparse=window_frames:10,retrieved_blocks:1,bank_blocks:8", "2-steps=steps:2,first_steps:4",
                    "cfg-2=cfg_scale:2.0"]
WINDOW = 16


def parse_setting(spec: str) -> tuple[str, dict]:
    """``label`` or ``label=key:value,key:value`` -> (label, options) with numbers parsed."""
    label, _, rest = spec.partition("=")
    options = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition(":")
        try:
            options[key] = int(value)
        except ValueError:
            try:
                options[key] = float(value)
            except ValueError:
                options[key] = value
    return label, options


def fvd(real: np.ndarray, fake: np.ndarray) -> float:
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fewer clips than feature dimensions: reported in the table's caption
        np.save(Path(tmp) / "real.npy", real)
        np.save(Path(tmp) / "fake.npy", fake)
        return frechet_report(Path(tmp) / "real.npy", Path(tmp) / "fake.npy",
                              EvalSettings(media="videos", num_frames=WINDOW), kid_subsets=10,
                              kid_subset_size=min(len(real), len(fake), 100))["fvd"]


def measure(pipe, options: dict, args: argparse.Namespace, real: np.ndarray) -> dict:
    profile = StreamProfile(pipe.frames_per_block)
    for block in pipe.stream_blocks([0], args.frames, seed=args.seed, **options):
        profile.add(block)
    speed = profile.report()
    class_ids = [i % pipe.num_classes for i in range(args.videos)]
    videos = pipe(class_ids, args.frames, seed=args.seed, progress=True, **options).videos
    drift = drift_report(videos, class_ids, chunks=10)
    all_windows = windows(videos, WINDOW)
    return {"options": options, "speed": {k: v for k, v in speed.items() if k != "per_block_latency_s"},
            "memory_per_block_mb": profile.memory_mb, "drift": drift,
            "class_accuracy": float(np.mean(drift["accuracy"]["per_chunk"])),
            "fvd_first_window": fvd(real[:len(videos)], videos[:, :WINDOW]),
            "fvd_all_windows": fvd(real[:len(all_windows)], all_windows),
            "windows": len(all_windows)}, videos


def markdown(results: dict, floor: dict, args: argparse.Namespace, trained: int) -> str:
    lines = [f"Streaming {args.frames} frames ({args.frames // trained}x the {trained} trained frames); speed from "
             f"one stream (batch 1), quality from {args.videos} videos; FVD in vgen's domain video features on "
             f"{WINDOW}-frame windows against real validation clips (noise floor between two real sets: first "
             f"window {floor['first']:.1f}, all windows {floor['all']:.1f}).", "",
             "| setting | fps | ms / block (p95) | memory first -> last block (MB) | class acc | collapsed | "
             "clarity VDE | subject VDE | FVD first window | FVD all windows |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for label, r in results.items():
        s, d = r["speed"], r["drift"]
        mem = s["resident_memory_mb"]
        lines.append(f"| {label} | {s['fps']:.1f} | {s['block_latency_s']['mean'] * 1000:.0f} "
                     f"({s['block_latency_s']['p95'] * 1000:.0f}) | {mem['first_block']:.0f} -> "
                     f"{mem['last_block']:.0f} | {r['class_accuracy']:.1%} | {d['collapsed']:.0%} | "
                     f"{d['clarity']['vde_linear']:.2f} | "
                     f"{d['subject']['vde_linear']:.2f} | {r['fvd_first_window']:.1f} | {r['fvd_all_windows']:.1f} |")
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    """Per-chunk subject, clarity and texture frames and the memory after each block, one line per setting, side
    by side."""
    panels = [line_plot({k: r["drift"]["subject"]["per_chunk"] for k, r in results.items()}, "chunk (of 10)",
                        "P(requested class)", "subject per chunk"),
              line_plot({k: r["drift"]["clarity"]["per_chunk"] for k, r in results.items()}, "chunk (of 10)",
                        "mean |Laplacian|", "clarity per chunk"),
              line_plot({k: r["drift"]["texture"]["per_chunk"] for k, r in results.items()}, "chunk (of 10)",
                        "share of frames", "texture frames per chunk"),
              line_plot({k: r["memory_per_block_mb"] for k, r in results.items()}, "block", "MiB",
                        "resident memory after each block")]
    image_grid(panels, len(panels)).save(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="shapes-blockdiff")
    p.add_argument("--settings", nargs="+", default=DEFAULT_SETTINGS, metavar="SPEC")
    p.add_argument("--frames", type=int, default=160)
    p.add_argument("--videos", type=int, default=16)
    p.add_argument("--real", type=int, default=512, help="real validation clips for FVD")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--data-dir", default=str(Path(tempfile.gettempdir()) / "vgen-clips"))
    p.add_argument("--out", default="docs/results/streaming")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    pipe = vgen.load(args.model)
    trained = pipe.model.config.train_frames
    # real clips of WINDOW frames, drawn like the ones the model learnt from where the pipeline records them
    clips = (ClipsConfig(**{**pipe.info.data, "num_frames": WINDOW}) if pipe.info.data
             else ClipsConfig(num_frames=WINDOW, frame_size=pipe.info.image_size))
    real, _ = cached_clips(args.data_dir, "val", 2 * args.real, clips)
    real = np.asarray(real)
    n_all = args.videos * (args.frames // WINDOW)
    floor = {"first": fvd(real[:args.videos], real[args.real:args.real + args.videos]),
             "all": fvd(real[:n_all], real[args.real:args.real + n_all])}
    results, first_videos = {}, None
    for spec in args.settings:
        label, options = parse_setting(spec)
        print(f"== {label} {options}", file=sys.stderr)
        results[label], videos = measure(pipe, options, args, real[:args.real])
        first_videos = videos if first_videos is None else first_videos
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"model": args.model, "frames": args.frames, "videos": args.videos, "trained_frames": trained,
              "threads": torch.get_num_threads(), "fvd_noise_floor": floor, "settings": results}
    (out / "streaming.json").write_text(json.dumps(record, indent=1))
    table = markdown(results, floor, args, trained)
    (out / "streaming.md").write_text(table)
    plot(results, out / "streaming.png")
    write_video(tile_clips(first_videos[:8], 4), out / "stream.gif", fps=8)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
