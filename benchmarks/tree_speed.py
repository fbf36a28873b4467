"""What a draft tree costs and buys on a device: the node-cost curve of a tree forward, and the tree sampler against
vanilla AR and MC-SJD compiled.

**The node-cost curve.** The time of one tree ``decode_rows`` of T nodes over a half-full cache, divided by a 1-token
``decode_rows`` (:func:`speculative_speed.window_cost`: the median of interleaved repeats, synchronised on CUDA), at
the sampler's batch (CFG rows included). The trees are laid out as the sampler lays them out
(:func:`~vgen.samplers.speculative.tree_pass.tree_layout`): the chain of a 32-token window (fewer on a model of
fewer tokens) with the sampler's 2 alternatives at each of its first k columns, each alternative's line 8 nodes
deep, for each k of ``--branches`` (T from 32 to 472 with the defaults). The curve is fitted with the planner's pass
cost ``1 + node_cost * max(0, T - free_nodes)`` (:class:`~vgen.samplers.speculative.planner.BranchPlanner`):
``free_nodes`` is the **knee**, the largest T up to which every cost stays <= 1.1 (1 where even the chain costs
more), and ``node_cost`` the least-squares slope of the points past it through (knee, 1). Beside them,
``linear_node_cost``: the slope of ``1 + node_cost (T - 1)`` through (1, 1) over the points up to the knee (all of
them without one), the cost of a pass with no free width.

**The sampler table** (:func:`vgen.eval.bench.run_bench`, the same images for every row, ratios against the first):
``ar`` compiled, ``mcsjd`` compiled at its window, and the tree sampler (``mcsjd`` with a 32-token window, 3
candidates, lines 8 deep) twice: ``tree-fit`` with the pass cost fitted at that batch (``free_nodes`` the knee;
``node_cost`` at least 1e-4, its floor too where no point lies past the knee: 0 would mean the device's default),
its passes without branches compiled (outside CUDA graphs: mode ``default`` where the others replay graphs) and its
tree passes eager, and ``tree-free``, eager, with node cost 0.001 (nearly free nodes, the device's free width: the
step-count ceiling of its trees). Columns: forward passes, step compression, wall time, latency ratio against
compiled AR, tokens per forward, the entropy and top-1 probability of the tokens' distributions (and on
``shapes-c2i`` FID and class accuracy). Each row draws one untimed batch first (a compiled row its compilation).

Models: ``shapes-c2i`` (the embedded default) and ``llamagen-t2i``, a random LlamaGen-T2I GPT-XL (benchmarks/
t2i_speed.py's builder) drawing random caption features (a fixed one per prompt) with LlamaGen-T2I's settings.
Random weights give near-flat next-token distributions, so its step compression says nothing about the released
model; its pass costs and the node-cost curve carry over. ``--tiny`` puts tiny random backbones in both places (a
dry run: shapes-c2i keeps its tokenizer, FID and classifier). Writes ``tree_speed.json`` and ``tree_speed.md`` to
``--out`` after each measurement, so a run cut short keeps what it measured.

    python benchmarks/tree_speed.py --device cuda --dtype bf16 --out tree_speed              # on a GPU
    python benchmarks/tree_speed.py --tiny --device cpu --dtype fp32 --compile-mode none \\
        --out /tmp/tree_speed                                                               # a CPU dry run
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch
from ar_speed import random_model
from speculative_speed import window_cost
from t2i_speed import BUILDERS, DTYPES, TINY_LENGTHS, llamagen_t2i, llamagen_t2i_prompts

import vgen
from vgen.data.prompts import PromptSet
from vgen.eval.bench import (
    Draw,
    RealReference,
    bench_conditions,
    bench_table,
    parse_sampler_list,
    real_reference,
    run_bench,
    setup_line,
)
from vgen.models.conditioning import PrefixCondition
from vgen.pipelines import LLAMAGEN_T2I_DEFAULTS, ImagePipeline, PipelineInfo
from vgen.samplers import SamplingParams
from vgen.samplers.compiling import COMPILE_MODES, CUDA_GRAPH_MODES
from vgen.samplers.speculative.tree_pass import Branch, TreeLayout, tree_layout

MODELS = ("shapes-c2i", "llamagen-t2i")
WINDOW, CANDIDATES, BRANCH_DEPTH = 32, 3, 8  # the tree sampler's
FREE_NODE_COST = 0.001  # nearly free nodes: the planner's trees as large as they pay in passes alone
MIN_NODE_COST = 1e-4  # the least node cost a tree row is given (0 would mean the device's default)
KNEE_COST = 1.1
NOTE = ("llamagen-t2i has random weights: near-flat next-token distributions make its acceptance, and so its step "
        "compression, unlike the released model's; its pass costs carry over")


class RandomCaptions:
    """A prompt encoder for a random LlamaGen-T2I: prompt i of ``prompts`` gets the i-th of a fixed set of random
    caption features (:func:`t2i_speed.llamagen_t2i_prompts`, ``lengths[i]`` real positions), the same at every call,
    so the teacher-forced token statistics see the condition each image was drawn from."""

    def __init__(self, model: torch.nn.Module, prompts: tuple[str, ...], lengths: list[int], device: str) -> None:
        with torch.random.fork_rng(devices=[]):  # the features come from the CPU's generator
            torch.default_generator.manual_seed(0)
            self.cond = llamagen_t2i_prompts(model, lengths, device)
        self.index = {prompt: i for i, prompt in enumerate(prompts)}

    def __call__(self, prompts: list[str]) -> PrefixCondition:
        return self.cond[torch.tensor([self.index[p] for p in prompts])]


def random_t2i(tiny: bool, device: str, dtype: torch.dtype) -> tuple[ImagePipeline, PromptSet]:
    """A random LlamaGen-T2I GPT-XL (or a tiny one) as a pipeline, and the prompt set it draws: one prompt per
    caption length."""
    model, tokenizer, _ = llamagen_t2i(tiny, device, dtype)
    lengths = TINY_LENGTHS if tiny else BUILDERS["llamagen-t2i"][2]  # t2i_speed's caption lengths
    prompts = tuple(f"random caption {i}" for i in range(len(lengths)))
    info = PipelineInfo(name=f"llamagen-t2i ({'tiny' if tiny else 'GPT-XL'}, random weights)",
                        image_size=model.grid[0] * tokenizer.downsample_factor, defaults=dict(LLAMAGEN_T2I_DEFAULTS))
    pipe = ImagePipeline(model, tokenizer, info, prompt_encoder=RandomCaptions(model, prompts, lengths, device))
    prompt_set = PromptSet(prompts, tuple(str(i + 1) for i in range(len(prompts))), None, None, "text",
                           "random caption features")
    return pipe, prompt_set


def tiny_backbone(pipe: ImagePipeline, device: str, dtype: torch.dtype) -> ImagePipeline:
    """``pipe`` with a tiny random backbone of its grid, vocabulary and classes (its tokenizer, real images, FID
    features and classifier kept): a dry run's."""
    model = random_model(dataclasses.replace(pipe.model.config, dim=32, n_layer=2, n_head=2), dtype, device)
    info = dataclasses.replace(pipe.info, name=f"{pipe.info.name} (tiny random backbone)")
    return ImagePipeline(model, pipe.tokenizer, info)


def load_model(name: str, args: argparse.Namespace) -> tuple[ImagePipeline, PromptSet | None]:
    """The pipeline of ``name`` (with ``--tiny``, a tiny random backbone) and, for a text model, its prompt set."""
    dtype = DTYPES[args.dtype]
    if name == "llamagen-t2i":
        return random_t2i(args.tiny, args.device, dtype)
    pipe = vgen.load(name, device=args.device, dtype=dtype)
    return tiny_backbone(pipe, args.device, dtype) if args.tiny else pipe, None


def curve_tree(length: int, branched: int) -> TreeLayout:
    """The chain of a window of ``length`` with the tree sampler's alternatives at each of its first ``branched``
    columns, each alternative's line as deep as the sampler's."""
    return tree_layout(length, tuple(Branch(j, CANDIDATES - 1, BRANCH_DEPTH) for j in range(branched)))


def fit_pass_cost(costs: dict[int, float], knee_cost: float = KNEE_COST) -> dict:
    """The planner's pass cost ``1 + node_cost * max(0, T - free_nodes)`` fitted to ``costs`` (tree size -> cost):
    the knee (the largest T up to which every cost stays <= ``knee_cost``; None where the first does not),
    ``free_nodes`` (the knee, else 1) and ``node_cost`` (the least-squares slope through (free_nodes, 1) of the points
    past it; None where there are none), and ``linear_node_cost`` (the slope through (1, 1) of the points up to the
    knee, of all of them without one)."""
    sizes = sorted(costs)
    knee = None
    for t in sizes:
        if costs[t] > knee_cost:
            break
        knee = t
    free = knee or 1

    def slope(points: list[int], origin: int) -> float | None:
        if not points:
            return None
        return sum((costs[t] - 1) * (t - origin) for t in points) / sum((t - origin) ** 2 for t in points)

    return {"knee": knee, "free_nodes": free, "node_cost": slope([t for t in sizes if t > free], free),
            "linear_node_cost": slope([t for t in sizes if knee is None or t <= knee], 1)}


def node_cost_curve(pipe: ImagePipeline, params: SamplingParams, batch: int, args: argparse.Namespace) -> dict:
    """The cost of each tree of :func:`curve_tree` (``--branches``) in 1-token forwards at ``batch`` (its CFG rows
    included) and its fit (:func:`fit_pass_cost`)."""
    model = pipe.model
    length = min(WINDOW, max(model.num_tokens - 1, 1))  # the window the sampler verifies
    rows = 2 * batch if params.guided else batch
    points, seen = [], set()
    for k in sorted({min(k, length - 1) for k in args.branches}):  # at most every draft column
        shape = curve_tree(length, k).shape
        if shape.size in seen:  # late columns' lines are cut at the window's end
            continue
        seen.add(shape.size)
        points.append({"branches": k, "nodes": shape.size, "cost": window_cost(model, shape, rows, args.cost_repeats)})
        print(f"  {rows} rows, {shape.size} nodes: {points[-1]['cost']:.3f}x a 1-token forward", flush=True)
    fit = fit_pass_cost({p["nodes"]: p["cost"] for p in points})
    return {"rows": rows, "window": length, "points": points, **fit}


def row_specs(mode: str | None, cost: tuple[float, int], extra: list[str]) -> list[str]:
    """The table's rows as ``vgen bench`` specs: compiled AR (the reference) and MC-SJD, the tree sampler at the pass
    cost ``cost`` (node cost, free nodes) and at :data:`FREE_NODE_COST`, then ``extra``."""
    compiled, suffix = ("", "") if mode is None else (f":compile={mode}", "-compiled")
    # tree passes run eagerly, so a tree run compiles its passes without branches outside CUDA graphs
    tree_mode = "default" if mode in CUDA_GRAPH_MODES else mode
    tree_compiled = "" if tree_mode is None else f",compile={tree_mode}"
    tree = f"mcsjd:window={WINDOW},candidates={CANDIDATES},branch_depth={BRANCH_DEPTH},node_cost="
    return [f"ar{suffix}=ar{compiled}", f"mcsjd{suffix}=mcsjd{compiled}",
            f"tree-fit{suffix}={tree}{cost[0]},free_nodes={cost[1]}{tree_compiled}",
            f"tree-free={tree}{FREE_NODE_COST}", *extra]


def bench_batch(pipe: ImagePipeline, prompts: PromptSet | None, params: SamplingParams, batch: int,
                cost: tuple[float, int], real: RealReference | None, args: argparse.Namespace) -> dict:
    """``run_bench``'s result for :func:`row_specs` at ``batch``: ``--batches`` batches per row, after an untimed
    batch of each eager row (a compiled row's first batch, its compilation, is run_bench's own warm-up)."""
    reference, *specs = parse_sampler_list(row_specs(args.compile_mode, cost, args.samplers))
    num_samples = batch * args.batches
    plan = bench_conditions(pipe, num_samples, args.seed, batch, prompts, None).plan_of(args.seed)
    for spec in [reference, *specs]:
        sampler = spec.sampler()
        if not getattr(sampler, "compile", False):  # CUDA's libraries and kernels for this batch's shapes
            Draw().warm_up(pipe, sampler, plan, params, num_samples)
    return run_bench(pipe, specs, num_samples, args.seed, batch, params, real, reference_spec=reference,
                     prompts=prompts, num_real=args.num_real)


def curve_table(curve: dict) -> str:
    slope = "-" if curve["node_cost"] is None else f"{curve['node_cost']:.5f}"
    if curve["knee"] is None:
        fit = f"no knee (the chain alone costs more than {KNEE_COST}x): node cost {slope} from the first node"
    else:
        fit = f"knee (every cost <= {KNEE_COST}x up to it) at {curve['knee']} nodes, node cost {slope} past it"
    lines = [f"Tree forward cost at {curve['rows']} rows (a window of {curve['window']}, x a 1-token forward): {fit}; "
             f"linear node cost {curve['linear_node_cost']:.5f}", "", "| branched columns | nodes | cost |",
             "|---|---|---|"]
    lines += [f"| {p['branches']} | {p['nodes']} | {p['cost']:.3f}x |" for p in curve["points"]]
    return "\n".join(lines)


def markdown(result: dict) -> str:
    lines = [f"# Draft-tree speed ({result['device']}, {result['dtype']}, compile {result['compile_mode']})", "",
             f"Note: {NOTE}.", ""]
    for run in result["runs"]:
        lines += [f"## {run['model']}, batch {run['batch']}", "", curve_table(run["curve"]), ""]
        if run["bench"] is not None:
            node_cost, free_nodes = run["tree_pass_cost"]
            lines += [f"Tree rows: tree-fit at node_cost={node_cost:.6g}, free_nodes={free_nodes}; tree-free at "
                      f"node_cost={FREE_NODE_COST}.", "", setup_line(run["bench"]), "", bench_table(run["bench"]), ""]
    return "\n".join(lines)


def write(result: dict, out: Path) -> None:
    (out / "tree_speed.json").write_text(json.dumps(result, indent=1))
    (out / "tree_speed.md").write_text(markdown(result))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--batches", type=int, default=2, help="timed batches per row and batch size")
    ap.add_argument("--branches", type=int, nargs="+", default=[0, 1, 2, 4, 6, 8, 12, 16, 20, 24, 31],
                    help="branched columns of the curve's trees (0: the chain)")
    ap.add_argument("--cost-repeats", type=int, default=20, help="timed pairs per tree size (median)")
    ap.add_argument("--cost-only", action="store_true", help="measure the node-cost curves and stop")
    ap.add_argument("--samplers", nargs="*", default=[], help="more rows: `vgen bench` specs")
    ap.add_argument("--compile-mode", choices=[*COMPILE_MODES, "none"], default=None,
                    help="torch.compile mode of the AR and MC-SJD rows (default: reduce-overhead on CUDA, else "
                         "default; none: eager)")
    ap.add_argument("--num-real", type=int, default=256, help="rendered real images for shapes-c2i's FID")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true",
                    help="tiny random backbones in both models' places (a dry run, e.g. on a CPU)")
    ap.add_argument("--out", default="tree_speed", help="folder for tree_speed.json and tree_speed.md")
    args = ap.parse_args()
    if min(args.batch_sizes) < 1 or args.batches < 1 or args.cost_repeats < 1 or min(args.branches) < 0:
        ap.error("--batch-sizes, --batches and --cost-repeats must be >= 1, --branches >= 0")
    if args.batches * min(args.batch_sizes) < 2:
        ap.error("--batches x the smallest batch size must be >= 2 (run_bench's least sample count)")
    cuda = args.device.startswith("cuda")
    mode = args.compile_mode or ("reduce-overhead" if cuda else "default")
    args.compile_mode = None if mode == "none" else mode
    parse_sampler_list(row_specs(args.compile_mode, (FREE_NODE_COST, 1), args.samplers))  # a bad spec fails first
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"device": torch.cuda.get_device_name(args.device) if cuda else "cpu", "torch": torch.__version__,
              "dtype": args.dtype, "tiny": args.tiny, "compile_mode": mode, "window": WINDOW,
              "candidates": CANDIDATES, "branch_depth": BRANCH_DEPTH, "free_node_cost": FREE_NODE_COST,
              "knee_cost": KNEE_COST, "note": NOTE, "runs": []}
    models = {}
    for name in args.models:  # every curve first: the cheap measurement a run cut short should keep
        pipe, prompts = load_model(name, args)
        real = None if pipe.text_conditional or args.cost_only else real_reference(pipe, num_real=args.num_real)
        models[name] = pipe, prompts, real
        params = SamplingParams(**pipe.info.defaults)
        for batch in args.batch_sizes:
            print(f"{name}, batch {batch}: node-cost curve", flush=True)
            result["runs"].append({"model": name, "batch": batch, "curve": node_cost_curve(pipe, params, batch, args),
                                   "tree_pass_cost": None, "bench": None})
            write(result, out)
    for run in [] if args.cost_only else result["runs"]:
        pipe, prompts, real = models[run["model"]]
        params = SamplingParams(**pipe.info.defaults)
        curve = run["curve"]
        node_cost = float(f"{max(curve['node_cost'] or 0.0, MIN_NODE_COST):.3g}")
        run["tree_pass_cost"] = node_cost, curve["free_nodes"]
        print(f"{run['model']}, batch {run['batch']}: samplers", flush=True)
        run["bench"] = bench_batch(pipe, prompts, params, run["batch"], run["tree_pass_cost"], real, args)
        write(result, out)
    print(markdown(result))


if __name__ == "__main__":
    main()
