"""fp32 matrix products on this CPU through MKL (``F.linear``) and through oneDNN, over the number of rows.

vgen's linear layer (:mod:`vgen.models.linear`) sends fp32 inference products to oneDNN, with the weight packed
once into oneDNN's layout, where ``VGEN_CPU_MATMUL`` says so (``auto``: on AMD CPUs). This script shows why: for
each weight shape of the embedded default (``shapes-c2i``: dim 256, SwiGLU hidden 704, vocabulary 4,096) and each
row count (a decode step of batch 1 with CFG is 2 rows, a 16-position verify pass 32), the median time of one
product through each library (the same weight again and again, so it stays in cache: in a model's pass the weights
come from memory) and the GFLOP/s it reaches, on one thread unless ``--threads`` says otherwise.

    python benchmarks/cpu_matmul.py --threads 1 --json matmul.json --markdown matmul.md
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from vgen.models.linear import cpu_vendor, linear_onednn

SHAPES = ((256, 768), (256, 256), (256, 704), (704, 256), (256, 4096))  # (in, out): wqkv, wo, w1 and w3, w2, output
ROWS = (1, 2, 4, 8, 16, 32, 64)


def median_seconds(fn, repeats: int) -> float:
    for _ in range(min(20, repeats)):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(repeats: int, shapes=SHAPES, row_counts=ROWS) -> list[dict]:
    """Per (shape, rows): each library's median time and GFLOP/s, and the largest difference of their results."""
    results = []
    for k, n in shapes:
        weight = torch.randn(n, k)
        for rows in row_counts:
            x = torch.randn(rows, k)
            through_mkl = functools.partial(F.linear, x, weight)
            through_onednn = functools.partial(linear_onednn, x, weight, None)
            mkl, onednn = median_seconds(through_mkl, repeats), median_seconds(through_onednn, repeats)
            flop = 2 * rows * k * n
            results.append({"in": k, "out": n, "rows": rows, "mkl_us": mkl * 1e6, "onednn_us": onednn * 1e6,
                            "mkl_gflops": flop / mkl / 1e9, "onednn_gflops": flop / onednn / 1e9,
                            "onednn_speedup": mkl / onednn,
                            "max_abs_diff": (through_mkl() - through_onednn()).abs().max().item()})
    return results


def markdown(results: list[dict], setup: str) -> str:
    shapes = list(dict.fromkeys((r["in"], r["out"]) for r in results))
    row_counts = list(dict.fromkeys(r["rows"] for r in results))
    lines = [setup, "", "| weight (in x out) | " + " | ".join(f"{r} rows" for r in row_counts) + " |",
             "|---|" + "---|" * len(row_counts)]
    for k, n in shapes:
        cells = [f"{r['mkl_us']:.0f} / {r['onednn_us']:.0f} us ({r['onednn_speedup']:.2f}x)"
                 for r in results if (r["in"], r["out"]) == (k, n)]
        lines.append(f"| {k} x {n} | " + " | ".join(cells) + " |")
    best = max(results, key=lambda r: r["onednn_gflops"])
    lines += ["", f"MKL / oneDNN per product, oneDNN's speed-up in brackets. Peak: MKL "
                  f"{max(r['mkl_gflops'] for r in results):.0f} GFLOP/s, oneDNN {best['onednn_gflops']:.0f} GFLOP/s "
                  f"({best['rows']} rows, {best['in']} x {best['out']}). The two results differ by at most "
                  f"{max(r['max_abs_diff'] for r in results):.1e} (rounding)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None)
    args = ap.parse_args()
    if not torch.backends.mkldnn.is_available():
        raise SystemExit("this torch build has no oneDNN: nothing to compare")
    torch.set_num_threads(args.threads)
    results = measure(args.repeats)
    setup = (f"fp32, {args.threads} thread(s), CPU vendor {cpu_vendor() or 'unknown'}, torch {torch.__version__}, "
             f"median of {args.repeats}")
    table = markdown(results, setup)
    print(table)
    if args.json:
        args.json.write_text(json.dumps({"setup": setup, "results": results}, indent=1))
    if args.markdown:
        args.markdown.write_text(table)


if __name__ == "__main__":
    main()
