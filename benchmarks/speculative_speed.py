"""Speed x quality of the speculative samplers against vanilla AR (``vgen bench``'s table), plus the price of a
speculative window: the cost curve of a k-token forward.

The sampler table is :mod:`vgen.eval.bench` (the same images for every sampler; step compression, latency ratio,
tokens per forward, domain FID and class accuracy against vanilla AR from the same run). This script adds the time
of one ``decode_rows`` of k tokens over a half-full cache divided by the time of a 1-token one, which bounds what
step compression can buy: latency ratio <= step compression / cost(window).

    python benchmarks/speculative_speed.py --num-images 64 --batch-size 1 --threads 2 \
        --samplers ar sjd lantern gsd --json speed.json --markdown speed.md
    python benchmarks/speculative_speed.py --device cuda --dtype bf16 --num-images 16   # on a GPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import vgen
from vgen.apps.options import DTYPES
from vgen.eval.bench import (
    bench_table,
    parse_sampler_list,
    real_reference,
    run_bench,
    setup_line,
    with_reference,
)
from vgen.pipelines import default_sampler
from vgen.samplers import SamplingParams
from vgen.samplers.options import merge_settings
from vgen.samplers.speculative.tree import TreeShape


@torch.no_grad()
def window_cost(model, window: int | TreeShape, batch: int, repeats: int = 20) -> float:
    """Median over interleaved pairs of (time of a forward over ``window`` / time of a 1-token forward), both at
    slot N/2 of a cache of ``batch`` rows (CFG rows included); interleaving cancels drifts in machine load. ``window``
    is a number of tokens in a line, or a draft tree (a :class:`TreeShape`: one forward over its nodes, each seeing
    its ancestors). On a GPU each forward is timed to its end (synchronised)."""
    device = next(model.parameters()).device
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    tree = window if isinstance(window, TreeShape) else None
    size = window.size if tree is not None else window
    cache = model.new_cache(batch, extra=size)
    start = torch.full((batch,), model.num_tokens // 2, device=device)

    def timed(k: int, shape: TreeShape | None = None) -> float:
        tokens = torch.zeros(batch, k, dtype=torch.long, device=device)
        sync()
        t = time.perf_counter()
        model.decode_rows(tokens, start, cache, **({} if shape is None else {"tree": shape}))
        sync()
        return time.perf_counter() - t

    timed(1), timed(size, tree)  # warm-up
    return statistics.median(timed(size, tree) / timed(1) for _ in range(repeats))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="shapes-c2i")
    ap.add_argument("--samplers", nargs="+", default=["ar,sjd,lantern,gsd"],
                    help="as in `vgen bench`: names, or label=name:key=value,...")
    ap.add_argument("--num-images", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--cfg-scale", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--real", default=None, help="real images or stats (default: rendered validation images)")
    ap.add_argument("--num-real", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu", help="e.g. cuda (the Triton kernels run there when triton imports)")
    ap.add_argument("--dtype", default="fp32", choices=sorted(DTYPES), help="backbone dtype")
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed batches drawn with every sampler first (on a GPU: loads CUDA's libraries and "
                         "compiles the Triton kernels); default 1 on CUDA, 0 elsewhere")
    ap.add_argument("--windows", type=int, nargs="*", default=[1, 2, 4, 8, 12, 16, 24, 32])
    ap.add_argument("--cost-repeats", type=int, default=20, help="timed forwards per window size (median)")
    ap.add_argument("--cost-only", action="store_true", help="measure the k-token forward cost curve and stop")
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    specs = parse_sampler_list(args.samplers)
    pipe = vgen.load(args.model, device=args.device, dtype=getattr(torch, DTYPES[args.dtype]))
    params = SamplingParams(**merge_settings(pipe.info.defaults, {"cfg_scale": args.cfg_scale}))
    rows = 2 * args.batch_size if params.guided else args.batch_size
    costs = {k: window_cost(pipe.model, k, rows, args.cost_repeats) for k in args.windows}
    print("k-token forward cost (x 1-token):", {k: round(v, 2) for k, v in costs.items()})
    if args.cost_only:
        return
    warmup = args.warmup if args.warmup is not None else int(pipe.device.type == "cuda")
    for spec in with_reference(specs, default_sampler(pipe.model))[0] if warmup else []:
        for k in range(warmup):  # a batch of the timed size: Triton specialises kernels on sizes and strides
            pipe([(k + i) % pipe.num_classes for i in range(args.batch_size)], sampler=spec.sampler(), seed=k,
                 **params.to_dict())
    result = run_bench(pipe, specs, args.num_images, args.seed, args.batch_size, params,
                       real_reference(pipe, args.real, args.num_real), progress=True)
    result["setup"]["window_cost"] = costs
    table = f"{setup_line(result)}\n\n{bench_table(result)}"
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.markdown:
        cost_line = ", ".join(f"k={k}: {v:.2f}x" for k, v in costs.items())
        Path(args.markdown).write_text(f"{table}\n\nk-token forward cost vs 1 token ({rows} rows): {cost_line}\n")


if __name__ == "__main__":
    main()
