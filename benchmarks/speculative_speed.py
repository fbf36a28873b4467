"""Speed x quality of the speculative samplers against vanilla AR, in one run on one model.

For every sampler the same images are asked for (classes in turn, the same seeds, the same batch size), and
the table reports, relative to vanilla AR from the same run:

- step compression = AR's target forward passes / the sampler's;
- latency ratio = AR's wall time / the sampler's;
- class accuracy of the domain classifier on the decoded images (quality), and the mean tokens per pass.

It also measures the cost curve of a k-token forward (the window's price): the time of one ``decode_rows`` of
k tokens over a half-full cache divided by the time of a 1-token one, which bounds what step compression can
buy: latency ratio <= step compression / cost(window).

    python benchmarks/speculative_speed.py --num-images 64 --batch-size 1 --threads 2 \
        --samplers ar sjd lantern gsd --json docs/speculative_speed.json --markdown docs/speculative_speed.md
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
from vgen.eval.classifier import load_shapes_classifier
from vgen.eval.quality import class_accuracy
from vgen.samplers import get_sampler


def parse_sampler(spec: str) -> tuple[str, str, dict]:
    """``name``, ``name:key=value,...`` or ``label=name:key=value,...`` (e.g. ``sjd8=sjd:window=8``)."""
    label, sep, rest = spec.partition("=")
    if not sep or ":" in label:
        label, rest = spec, spec
    name, _, opts = rest.partition(":")
    options = {}
    for item in filter(None, opts.split(",")):
        key, _, value = item.partition("=")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return label, name, options


@torch.no_grad()
def window_cost(model, window: int, batch: int, repeats: int = 20) -> float:
    """Median over interleaved pairs of (time of a ``window``-token forward / time of a 1-token forward), both at
    slot N/2 of a cache of ``batch`` rows (CFG rows included); interleaving cancels drifts in machine load."""
    cache = model.new_cache(batch, extra=window)
    start = torch.full((batch,), model.num_tokens // 2)

    def timed(k: int) -> float:
        tokens = torch.zeros(batch, k, dtype=torch.long)
        t = time.perf_counter()
        model.decode_rows(tokens, start, cache)
        return time.perf_counter() - t

    timed(1), timed(window)  # warm-up
    return statistics.median(timed(window) / timed(1) for _ in range(repeats))


def run_sampler(pipe, name: str, options: dict, class_ids: list[int], batch_size: int, seed: int,
                cfg_scale: float | None) -> dict:
    sampler = get_sampler(name, **options)
    passes, wall, images, lengths, drafter = 0, 0.0, [], [], None
    for i in range(0, len(class_ids), batch_size):
        chunk = class_ids[i:i + batch_size]
        out = pipe(chunk, sampler=sampler, seed=seed + i, cfg_scale=cfg_scale)
        passes += out.stats.forward_passes
        wall += out.stats.wall_time_s
        images.append(torch.stack([torch.from_numpy(np.array(im)) for im in out.images]))
        lengths += out.stats.accepted_lengths
        drafter = out.stats.details.get("drafter", drafter)
    pixels = torch.cat(images).permute(0, 3, 1, 2).float() / 127.5 - 1
    acc = class_accuracy(load_shapes_classifier(), pixels, class_ids)["class_accuracy"]
    return {"forward_passes": passes, "wall_time_s": wall, "class_accuracy": acc, "drafter": drafter,
            "tokens_per_forward": len(class_ids) * pipe.model.num_tokens / (passes * batch_size),
            "mean_accepted_length": statistics.mean(lengths) if lengths else 1.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="shapes-c2i")
    ap.add_argument("--samplers", nargs="+", default=["ar", "sjd", "lantern", "gsd"],
                    help="names, or label=name:key=value,... (the first must be vanilla AR)")
    ap.add_argument("--num-images", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--cfg-scale", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--windows", type=int, nargs="*", default=[1, 2, 4, 8, 12, 16, 24, 32])
    ap.add_argument("--cost-repeats", type=int, default=20, help="timed forwards per window size (median)")
    ap.add_argument("--cost-only", action="store_true", help="measure the k-token forward cost curve and stop")
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pipe = vgen.load(args.model)
    rows = 2 * args.batch_size if (args.cfg_scale or pipe.info.defaults.get("cfg_scale", 1)) > 1 else args.batch_size
    costs = {k: window_cost(pipe.model, k, rows, args.cost_repeats) for k in args.windows}
    print("k-token forward cost (x 1-token):", {k: round(v, 2) for k, v in costs.items()})
    if args.cost_only:
        return
    class_ids = [i % pipe.num_classes for i in range(args.num_images)]
    specs = [parse_sampler(s) for s in args.samplers]
    results = {}
    for label, name, options in specs:
        results[label] = {"sampler": name, "options": options,
                          **run_sampler(pipe, name, options, class_ids, args.batch_size, args.seed, args.cfg_scale)}
        print(label, json.dumps({k: v for k, v in results[label].items() if k != "options"}))
    base = results[specs[0][0]]
    lines = ["| sampler | drafter | tokens / pass | step compression | latency ratio | class accuracy |",
             "|---|---|---|---|---|---|"]
    for label, r in results.items():
        r["step_compression"] = base["forward_passes"] / r["forward_passes"]
        r["latency_ratio"] = base["wall_time_s"] / r["wall_time_s"]
        lines.append(f"| {label} | {r['drafter'] or '-'} | {r['tokens_per_forward']:.2f} | "
                     f"{r['step_compression']:.2f}x | {r['latency_ratio']:.2f}x | {100 * r['class_accuracy']:.1f}% |")
    table = "\n".join(lines)
    print(table)
    setup = {"model": args.model, "num_images": args.num_images, "batch_size": args.batch_size,
             "cfg_scale": args.cfg_scale, "seed": args.seed, "threads": torch.get_num_threads(),
             "window_cost": costs}
    if args.json:
        Path(args.json).write_text(json.dumps({"setup": setup, "results": results}, indent=1))
    if args.markdown:
        cost_line = ", ".join(f"k={k}: {v:.2f}x" for k, v in costs.items())
        Path(args.markdown).write_text(f"{table}\n\nk-token forward cost vs 1 token ({rows} rows): {cost_line}\n")


if __name__ == "__main__":
    main()
