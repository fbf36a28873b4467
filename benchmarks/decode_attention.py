"""A decode step's attention on a CPU: ``scaled_dot_product_attention`` against two fp32 products and a softmax.

Times one attention call of the embedded default's shape (2 rows: batch 1 with CFG; 8 heads of 32) over a cache
of ``--keys`` keys, for 1 query (an AR decode step) and 16 (a speculative window), in fp32 and bf16, eagerly and
inside a compiled function (dynamic shapes, as ``ar``'s compiled step), each the median of ``--repeats`` calls. The
products are :func:`vgen.models.llamagen.single_query_attention`, whose arithmetic serves 16 queries as well.

    python benchmarks/decode_attention.py --threads 1 --json attention.json --markdown attention.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from vgen.models.llamagen import single_query_attention

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v)


def time_call(fn, args: tuple, repeats: int) -> float:
    """Median microseconds of ``fn(*args)`` after a warm-up (which compiles a compiled ``fn``)."""
    for _ in range(10):
        fn(*args)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def measure(keys: int, queries: int, dtype: torch.dtype, repeats: int, rows: int = 2, heads: int = 8,
            head_dim: int = 32) -> dict:
    """Microseconds of the kernel and of the products, eager and compiled, for one shape."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(rows, heads, queries, head_dim, generator=g).to(dtype)
    k, v = (torch.randn(rows, heads, keys, head_dim, generator=g).to(dtype) for _ in range(2))
    out = {"queries": queries, "keys": keys, "dtype": str(dtype).removeprefix("torch.")}
    for name, fn in (("kernel", kernel), ("products", single_query_attention)):
        out[f"{name}_eager_us"] = time_call(fn, (q, k, v), repeats)
        out[f"{name}_compiled_us"] = time_call(torch.compile(fn, dynamic=True, fullgraph=True), (q, k, v), repeats)
    return out


def markdown(result: dict) -> str:
    lines = [f"{result['threads']} thread(s), {result['rows']} rows x 8 heads of 32, {result['keys']} keys, median "
             f"of {result['repeats']} calls (us)", "",
             "| queries | dtype | kernel, eager | products, eager | kernel, compiled | products, compiled |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['queries']} | {r['dtype']} | {r['kernel_eager_us']:.1f} | {r['products_eager_us']:.1f} "
              f"| {r['kernel_compiled_us']:.1f} | {r['products_compiled_us']:.1f} |" for r in result["shapes"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=272, help="cached keys (the embedded default's whole image: 272)")
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = [measure(args.keys, queries, dtype, args.repeats) for queries in (1, 16) for dtype in DTYPES.values()]
    result = {"threads": torch.get_num_threads(), "rows": 2, "keys": args.keys, "repeats": args.repeats,
              "torch": torch.__version__, "shapes": shapes}
    table = markdown(result)
    print(table)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.markdown:
        args.markdown.write_text(table)


if __name__ == "__main__":
    main()
