"""``vgen bench``: the speed x quality table of samplers on one model, as JSON, Markdown and a plot.

The measurement is :mod:`vgen.eval.bench`; this module only reads the command line.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from dataclasses import replace
from pathlib import Path

from vgen.apps.options import (
    UsageError,
    add_checkpoint_args,
    add_device_args,
    add_model_args,
    add_overwrite_flag,
    add_prompt_set_args,
    add_sampler_option_flags,
    add_sampling_args,
    check_count,
    check_files_in,
    load_pipeline,
    read_prompt_set_args,
    sampler_options,
    sampling_params,
)
from vgen.eval.bench import (
    OUTPUTS,
    SamplerSpec,
    bench_table,
    category_table,
    domain_features,
    is_video,
    parse_sampler_list,
    parse_sampler_spec,
    real_reference,
    run_bench,
    setup_line,
    write_outputs,
)
from vgen.eval.clip import load_clip
from vgen.eval.features import Extractor, load_extractor
from vgen.eval.weights import WeightsError
from vgen.samplers import available_samplers
from vgen.samplers.options import declarations


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="speed x quality of samplers on one model (JSON, Markdown table, plot)",
                       description="Draw the same images (the same classes or prompts, seeds and batches) with every "
                                   "sampler and report forward passes, step compression, latency ratio and tokens "
                                   "per second against vanilla AR, tokens per forward, the entropy and top-1 "
                                   "probability of the distributions each row drew from, FID/KID against real images "
                                   "and FID against AR's, and the domain's quality. A class model is judged by class "
                                   "accuracy; a video model draws clips, measured by FVD/KVD and clip class "
                                   "accuracy. A text-to-image model draws the prompts of --prompts (a text file, "
                                   "MS-COCO captions, PartiPrompts or GenEval), scored by CLIP with --clip and by "
                                   "FID against --real; vgen's scenes model draws its held-out prompts by default, "
                                   "judged per attribute (shape, colour, size, position, background, joint). Writes "
                                   "bench.json, bench.md and bench.png into --out.")
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
    b.add_argument("--num-samples", type=int, default=None,
                   help="images (clips) per sampler (default: one per prompt of --prompts, else 64); a text model "
                        "takes the prompts in turn")
    b.add_argument("--seed", type=int, default=0, help="random seed of the first batch (the others follow from it)")
    b.add_argument("--batch-size", type=int, default=8, help="images (clips) sampled at once")
    add_prompt_set_args(b)
    b.add_argument("--by-category", action="store_true",
                   help="also break the rows down by the prompt set's categories (PartiPrompts' categories, "
                        "GenEval's tags): samples, tokens per forward and CLIP score per category")
    q = p.add_argument_group("quality")
    q.add_argument("--clip", default=None, metavar="FOLDER",
                   help="a local CLIP folder in transformers' layout (openai/clip-vit-large-patch14): adds the CLIP "
                        "score of each text-to-image row")
    q.add_argument("--real", default=None, help="real images (folder, .npz, .npy; clips for a video model) or a stats "
                                                "file in the same features (default: render the validation split of "
                                                "the model's vgen.data set, or the scenes model's held-out scenes; "
                                                "another text model: no FID against real images)")
    q.add_argument("--num-real", type=int, default=1024,
                   help="real images (clips) to render when --real is not given")
    q.add_argument("--features", default=None,
                   help="feature set of the Fréchet distances: shapes or inception (default: shapes for vgen's own "
                        "models, inception for others, from its local weights file; without it, no FID)")
    q.add_argument("--weights", default=None, help="weights file of --features inception (default: looked up in "
                                                   "$VGEN_WEIGHTS_DIR, then ~/.cache/vgen)")
    q.add_argument("--no-verify-weights", action="store_true",
                   help="accept Inception weights whose SHA-256 differs from the reference (the hash is recorded)")
    add_sampling_args(p)
    add_sampler_option_flags(p, "each row whose sampler takes it and whose spec does not set it")
    out = p.add_argument_group("output")
    out.add_argument("--out", default="bench", help="folder for bench.json, bench.md and bench.png (default: bench)")
    add_overwrite_flag(out)
    add_device_args(out)
    add_checkpoint_args(p)
    p.set_defaults(func=run_bench_command)


def run_bench_command(args: argparse.Namespace) -> None:
    if args.num_samples is not None:
        check_count("--num-samples", args.num_samples, at_least=2)
    check_count("--num-real", args.num_real, at_least=2)
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {args.batch_size}")
    # bad specs and sampler flags fail before the model loads
    specs = with_flag_options(parse_sampler_list(args.samplers), sampler_options(args)) if args.samplers else None
    reference_spec = parse_sampler_spec(args.reference) if args.reference else None
    if reference_spec is not None and args.reference_model:
        raise UsageError("--reference picks the reference row's sampler and --reference-model its model; give one")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {args.out} exists and is not a folder")
    if not out.parent.is_dir():
        raise UsageError(f"cannot create {args.out}: directory {out.parent} does not exist")
    check_files_in(args.out, OUTPUTS.values(), args.overwrite)
    for flag, path in (("--real", args.real), ("--clip", args.clip)):
        if path is not None and not Path(path).exists():
            raise UsageError(f"{flag} {path} does not exist")
    prompts = read_prompt_set_args(args)
    if args.by_category and (prompts is None or prompts.categories is None):
        raise UsageError("--by-category needs a --prompts set with categories (PartiPrompts or GenEval)")
    num_samples = args.num_samples or (len(prompts) if prompts is not None else 64)
    check_count("--num-samples", num_samples, at_least=2)
    clip = load_clip(args.clip, args.device) if args.clip else None  # a bad CLIP folder fails before sampling
    pipe = load_pipeline(args)
    reference_pipe = None
    if args.reference_model:
        reference_pipe = load_pipeline(argparse.Namespace(**{**vars(args), "model": args.reference_model,
                                                             "gpt_ckpt": None, "vq_ckpt": None}))
    if specs is None:
        specs = with_flag_options(parse_sampler_list([",".join(available_samplers(
            getattr(pipe.model, "token_order", "raster")))]), sampler_options(args))
    params = sampling_params(pipe, args)
    with warnings.catch_warnings(record=True) as caught:  # e.g. fewer samples than feature dimensions
        warnings.simplefilter("always")
        extractor = feature_extractor(pipe, args)
        real = real_reference(pipe, args.real, args.num_real, extractor) if args.real else None
        result = run_bench(pipe, specs, num_samples, args.seed, args.batch_size, params, real,
                           progress=not args.no_progress, reference_pipe=reference_pipe,
                           reference_spec=reference_spec, prompts=prompts, clip=clip, extractor=extractor,
                           by_category=args.by_category, num_real=args.num_real)
    result["warnings"] = list(dict.fromkeys(str(w.message) for w in caught))
    for message in result["warnings"]:
        print(f"vgen: warning: {message}", file=sys.stderr)
    paths = write_outputs(result, out)
    print(setup_line(result))
    print(bench_table(result))
    if "categories" in result:
        print(f"\n{category_table(result)}")
    print(f"wrote {', '.join(str(p) for p in paths.values())}")


def feature_extractor(pipe, args: argparse.Namespace) -> Extractor | None:
    """The Fréchet distances' features: --features, else vgen's own for a model of its domains (None: the benchmark
    picks them), else Inception-v3 from its local weights; without those weights (and without --real), none, with
    a warning that says where the file goes."""
    media = "videos" if is_video(pipe) else "images"
    if args.features is not None:
        return load_extractor(args.features, media, args.weights, not args.no_verify_weights, args.device)
    if domain_features(pipe) is not None:
        return None
    try:
        return load_extractor("inception", media, args.weights, not args.no_verify_weights, args.device)
    except WeightsError as e:
        if args.real is not None:
            raise
        warnings.warn(f"no FID columns: {e}", stacklevel=2)
        return None


def with_flag_options(specs: list[SamplerSpec], options: dict) -> list[SamplerSpec]:
    """The specs with the sampler options set as flags (``--window 16``) added to every row whose sampler takes them
    and whose spec does not set them; a flag that no row's sampler takes is a UsageError."""
    unused = set(options)
    rows = []
    for spec in specs:
        declared = declarations(type(spec.sampler()))
        extra = {k: v for k, v in options.items() if k in declared and k not in spec.options}
        unused -= declared.keys()
        rows.append(replace(spec, options={**spec.options, **extra}) if extra else spec)
    if unused:
        flags = ", ".join("--" + k.replace("_", "-") for k in sorted(unused))
        raise UsageError(f"{flags}: none of the benchmarked samplers ({', '.join(s.name for s in specs)}) takes it")
    for row in rows:
        row.sampler()  # the merged options are checked before the model samples
    return rows
