"""``vgen bench``: the speed x quality table of samplers on one model, as JSON, Markdown and a plot.

The measurement is :mod:`vgen.eval.bench`; this module only reads the command line.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from vgen.apps.options import (
    UsageError,
    add_device_args,
    add_model_args,
    add_sampling_args,
    check_count,
    load_pipeline,
    sampling_params,
)
from vgen.eval.bench import (
    bench_table,
    parse_sampler_list,
    parse_sampler_spec,
    real_reference,
    run_bench,
    setup_line,
    write_outputs,
)
from vgen.samplers import available_samplers


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="speed x quality of samplers on one model (JSON, Markdown table, plot)",
                       description="Draw the same images (classes in turn, the same seeds and batches) with every "
                                   "sampler and report forward passes, step compression and latency ratio against "
                                   "vanilla AR, tokens per forward, FID/KID in vgen's shapes features against real "
                                   "images and against AR's, and class accuracy. A video model draws clips, measured "
                                   "by FVD/KVD in vgen's shapes-video features and clip class accuracy. A "
                                   "text-to-image model draws one image per held-out scene prompt, measured "
                                   "against the rendered scenes and by the scene judge's accuracy per attribute "
                                   "(shape, colour, size, position, background, joint). Writes bench.json, "
                                   "bench.md and bench.png into --out.")
    add_model_args(p)
    b = p.add_argument_group("benchmark")
    b.add_argument("--samplers", nargs="+", default=None, metavar="SPEC",
                   help="comma-separated names (ar,sjd,lantern,gsd) and/or specs label=name:key=value,... "
                        "(e.g. sjd8=sjd:window=8,draft_init=vertical; seed=K draws that row with other seeds; "
                        "temperature=, cfg_scale=, top_k=, top_p=, cfg_interval= set that row's sampling); "
                        "vanilla AR is added first if missing (default: every registered sampler for the model)")
    b.add_argument("--reference-model", default=None, metavar="MODEL",
                   help="draw the reference row with this other model (embedded name or pipeline folder) and its "
                        "default sampler, e.g. --model shapes-nar --reference-model shapes-c2i: NAR against "
                        "next-token AR of the same size on the same data")
    b.add_argument("--reference", default=None, metavar="SPEC",
                   help="the row the ratios are taken against, as a sampler spec (e.g. "
                        "steps10=continuous-ar:head_steps=10; default: the model's plain one-token-per-pass "
                        "sampler)")
    b.add_argument("--num-samples", type=int, default=64,
                   help="images (clips) per sampler; for a text-to-image model, the held-out prompts drawn")
    b.add_argument("--seed", type=int, default=0, help="random seed of the first batch (the others follow from it)")
    b.add_argument("--batch-size", type=int, default=8, help="images (clips) sampled at once")
    b.add_argument("--real", default=None, help="real images (folder, .npz, .npy; clips for a video model) or a stats "
                                                "file in the same features (default: render the validation split of "
                                                "the model's vgen.data set, or a text-to-image model's held-out "
                                                "scenes)")
    b.add_argument("--num-real", type=int, default=1024,
                   help="real images (clips) to render when --real is not given")
    add_sampling_args(p)
    out = p.add_argument_group("output")
    out.add_argument("--out", default="bench", help="folder for bench.json, bench.md and bench.png (default: bench)")
    add_device_args(out)
    p.set_defaults(func=run_bench_command)


def run_bench_command(args: argparse.Namespace) -> None:
    check_count("--num-samples", args.num_samples, at_least=2)
    check_count("--num-real", args.num_real, at_least=2)
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {args.batch_size}")
    specs = parse_sampler_list(args.samplers) if args.samplers else None  # bad specs fail before the model loads
    reference_spec = parse_sampler_spec(args.reference) if args.reference else None
    if reference_spec is not None and args.reference_model:
        raise UsageError("--reference picks the reference row's sampler and --reference-model its model; give one")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {args.out} exists and is not a folder")
    if not out.parent.is_dir():
        raise UsageError(f"cannot create {args.out}: directory {out.parent} does not exist")
    if args.real is not None and not Path(args.real).exists():
        raise UsageError(f"--real {args.real} does not exist")
    pipe = load_pipeline(args)
    reference_pipe = None
    if args.reference_model:
        reference_pipe = load_pipeline(argparse.Namespace(**{**vars(args), "model": args.reference_model,
                                                             "gpt_ckpt": None, "vq_ckpt": None}))
    if specs is None:
        specs = parse_sampler_list([",".join(available_samplers(getattr(pipe.model, "token_order", "raster")))])
    params = sampling_params(pipe, args)
    with warnings.catch_warnings(record=True) as caught:  # e.g. fewer samples than feature dimensions
        warnings.simplefilter("always")
        real = real_reference(pipe, args.real, args.num_real)
        result = run_bench(pipe, specs, args.num_samples, args.seed, args.batch_size, params, real,
                           progress=not args.no_progress, reference_pipe=reference_pipe,
                           reference_spec=reference_spec)
    result["warnings"] = list(dict.fromkeys(str(w.message) for w in caught))
    for message in result["warnings"]:
        print(f"vgen: warning: {message}", file=sys.stderr)
    paths = write_outputs(result, out)
    print(setup_line(result))
    print(bench_table(result))
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
