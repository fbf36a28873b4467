"""Where continuous speculative decoding spends its time, and the speed-up its acceptance allows.

Runs target-only sampling (at the head's step count and at fewer steps) and CSpD configurations (draft model x
draft head-chain steps x inner temperature) on the same classes and seeds, timing inside each run every call of
the target's and the draft's trunk and head chain; the wall time those calls leave over is the sampler's own
work ("other"). For CSpD, "parts allow" is the latency ratio against target-only sampling with that work removed,
and "free draft allows" the ratio with the draft's calls removed too: the bound for any draft of that acceptance.
The median gap is how far the draft's final means sit from the target's in units of the target's final std
(exact acceptance needs it well below 1).

    python benchmarks/cspd_costs.py --threads 1 --num-images 2 --json costs.json --markdown costs.md
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import statistics
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

import vgen
from vgen.samplers import ContinuousARSampler, CSpD, SamplingParams


class PartTimer:
    """Wraps a model's trunk calls (prefill, decode, decode_rows) and its head's reverse chain so that a sampler
    run records the seconds and calls of each; what a run's wall time leaves over is the sampler's own work."""

    TRUNK = ("prefill", "decode", "decode_rows")

    def __init__(self, models: dict[str, torch.nn.Module]) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        for role, model in models.items():
            for name in self.TRUNK:
                setattr(model, name, self._timed(getattr(model, name), f"{role} trunk"))
            model.head.sample = self._timed(model.head.sample, f"{role} head")

    def _timed(self, fn, part: str):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            self.seconds[part] = self.seconds.get(part, 0.0) + time.perf_counter() - start
            self.calls[part] = self.calls.get(part, 0) + 1
            return out
        return timed

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def run_row(label: str, stats: list, timer: PartTimer, token_s: float | None) -> dict:
    """One run's wall time split into parts, its tokens per target round and the latency ratio the parts alone
    allow (bookkeeping removed) and a free draft allows (drafting removed too), against ``token_s``, the seconds
    target-only sampling spends in the model per token of one image."""
    wall = sum(st.wall_time_s for st in stats)
    row = {"run": label, "wall_s": wall, "parts_s": dict(timer.seconds), "calls": dict(timer.calls),
           "other_s": wall - sum(timer.seconds.values())}
    if token_s is not None:
        lengths = [g for st in stats for g in st.accepted_lengths]
        target = sum(v for k, v in timer.seconds.items() if k.startswith("target"))
        draft = sum(v for k, v in timer.seconds.items() if k.startswith("draft"))
        model_time = token_s * sum(st.tokens for st in stats)
        row.update(tokens_per_round=statistics.mean(lengths), parts_ratio=model_time / (target + draft),
                   free_draft_ratio=model_time / target,
                   median_gap_in_target_stds=statistics.median(
                       st.details["median_draft_gap_in_target_stds"] for st in stats))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="shapes-c2i-continuous")
    ap.add_argument("--num-images", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--draft-length", type=int, default=4)
    ap.add_argument("--drafts", nargs="+", default=["shipped", "self"], choices=["shipped", "self"],
                    help="the pipeline's draft model, or a copy of the target (the closest draft there is)")
    ap.add_argument("--draft-steps", type=int, nargs="+", default=[100, 10])
    ap.add_argument("--inner-temperatures", type=float, nargs="+", default=[1.0, 42.0])
    ap.add_argument("--head-steps", type=int, nargs="*", default=[25, 10],
                    help="target-only sampling with fewer head steps, for comparison")
    ap.add_argument("--cspd-head-steps", type=int, nargs="+", default=[0],
                    help="the target's head steps inside CSpD (0 = the model's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pipe = vgen.load(args.model)
    target, k = pipe.model, args.draft_length
    params = SamplingParams(cfg_scale=pipe.info.defaults.get("cfg_scale", 1.0))
    drafts = {"shipped": pipe.draft_head, "self": copy.deepcopy(target)}
    timer = PartTimer({"target": target, **{f"draft {name}": drafts[name] for name in args.drafts}})
    classes = [i % pipe.num_classes for i in range(args.num_images)]

    def run(sampler, draft=None) -> list:
        """The stats of each batch, seeded alike for every sampler, with the timer counting this run only."""
        timer.reset()
        stats = []
        for i in tqdm(range(0, len(classes), args.batch_size), desc=sampler.name, leave=False):
            cond = pipe.condition(classes[i:i + args.batch_size], None, None, None, None)[0]
            generator = torch.Generator().manual_seed(args.seed + i)
            stats.append(sampler.sample(target, cond, params, generator=generator, draft_head=draft).stats)
        return stats

    model_steps = len(target.head.sampling_schedule())
    bases = {}  # head steps (0 = the model's) -> target-only run, seconds per token in the model
    runs = []
    for head in dict.fromkeys([0, *args.head_steps, *args.cspd_head_steps]):
        stats = run(ContinuousARSampler(head_steps=head))
        bases[head] = run_row(f"continuous-ar{f' head_steps={head}' if head else ''}", stats, timer, None), \
            sum(timer.seconds.values()) / (len(classes) * target.num_tokens)
        runs.append(bases[head][0])
    for head, name, steps, tau in itertools.product(args.cspd_head_steps, args.drafts, args.draft_steps,
                                                    args.inner_temperatures):
        if steps > (head or model_steps):
            continue
        sampler = CSpD(draft_length=k, inner_temperature=tau, draft_steps=steps, head_steps=head)
        label = f"cspd{f' head_steps={head}' if head else ''} draft={name} draft_steps={steps} tau={tau:g}"
        row = run_row(label, run(sampler, drafts[name]), timer, bases[head][1])
        row["same_steps_ratio"] = bases[head][0]["wall_s"] / row["wall_s"]
        runs.append(row)
        print(row)
    for row in runs:
        row["latency_ratio"] = bases[0][0]["wall_s"] / row["wall_s"]
    result = {"setup": {"model": args.model, "threads": torch.get_num_threads(), "batch_size": args.batch_size,
                        "num_images": args.num_images, "draft_length": k, "cfg_scale": params.cfg_scale,
                        "target_steps": model_steps,
                        "target_ms_per_token": 1e3 * bases[0][1]}, "runs": runs}
    table = markdown(result)
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(table)


def markdown(result: dict) -> str:
    """The runs as one table: wall time, its split into parts (ms per call), the rest, and the ratios."""
    setup, runs = result["setup"], result["runs"]
    parts = sorted({p for r in runs for p in r["parts_s"]}, key=lambda p: (not p.startswith("target"), p))
    lines = [f"{setup['model']}, batch {setup['batch_size']}, {setup['num_images']} images, "
             f"{setup['threads']} thread(s), CFG {setup['cfg_scale']:g}, draft length {setup['draft_length']}, "
             f"target head {setup['target_steps']} steps; target-only spends "
             f"{setup['target_ms_per_token']:.1f} ms per token in the model", "",
             "| run | wall (s) | " + " | ".join(f"{p} (s; ms/call)" for p in parts)
             + " | other (s) | latency ratio | vs target-only, same head steps | tokens / round | parts allow "
               "| free draft allows | median gap (target stds) |", "|---|---|" + "---|" * (len(parts) + 7)]
    for r in runs:
        cells = [f"{r['parts_s'][p]:.1f}; {1e3 * r['parts_s'][p] / r['calls'][p]:.1f}" if p in r["parts_s"]
                 else "-" for p in parts]
        extra = (f"{r['tokens_per_round']:.2f} | {r['parts_ratio']:.2f}x | {r['free_draft_ratio']:.2f}x | "
                 f"{r['median_gap_in_target_stds']:.2g}") if "tokens_per_round" in r else "- | - | - | -"
        lines.append(f"| {r['run']} | {r['wall_s']:.1f} | " + " | ".join(cells)
                     + f" | {r['other_s']:.1f} | {r['latency_ratio']:.2f}x | "
                     + (f"{r['same_steps_ratio']:.2f}x" if "same_steps_ratio" in r else "-") + f" | {extra} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
