"""``vgen sample-many``: thousands of samples for evaluation, across processes with ``torchrun``, packed as ``.npz``.

    torchrun --nproc_per_node 8 -m vgen sample-many --num-samples 50000 --out samples/run --device cuda
    vgen sample-many --model shapes-t2i --prompt-file captions.txt --num-samples 30000 --out samples/t2i

The logic (seeds, labels, sharding, resuming, packing) is :mod:`vgen.eval.sample_many`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vgen.apps.options import (
    UsageError,
    add_device_args,
    add_model_args,
    add_sampler_args,
    check_writable,
    load_pipeline,
    sampler_options,
    sampling_params,
)
from vgen.eval.sample_many import SamplePlan, init_distributed, sample_many
from vgen.pipelines import default_sampler
from vgen.pipelines.inputs import read_prompt_file
from vgen.samplers import get_sampler


def add_sample_many_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sample-many", help="many samples across processes (torchrun), resumable, packed as .npz",
                       description="Draw --num-samples images (or a video model's clips) into --out as numbered "
                                   "PNGs (a clip as its frames top to bottom; sharded over the processes of "
                                   "`torchrun --nproc_per_node N -m vgen sample-many ...`), then pack them as an "
                                   "ADM-style .npz (arr_0: uint8 [N, H, W, 3] or clips [N, T, H, W, 3], arr_1: "
                                   "labels; for a text-to-image model's --prompt-file, arr_1: prompt numbers and "
                                   "prompts: the prompts). Rerunning the same command resumes and redraws damaged "
                                   "PNGs; sample i depends only on i and the settings, not on the number of "
                                   "processes.")
    add_model_args(p)
    gen = add_sampler_args(p)
    gen.add_argument("--num-samples", type=int, required=True,
                     help="images (clips) to draw and pack, exactly: the last batch is cut short")
    gen.add_argument("--class-id", type=int, action="append", dest="class_ids",
                     help="draw labels only from these classes (repeatable; default: every class)")
    gen.add_argument("--balanced", action="store_true",
                     help="classes in turn (every class equally often) instead of uniformly random labels")
    gen.add_argument("--prompt-file", default=None, metavar="FILE",
                     help="a text-to-image model's prompts, one a line (blank lines skipped), taken in turn: "
                          "sample i gets prompt i mod the number of prompts")
    gen.add_argument("--seed", type=int, default=0, help="global seed")
    gen.add_argument("--batch-size", type=int, default=32,
                     help="samples per forward batch on each process (default: 32)")
    out = p.add_argument_group("output")
    out.add_argument("--out", required=True, help="folder of PNGs (created with its parents; rerun to resume)")
    out.add_argument("--npz", default=None, help="packed file to write (default: the --out folder's name + .npz)")
    add_device_args(out)
    p.set_defaults(func=run_sample_many)


def run_sample_many(args: argparse.Namespace) -> None:
    if args.num_samples < 1:
        raise UsageError(f"--num-samples must be >= 1, got {args.num_samples}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {args.out} exists and is not a folder")
    npz = args.npz or str(out.with_name(out.name + ".npz"))
    for path in (out, Path(npz)):
        make_parents(path)
    check_writable(npz, {".npz"})
    if args.prompt_file is not None and (args.class_ids or args.balanced):
        raise UsageError("--class-id and --balanced are for a class model; a --prompt-file's prompts go in turn")
    prompts = read_prompt_file(args.prompt_file) if args.prompt_file is not None else []
    if args.sampler is not None:
        get_sampler(args.sampler, **sampler_options(args))  # bad settings fail before the model loads
    ctx = init_distributed(args.device)
    try:
        args.device = ctx.device
        pipe = load_pipeline(args)
        sampler = get_sampler(args.sampler or default_sampler(pipe.model), **sampler_options(args))
        params = sampling_params(pipe, args)
        if prompts and not pipe.text_conditional:
            raise UsageError(f"--prompt-file is for a text-to-image model; {pipe.info.name} is class-conditional "
                             f"(draw its classes with --class-id, or all of them by default)")
        if pipe.text_conditional and not prompts:
            raise UsageError(f"{pipe.info.name} is a text-to-image model: give its prompts with --prompt-file FILE "
                             f"(one prompt a line)")
        plan = (SamplePlan(args.seed, args.batch_size, prompts=tuple(prompts)) if prompts else
                SamplePlan(args.seed, args.batch_size, tuple(args.class_ids or range(pipe.num_classes)),
                           args.balanced))
        result = sample_many(pipe, out, args.num_samples, plan, sampler, params, npz, ctx, not args.no_progress)
    finally:
        ctx.close()
    for damage in result.damaged:
        print(f"vgen: warning: {damage}; drew it again", file=sys.stderr)
    if result.npz is not None:
        print(f"wrote {result.num_samples} samples to {result.npz} (drew {result.generated} in this run on "
              f"{ctx.world_size} process{'es' if ctx.world_size > 1 else ''}, kept {result.reused} from before)")


def make_parents(path: Path) -> None:
    """Create the folders above ``path`` (``--out samples/run`` in a fresh checkout)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create the folder of {path}: {e.strerror or e}") from None
