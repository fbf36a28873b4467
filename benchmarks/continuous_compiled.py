"""Continuous-token sampling compiled against eager: the decode step and the diffusion head's chain under
``torch.compile`` (the samplers' ``compile`` option).

For each sampler (``vgen bench`` specs; by default the target alone at the head's 100 steps and at 10, and the
reference's loose CSpD at 10) it runs eager and compiled on the same classes and seeds: the first call (which
compiles), the median of ``--repeats`` calls after it, the speed-up, and how far the compiled tokens sit from the
eager ones of the same seed (the largest gap, in unit-scale token space, and the share of tokens within 1e-3).
Then the head chain alone (batch 1 with guidance, the pipeline's defaults), compiled with each
``--steps-per-call`` steps a graph call: what :data:`vgen.models.diffusion_head.STEPS_PER_CALL` trades.

    python benchmarks/continuous_compiled.py --threads 1 --batch-sizes 1 8 --out continuous_compiled
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import vgen
from vgen.eval.bench import SamplerSpec, parse_sampler_list
from vgen.models import diffusion_head
from vgen.models.diffusion_head import reverse_steps
from vgen.samplers import SamplingParams, get_sampler
from vgen.samplers.compiling import compile_step
from vgen.samplers.options import merge_settings

DEFAULT_SAMPLERS = ["continuous-ar", "steps10=continuous-ar:head_steps=10",
                    "loose10=cspd:head_steps=10,draft_steps=10,inner_temperature=42"]


def run_spec(pipe, spec: SamplerSpec, compile: bool, classes: torch.Tensor, params: SamplingParams, seed: int):
    sampler = get_sampler(spec.name, compile=compile, **spec.options)
    start = time.perf_counter()
    out = sampler.sample(pipe.model, classes, params, generator=torch.Generator().manual_seed(seed),
                         draft_head=pipe.draft_head)
    return time.perf_counter() - start, out


def bench_batch(pipe, batch: int, params: SamplingParams, specs: list[SamplerSpec], repeats: int) -> list[dict]:
    """Eager and compiled runs of every spec at one batch size, interleaved."""
    classes = torch.arange(batch) % pipe.num_classes
    runs = [(spec, compile) for spec in specs for compile in (False, True)]
    first = [run_spec(pipe, spec, compile, classes, params, 0)[0] for spec, compile in runs]
    seconds: list[list[float]] = [[] for _ in runs]
    tokens: list[list[torch.Tensor]] = [[] for _ in runs]
    passes: list[list[int]] = [[] for _ in runs]
    for r in range(1, repeats + 1):
        for i, (spec, compile) in enumerate(runs):
            s, out = run_spec(pipe, spec, compile, classes, params, r)
            seconds[i].append(s)
            tokens[i].append(out.tokens)
            passes[i].append(out.stats.forward_passes)
    rows = []
    for i, (spec, compile) in enumerate(runs):
        eager = i - 1 if compile else i
        gaps = torch.cat([(a - b).abs().amax(-1).flatten() for a, b in zip(tokens[i], tokens[eager])])
        rows.append({"sampler": spec.label, "compiled": compile, "first_call_s": first[i],
                     "median_s": statistics.median(seconds[i]), "seconds": seconds[i],
                     "forward_passes": statistics.mean(passes[i]), "max_token_gap_to_eager": float(gaps.max()),
                     "share_within_1e-3_of_eager": float((gaps <= 1e-3).float().mean())})
    for row in rows:
        eager_row = next(r for r in rows if r["sampler"] == row["sampler"] and not r["compiled"])
        row["speedup"] = eager_row["median_s"] / row["median_s"]
        row["vs_reference"] = rows[0]["median_s"] / row["median_s"]
    return rows


def chain_timings(pipe, params: SamplingParams, steps_per_call: list[int], repeats: int = 20) -> list[dict]:
    """The head's chain alone for one guided row (or one plain row), eager and compiled per steps a call."""
    head = pipe.model.head
    guided = params.guided
    z = torch.randn(2 if guided else 1, pipe.model.config.dim, generator=torch.Generator().manual_seed(0))
    count = head.cfg.num_sampling_steps
    noise = torch.randn(count + 1, 1, pipe.model.token_channels, generator=torch.Generator().manual_seed(1))
    out = []
    default = diffusion_head.STEPS_PER_CALL
    try:
        for per_call in [0, *steps_per_call]:  # 0: eager
            diffusion_head.STEPS_PER_CALL = per_call or default
            steps = compile_step(reverse_steps, "default", ("chain", per_call)) if per_call else reverse_steps
            with torch.no_grad():
                start = time.perf_counter()
                head.sample(z, noise, params.temperature, params.cfg_scale, guided=guided, steps=steps)
                first = time.perf_counter() - start
                times = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    head.sample(z, noise, params.temperature, params.cfg_scale, guided=guided, steps=steps)
                    times.append(time.perf_counter() - start)
            out.append({"steps_per_call": per_call or None, "first_call_s": first,
                        "median_ms": statistics.median(times) * 1e3})
    finally:
        diffusion_head.STEPS_PER_CALL = default
    return out


def table(rows: list[dict]) -> str:
    lines = ["| sampler | compiled | first call s | median s | speed-up over eager | vs the first row, eager | "
             "forward passes | largest token gap to eager | tokens within 1e-3 of eager |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['sampler']} | {'yes' if r['compiled'] else 'no'} | {r['first_call_s']:.1f} | "
                     f"{r['median_s']:.3f} | {r['speedup']:.2f}x | {r['vs_reference']:.2f}x | "
                     f"{r['forward_passes']:.1f} | {r['max_token_gap_to_eager']:.1e} | "
                     f"{100 * r['share_within_1e-3_of_eager']:.1f}% |")
    return "\n".join(lines)


def chain_table(rows: list[dict], steps: int) -> str:
    lines = [f"The head chain alone ({steps} steps, one row):", "",
             "| steps a graph call | first call s | median ms |", "|---|---|---|"]
    for r in rows:
        label = "eager" if r["steps_per_call"] is None else str(r["steps_per_call"])
        lines.append(f"| {label} | {r['first_call_s']:.1f} | {r['median_ms']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="shapes-c2i-continuous")
    ap.add_argument("--samplers", nargs="+", default=DEFAULT_SAMPLERS, metavar="SPEC",
                    help="vgen bench specs of continuous samplers (the first is the reference row)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps-per-call", type=int, nargs="*", default=[1, 5, 25])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, required=True, help="folder for continuous_compiled.{json,md}")
    args = ap.parse_args()
    specs = parse_sampler_list(args.samplers)
    if any(spec.seed is not None or spec.sampling for spec in specs):
        ap.error("--samplers: every run draws the same seeds and sampling settings; give sampler options only")
    if args.threads:
        torch.set_num_threads(args.threads)
    pipe = vgen.load(args.model)
    params = SamplingParams(**merge_settings(pipe.info.defaults, {}))
    setup = f"{args.model}, {params.to_dict()}, cpu, {torch.get_num_threads()} thread(s), torch {torch.__version__}, " \
            f"median of {args.repeats} after a first call"
    sections, results = [], {"setup": setup, "batches": {}}
    for batch in args.batch_sizes:
        rows = bench_batch(pipe, batch, params, specs, args.repeats)
        results["batches"][batch] = rows
        sections.append(f"{setup}, batch {batch}\n\n{table(rows)}")
        print(sections[-1] + "\n", flush=True)
    if args.steps_per_call:
        chain = chain_timings(pipe, params, args.steps_per_call)
        results["chain"] = chain
        sections.append(chain_table(chain, pipe.model.head.cfg.num_sampling_steps))
        print(sections[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "continuous_compiled.json").write_text(json.dumps(results, indent=1))
    (args.out / "continuous_compiled.md").write_text("\n\n".join(sections) + "\n")


if __name__ == "__main__":
    main()
