"""Speculative samplers against vanilla AR, eager and compiled, with LlamaGen's generate() beside them, in one run.

Every method draws the same classes with the same weights (the embedded default's, or ``--model``), batch by batch
size, repeats interleaved so that machine load hits them alike; medians are reported, each method's first
call (its compilation) apart, and beside the ratio of medians the ratio paired by round (each repeat against
compiled AR's repeat of the same round: median and range), which load drifting between rounds moves less.
Rows: LlamaGen's ``generate()`` eager and compiled as its ``sample_c2i.py --compile`` does (with
``--llamagen-repo``, a local clone of FoundationVision/LlamaGen), vgen's ``ar`` eager and compiled, and each
speculative sampler eager and compiled. Columns: forward passes, step compression and latency
ratio against **compiled** AR (and eager AR), the cost of one pass against one AR step in the same run (the
verify cost c(k) with drafting and bookkeeping included), and the k-token forward alone against a 1-token one
(:func:`speculative_speed.window_cost`, eager). The setup line carries the token statistics of AR's images (mean
entropy, median top-1), on which step compression depends.

    python benchmarks/compiled_speed.py --batch-sizes 1 8 --threads 1 --llamagen-repo path/to/LlamaGen \
        --out docs/results/speed/compiled_fp32_t1
    python benchmarks/compiled_speed.py --device cuda --dtype bf16 --out out/   # CUDA graphs (reduce-overhead)
    python benchmarks/compiled_speed.py --gpt-model GPT-B --tokens 256 --device cuda --dtype bf16 --out out/

``--gpt-model`` times a LlamaGen size with random weights (and a random codebook for LANTERN's neighbours): its
per-pass costs carry over to real weights, its step compression does not.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from ar_speed import build_config, llamagen_method, random_model
from PIL import Image
from speculative_speed import window_cost

import vgen
from vgen.eval.bench import SamplerSpec, parse_sampler_list
from vgen.eval.quality import token_statistics
from vgen.images import image_grid
from vgen.models.llamagen import GPT_SIZES
from vgen.samplers import SamplingParams, get_sampler
from vgen.samplers.options import merge_settings
from vgen.visualize import scatter_plot

SPECULATIVE = ("sjd", "mcsjd", "lantern", "gsd")
AR, AR_COMPILED = "ar", "ar, compiled"
LLAMAGEN, LLAMAGEN_COMPILED = "LlamaGen generate()", "LlamaGen generate(), compiled"
Method = Callable[[int], tuple[torch.Tensor, int]]  # seed -> tokens [B, N], forward passes


class RandomCodebook(torch.nn.Module):
    """A tokenizer stand-in for a random model: only the codebook LANTERN's neighbourhoods are built from."""

    def __init__(self, vocab_size: int, dim: int = 8) -> None:
        super().__init__()
        self.vectors = torch.randn(vocab_size, dim, generator=torch.Generator().manual_seed(0))

    def codebook(self) -> torch.Tensor:
        return self.vectors


class RandomPipeline:
    """What the timing needs of a pipeline, for a LlamaGen size with random weights."""

    def __init__(self, size: str, tokens: int, dtype: torch.dtype, device: str) -> None:
        self.model = random_model(build_config(argparse.Namespace(gpt_model=size, tokens=tokens)), dtype, device)
        self.tokenizer = RandomCodebook(self.model.vocab_size)
        self.device, self.num_classes = torch.device(device), self.model.num_classes


def vgen_method(pipe, spec: SamplerSpec, compile: bool | str, classes: torch.Tensor,
                params: SamplingParams) -> Method:
    sampler = get_sampler(spec.name, compile=compile, **spec.options)

    def run(seed: int) -> tuple[torch.Tensor, int]:
        generator = torch.Generator(pipe.device).manual_seed(seed)
        out = sampler.sample(pipe.model, classes, params, generator=generator, tokenizer=pipe.tokenizer,
                             draft_head=getattr(pipe, "draft_head", None))
        return out.tokens, out.stats.forward_passes

    return run


def llamagen(repo: Path, pipe, classes: torch.Tensor, params: SamplingParams, compile: bool) -> Method:
    run = llamagen_method(repo, pipe.model, classes, params, argparse.Namespace(device=pipe.device.type), compile)
    return lambda seed: (run(seed), pipe.model.num_tokens)


def timed(method: Method, seed: int, cuda: bool) -> tuple[float, torch.Tensor, int]:
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    tokens, passes = method(seed)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start, tokens, passes


def bench_batch(pipe, batch: int, params: SamplingParams, samplers: list[SamplerSpec], repeats: int,
                repo: Path | None, mode: str) -> dict:
    """Every method at one batch size: first-call and median seconds, forward passes, tokens."""
    classes = torch.arange(batch, device=pipe.device) % pipe.num_classes
    methods: dict[str, Method] = {}
    if repo is not None:
        methods[LLAMAGEN] = llamagen(repo, pipe, classes, params, False)
        methods[LLAMAGEN_COMPILED] = llamagen(repo, pipe, classes, params, True)
    ar = SamplerSpec("ar", "ar")
    methods[AR] = vgen_method(pipe, ar, False, classes, params)
    methods[AR_COMPILED] = vgen_method(pipe, ar, mode, classes, params)
    for spec in samplers:
        methods[spec.label] = vgen_method(pipe, spec, False, classes, params)
        methods[f"{spec.label}, compiled"] = vgen_method(pipe, spec, mode, classes, params)
    cuda = pipe.device.type == "cuda"
    first = {name: timed(method, 0, cuda)[0] for name, method in methods.items()}  # compiles
    seconds: dict[str, list[float]] = {name: [] for name in methods}
    passes: dict[str, list[int]] = {name: [] for name in methods}
    ar_tokens = []
    for r in range(1, repeats + 1):
        for name, method in methods.items():
            s, tokens, p = timed(method, r, cuda)
            seconds[name].append(s)
            passes[name].append(p)
            if name == AR:
                ar_tokens.append(tokens)
    stats = token_statistics(pipe.model, torch.cat(ar_tokens), classes.repeat(repeats), params)
    rows = {name: {"first_call_s": first[name], "median_s": statistics.median(seconds[name]),
                   "seconds": seconds[name], "forward_passes": statistics.mean(passes[name])} for name in methods}
    n = pipe.model.num_tokens
    for name, row in rows.items():
        row["tokens_per_s"] = batch * n / row["median_s"]
        row["step_compression"] = n / row["forward_passes"]
        row["vs_compiled_ar"] = rows[AR_COMPILED]["median_s"] / row["median_s"]
        row["vs_compiled_ar_paired"] = paired_ratios(rows[AR_COMPILED]["seconds"], row["seconds"])
        row["vs_eager_ar"] = rows[AR]["median_s"] / row["median_s"]
        ar_step = rows[AR_COMPILED if "compiled" in name else AR]["median_s"] / n
        row["pass_cost"] = row["median_s"] / row["forward_passes"] / ar_step
    guided_rows = 2 * batch if params.guided else batch
    cost = window_cost(pipe.model, samplers[0].sampler().window, guided_rows) if samplers else None
    return {"batch": batch, "rows": rows, "token_statistics": stats, "window_cost_eager": cost}


def paired_ratios(reference: list[float], seconds: list[float]) -> dict[str, float]:
    """The ratio ``reference / seconds`` repeat by repeat (the two ran in the same round, under the same load):
    median, lowest and highest. Steadier than the ratio of medians when the machine's load drifts between rounds."""
    ratios = [a / b for a, b in zip(reference, seconds, strict=True)]
    return {"median": statistics.median(ratios), "low": min(ratios), "high": max(ratios)}


def profile_passes(pipe, spec: SamplerSpec, mode: str, params: SamplingParams, top: int = 10) -> dict:
    """Where one compiled batch-1 run of the sampler ``spec`` spends a pass (after a first call that compiles): the
    ``top`` ops by self CPU time, in ms and calls per forward pass (torch.profiler)."""
    method = vgen_method(pipe, spec, mode, torch.zeros(1, dtype=torch.long, device=pipe.device), params)
    method(0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        _, passes = method(1)
        seconds = time.perf_counter() - start
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return {"sampler": f"{spec.label}, compiled", "forward_passes": passes, "ms_per_pass": 1e3 * seconds / passes,
            "ops": [{"op": e.key[:60], "ms_per_pass": e.self_cpu_time_total / 1e3 / passes,
                     "calls_per_pass": e.count / passes} for e in ops]}


def profile_table(profile: dict) -> str:
    lines = [f"Where a pass of `{profile['sampler']}` goes (batch 1, torch.profiler, self CPU time; "
             f"{profile['ms_per_pass']:.1f} ms a pass under the profiler):", "",
             "| op | ms per pass | calls per pass |", "|---|---|---|"]
    lines += [f"| `{op['op']}` | {op['ms_per_pass']:.2f} | {op['calls_per_pass']:.1f} |" for op in profile["ops"]]
    return "\n".join(lines)


def table(result: dict) -> str:
    lines = ["| method | first call s | median s | tokens/s | forward passes | step compression | vs compiled AR "
             "| the same, paired by round (range) | vs eager AR | pass cost (x AR step) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in result["rows"].items():
        paired = r["vs_compiled_ar_paired"]
        lines.append(f"| {name} | {r['first_call_s']:.1f} | {r['median_s']:.3f} | {r['tokens_per_s']:.1f} "
                     f"| {r['forward_passes']:.1f} | {r['step_compression']:.2f}x | **{r['vs_compiled_ar']:.2f}x** "
                     f"| {paired['median']:.2f}x ({paired['low']:.2f}-{paired['high']:.2f}x) "
                     f"| {r['vs_eager_ar']:.2f}x | {r['pass_cost']:.2f} |")
    return "\n".join(lines)


def setup_line(setup: dict, result: dict) -> str:
    s = result["token_statistics"]
    cost = result["window_cost_eager"]
    return (f"{setup['model']}, batch {result['batch']}, {setup['params']}, {setup['device']}, {setup['dtype']}, "
            f"compile={setup['compile']!r}, "
            f"{setup['threads']}, torch {setup['torch']}, median of {setup['repeats']} after a first call; AR's "
            f"tokens: mean entropy {s['mean_entropy_nats']:.2f} nats, median top-1 {s['median_top1_prob']:.2f}"
            + (f"; eager {setup['window']}-token forward = {cost:.2f}x a 1-token one" if cost else ""))


def plot(results: list[dict]) -> Image.Image:
    """One panel per batch size: each method's speed against compiled AR over its step compression."""
    return image_grid([scatter_plot([(name, r["step_compression"], r["vs_compiled_ar"])
                                     for name, r in result["rows"].items()],
                                    "step compression (x fewer forward passes)", "speed vs compiled vgen AR (x)",
                                    f"batch {result['batch']}") for result in results], len(results))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="shapes-c2i")
    ap.add_argument("--gpt-model", choices=["tiny", "default", *GPT_SIZES], default=None,
                    help="random weights of a LlamaGen size (tiny: 2 layers, dim 128; default: the embedded model's)")
    ap.add_argument("--tokens", type=int, default=256, help="image tokens of --gpt-model")
    ap.add_argument("--compile-mode", default=None,
                    help="torch.compile mode of the compiled rows (default: reduce-overhead on CUDA, else default)")
    ap.add_argument("--samplers", nargs="+", default=list(SPECULATIVE), metavar="SPEC",
                    help="speculative samplers to time: names or vgen bench specs (mcsjd8=mcsjd:window=8)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--llamagen-repo", type=Path, default=None, help="local clone of FoundationVision/LlamaGen")
    ap.add_argument("--profile", default=None, metavar="SPEC",
                    help="also profile one compiled batch-1 run of this sampler (a name or spec), op by op")
    ap.add_argument("--out", type=Path, required=True, help="folder for compiled_speed.{json,md,png}")
    args = ap.parse_args()
    samplers = parse_sampler_list(args.samplers)
    if any(spec.seed is not None or spec.sampling for spec in samplers):
        ap.error("--samplers: every method draws the same seeds and sampling settings; give sampler options only")
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    mode = args.compile_mode or ("reduce-overhead" if args.device.startswith("cuda") else "default")
    if args.gpt_model:
        pipe = RandomPipeline(args.gpt_model, args.tokens, dtype, args.device)
        params, model_name = SamplingParams(cfg_scale=4.0), f"{args.gpt_model} (random weights)"
    else:
        pipe = vgen.load(args.model, device=args.device, dtype=dtype)
        params, model_name = SamplingParams(**merge_settings(pipe.info.defaults, {})), args.model
    setup = {"model": model_name, "params": params.to_dict(), "device": args.device, "dtype": args.dtype,
             "compile": mode,
             "threads": f"{torch.get_num_threads()} thread(s)" if args.device == "cpu" else args.device,
             "torch": torch.__version__, "repeats": args.repeats,
             "window": samplers[0].sampler().window}
    results = []
    for batch in args.batch_sizes:
        results.append(bench_batch(pipe, batch, params, samplers, args.repeats, args.llamagen_repo, mode))
        print(f"{setup_line(setup, results[-1])}\n\n{table(results[-1])}\n", flush=True)
    profile = profile_passes(pipe, parse_sampler_list([args.profile])[0], mode, params) if args.profile else None
    sections = [f"{setup_line(setup, r)}\n\n{table(r)}" for r in results]
    if profile:
        sections.append(profile_table(profile))
        print(sections[-1])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compiled_speed.json").write_text(json.dumps({"setup": setup, "results": results,
                                                              "profile": profile}, indent=1))
    (args.out / "compiled_speed.md").write_text("\n\n".join(sections) + "\n")
    plot(results).save(args.out / "compiled_speed.png")


if __name__ == "__main__":
    main()
