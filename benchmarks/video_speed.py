"""Video generation speed: NBP (row or frame blocks) and NAR (next-neighbour) pipelines against next-token AR of the
same size over the same clips' tokens, in one run.

The NBP and NAR rows run the video pipelines given. The next-token row is a
LlamaGen GPT with the first pipeline's width, depth, heads and vocabulary over the same tokens flattened in raster
order (frames x rows x columns), sampled by ``ARSampler`` with its KV cache. ``--num-frames`` longer than the
pipelines' window draws their clips window by window (``VideoPipeline.sample_clip_tokens``; NBP only), and the
next-token GPT then covers all the frames at once. Its weights are random: vgen trains
no next-token video model, so that row measures speed only and has no quality column. Every method samples the
same classes (in turn) with the same batch, CFG scale and filters; the clock covers token generation (decoding
the tokens to frames is the same work for every row and is left out); repeats are interleaved so background load
hits them alike, and the table reports medians. The class accuracy beside each trained row is the per-frame domain
classifier's (``vgen.eval.quality.clip_class_accuracy``) on the clips the timed runs produced; ``vgen quality``
gives it on more clips.

    vgen train package --gpt <nbp run>/export --vq <frame vq> --out runs/pipe-video-nbp --cfg-scale 3.0
    python benchmarks/video_speed.py --models runs/pipe-video-nbp --batch 8 --repeats 3 --threads 1
    python benchmarks/video_speed.py --models shapes-video-nbp --num-frames 16 --batch 1 --repeats 3 --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

import vgen
from vgen.eval.quality import clip_class_accuracy
from vgen.models.llamagen import GPTConfig, LlamaGenGPT
from vgen.samplers import ARSampler, SamplingParams
from vgen.samplers.options import merge_settings

AR_ROW = "next-token AR (random weights)"


def next_token_twin(model: torch.nn.Module, frames: int) -> LlamaGenGPT:
    """A LlamaGen GPT of ``model``'s size over ``frames`` frames of its grid (random weights, non-zero output layer):
    ``GPTConfig(frames=frames)`` (3-D RoPE over frames of square grids, ``vgen train ar --video``'s model)."""
    c = model.config
    tokens = frames * model.grid[1] * model.grid[2]
    torch.manual_seed(0)
    try:
        config = GPTConfig(vocab_size=c.vocab_size, dim=c.dim, n_layer=len(model.layers), n_head=c.n_head,
                           n_kv_head=c.n_kv_head, multiple_of=c.multiple_of, ffn_dim_multiplier=c.ffn_dim_multiplier,
                           num_classes=c.num_classes, block_size=tokens, class_dropout_prob=0.0,
                           token_dropout_p=0.0, resid_dropout_p=0.0, ffn_dropout_p=0.0, frames=frames)
    except ValueError as e:
        raise SystemExit(f"no next-token twin for the grid {model.grid}: {e}; use --no-ar") from None
    twin = LlamaGenGPT(config)
    torch.nn.init.normal_(twin.output.weight, std=0.02)
    return twin.eval()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", required=True,
                   help="video pipelines (folders, or embedded names) of one token grid")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--num-frames", type=int, default=None,
                   help="frames per clip (default: the pipelines' window; longer clips window by window)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cfg-scale", type=float, default=None, help="default: the first model's recommended scale")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-ar", action="store_true", help="leave out the next-token row (it takes the longest)")
    p.add_argument("--out", default=None, help="folder for video_speed.json and video_speed.md")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pipes = {model: vgen.load(model) for model in args.models}  # rows named as given
    first = next(iter(pipes.values()))
    grids = {name: tuple(pipe.model.grid) for name, pipe in pipes.items()}
    if len(set(grids.values())) != 1 or len(first.model.grid) != 3:
        raise SystemExit(f"the models must be video pipelines of one token grid, got {grids}")
    for pipe in pipes.values():
        pipe.model.float()
    recommended = {k: v for k, v in first.info.defaults.items() if k == "cfg_scale"}  # the guidance alone
    params = SamplingParams(**merge_settings(recommended, {"cfg_scale": args.cfg_scale}))
    classes = [i % first.num_classes for i in range(args.batch)]
    num_frames = args.num_frames or first.num_frames
    ar = None if args.no_ar else next_token_twin(first.model, num_frames)
    rows_in = [*pipes, *([AR_ROW] if ar is not None else [])]
    cond = torch.tensor(classes)

    def tokens(name: str, seed: int) -> tuple[int, torch.Tensor]:
        if name == AR_ROW:
            out = ARSampler().sample(ar, cond, params, generator=torch.Generator().manual_seed(seed))
            return out.stats.forward_passes, out.tokens
        pipe = pipes[name]
        drawn, _, stats = pipe.sample_clip_tokens(classes, num_frames=num_frames, seed=seed, **params.to_dict())
        return stats.forward_passes, drawn

    for name in rows_in:
        tokens(name, 10_000)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in rows_in}
    passes: dict[str, int] = {}
    clips: dict[str, list[np.ndarray]] = {name: [] for name in pipes}
    for r in range(args.repeats):
        for name in rows_in:
            start = time.perf_counter()
            passes[name], drawn = tokens(name, r)
            times[name].append(time.perf_counter() - start)  # token generation only: decoding is the same for all
            if name in pipes:
                clips[name].append(np.stack(pipes[name].decode(drawn)))
    frames = args.batch * num_frames
    rows = {}
    for name in rows_in:
        wall = statistics.median(times[name])
        rows[name] = {"forward_passes": passes[name], "wall_s": wall, "frames_per_second": frames / wall,
                      "wall_runs_s": times[name]}
        if name in clips:
            rows[name]["class_accuracy"] = clip_class_accuracy(
                np.concatenate(clips[name]), classes * args.repeats)["class_accuracy"]
    if ar is not None:
        for row in rows.values():
            row["pass_ratio_vs_ar"] = rows[AR_ROW]["forward_passes"] / row["forward_passes"]
            row["speedup_vs_ar"] = rows[AR_ROW]["wall_s"] / row["wall_s"]
    report = {"grid": list(first.model.grid), "frames": num_frames,
              "tokens": num_frames * first.model.grid[1] * first.model.grid[2], "batch": args.batch,
              "repeats": args.repeats, "sampling": params.to_dict(), "threads": torch.get_num_threads(),
              "rows": rows}
    table = ["| model | forward passes | wall s (median) | frames/s | x fewer passes | x faster | class acc. |",
             "|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        acc = f"{row['class_accuracy']:.1%} of {args.batch * args.repeats}" if "class_accuracy" in row else "-"
        table.append(f"| {name} | {row['forward_passes']} | {row['wall_s']:.2f} | {row['frames_per_second']:.1f} | "
                     f"{row.get('pass_ratio_vs_ar', 1):.1f} | {row.get('speedup_vs_ar', 1):.2f} | {acc} |")
    text = "\n".join(table)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "video_speed.json").write_text(json.dumps(report, indent=1))
        (out / "video_speed.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
