"""How close vanilla AR's batch-1 decode step comes to the machine's memory bandwidth, in fp32 and bf16.

A decode step reads every weight once and the KV cache up to its length; at batch 1 (2 rows with CFG) that is
nearly all it does, so its speed limit is bytes read / memory bandwidth. This script measures the machine's copy
bandwidth (a large buffer copied, bytes read + written over time), then for each model and dtype the median time
of a 1-token ``decode`` at the middle of the image (cache half full, cropped back after every step), and reports
the bandwidth each step achieves and its share of the copy bandwidth. Models: the embedded default
(``shapes-c2i``, its shipped weights) and LlamaGen's GPT-B (random weights, 256 image tokens). It also samples the
embedded default greedily in fp32 and in bf16 and counts the tokens on which they agree: where bf16 changes them.

    python benchmarks/decode_bandwidth.py --threads 2 --json bandwidth.json --markdown bandwidth.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import vgen
from vgen.models.llamagen import LlamaGenGPT, gpt_config

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def copy_bandwidth(megabytes: int = 512, repeats: int = 10) -> float:
    """Bytes per second of ``dst.copy_(src)`` on ``megabytes`` of float32 (read + write counted), median."""
    src = torch.ones(megabytes * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return 2 * src.numel() * 4 / statistics.median(times)


def model_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@torch.no_grad()
def decode_step(model: LlamaGenGPT, rows: int, repeats: int) -> tuple[float, int]:
    """Median seconds of a 1-token decode for ``rows`` rows at slot N/2, and the KV bytes that step reads."""
    cache = model.new_cache(rows)
    model.prefill(torch.zeros(rows, dtype=torch.long), cache)
    half = model.config.block_size // 2
    model.decode(torch.zeros(rows, half, dtype=torch.long), cache)
    length = cache.length
    token = torch.zeros(rows, 1, dtype=torch.long)
    times = []
    for _ in range(repeats + 2):
        start = time.perf_counter()
        model.decode(token, cache)
        times.append(time.perf_counter() - start)
        cache.crop(length)
    c = model.config
    kv = 2 * c.n_layer * rows * c.kv_heads * (length + 1) * c.head_dim * cache.buffers()[0].element_size()
    return statistics.median(times[2:]), kv


def greedy_agreement(num_images: int) -> float:
    """Share of tokens the embedded default draws alike in fp32 and bf16 under greedy decoding."""
    tokens = {}
    for name, dtype in DTYPES.items():
        pipe = vgen.load("shapes-c2i", dtype=dtype)
        out = pipe(list(range(num_images)), sampler="ar", temperature=0.0, seed=0)
        tokens[name] = out.tokens
    return float((tokens["fp32"] == tokens["bf16"]).float().mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rows", type=int, default=2, help="rows a step runs: 2 = batch 1 with CFG")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--agreement-images", type=int, default=8)
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    copy_bps = copy_bandwidth()
    models = {"shapes-c2i": lambda: vgen.load("shapes-c2i").model,
              "GPT-B (random)": lambda: LlamaGenGPT(gpt_config("GPT-B", vocab_size=16384, block_size=256)).eval()}
    rows = []
    for name, build in models.items():
        for dtype_name, dtype in DTYPES.items():
            model = build().to(dtype)
            step_s, kv = decode_step(model, args.rows, args.repeats)
            weights = model_bytes(model)
            rows.append({"model": name, "dtype": dtype_name, "step_ms": 1e3 * step_s, "weight_mb": weights / 1e6,
                         "kv_mb": kv / 1e6, "achieved_gbps": (weights + kv) / step_s / 1e9,
                         "share_of_copy": (weights + kv) / step_s / copy_bps})
            print(rows[-1])
    agreement = greedy_agreement(args.agreement_images)
    result = {"threads": torch.get_num_threads(), "rows": args.rows, "copy_gbps": copy_bps / 1e9, "steps": rows,
              "greedy_bf16_agreement": agreement, "agreement_images": args.agreement_images}
    table = markdown(result)
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(table)


def markdown(result: dict) -> str:
    lines = [f"{result['threads']} thread(s), {result['rows']} rows a step (batch 1 with CFG), cache half full; "
             f"copy bandwidth {result['copy_gbps']:.1f} GB/s (read + write)", "",
             "| model | dtype | decode step (ms) | weights (MB) | KV read (MB) | achieved (GB/s) | of copy bandwidth |",
             "|---|---|---|---|---|---|---|"]
    for r in result["steps"]:
        lines.append(f"| {r['model']} | {r['dtype']} | {r['step_ms']:.2f} | {r['weight_mb']:.1f} | {r['kv_mb']:.2f} "
                     f"| {r['achieved_gbps']:.1f} | {r['share_of_copy']:.0%} |")
    lines += ["", f"Greedy tokens of the embedded default equal in fp32 and bf16: "
                  f"{result['greedy_bf16_agreement']:.1%} ({result['agreement_images']} images)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
