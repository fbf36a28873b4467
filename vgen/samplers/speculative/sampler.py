"""The speculative sampler: one verify loop for every drafter x acceptance rule, and the named presets.

One pass of the loop, for every row b of the batch at once (L = window length, ``pos[b]`` = tokens done):

1. the drafter proposes drafts for tokens ``pos .. pos + L - 2`` with their draft distributions ``q``;
2. the target runs ``[last token, drafts]`` (L positions) over the KV cache, each row at its own slots, the CFG
   batch as [cond; null]; the logits are CFG-merged and processed (temperature, top-k, top-p) into ``p``;
3. the acceptance rule gives each draft's acceptance probability; drafts are **accepted** left to right until
   the first rejection (a uniform draw above the probability);
4. at the rejection a **recovered** token is drawn from the rule's residual (by inverse CDF at a uniform draw);
   if every draft was accepted, the last position's distribution gives a free **bonus** token. Each pass thus
   yields 1 .. L tokens per row;
5. the row's cache is "cropped" by moving its length to the accepted prefix: the next window overwrites the
   rejected slots.

Rows advance independently (their own accepted lengths); a finished row idles until the batch is done. Steps 2-4
are three ops (``target_probs``, ``accept_drafts``, ``recover``), fused Triton kernels on CUDA (``vgen.kernels``);
every random number comes from the run's generator through torch, so both sides draw the same tokens.

Steps 2-5 are :func:`verify_pass`. ``compile`` hands it to ``torch.compile`` in its static form (shapes that do not
depend on the drafts: attention over the cache under a mask, every draft judged), with the pass's uniform draws made
before it (:func:`pass_uniforms`), so a compiled run reads the eager run's random numbers in the same order. The
drafter's tensor work is compiled too, its random numbers drawn eagerly in the same way: outside CUDA graphs inside
the pass's graph where the drafter offers a pure step (:func:`verify_and_draft`; the Jacobi drafter of ``mcsjd``,
``lantern`` and ``gsd``), else as graphs of its own (``DraftContext.compile``).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from vgen.models.cache import KVCache
from vgen.models.conditioning import Condition
from vgen.samplers.base import (
    MAX_TOKENS,
    MAX_VOCAB,
    SampleOutput,
    Sampler,
    SamplerStats,
    SamplingParams,
    prepare_condition,
    progress_bar,
    register_sampler,
)
from vgen.samplers.compiling import (
    COMPILE_HELP,
    CUDA_GRAPH_MODES,
    check_compile,
    compile_mode,
    compile_step,
    keep_static_cache,
    take_static_cache,
)
from vgen.samplers.logits import draw, inverse_cdf, target_probs
from vgen.samplers.options import check_options, option
from vgen.samplers.speculative.drafters import (
    DRAFT_COUPLINGS,
    DRAFT_INITS,
    DraftContext,
    Verification,
    available_drafters,
    build_drafter,
    reads_are_free,
)
from vgen.samplers.speculative.lantern import LANTERN_MODES, check_lantern_budget
from vgen.samplers.speculative.planner import DEVICE_PASS_COST, BranchPlanner
from vgen.samplers.speculative.rules import (
    AcceptanceRule,
    accept_drafts,
    available_rules,
    build_rule,
    recover,
    window_accepted_length,
    written,
)
from vgen.samplers.speculative.tree_pass import tree_step

# a drafter's step returns what its next step reads, which a replayed CUDA graph would overwrite
DRAFTING_MODES = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}
DONE_CHECK_PASSES = 4  # compiled passes on a GPU between "are all rows done?" checks (each waits for it)
# LANTERN++ moves up to (lambda - 1) p(x) onto x: all of its neighbours' mass (at most 1 - p(x)) once
# lambda >= 1 / p(x), so for any token with p(x) >= 1 / MAX_VOCAB a larger lambda moves no more
MAX_LANTERN_LAMBDA = MAX_VOCAB
# GSD compares squared distances between rows of the model's input embedding table: rows 4096 wide with entries in
# [-2, 2] lie at most 16 * 4096 = 2**16 apart, so a larger threshold groups no more tokens
MAX_GSD_DISTANCE = 2**16
MAX_CANDIDATES = 8  # per window position: the catch of a 5th alternative is already a few percent
# window 0: the window a device's pass cost favours. On this project's CPU a pass of T tokens costs about
# 1 + 0.05 (T - 1) steps and mcsjd's clock is best at 16; a GPU's pass costs about one step up to a hundred-odd
# tokens, where wider windows need fewer passes (shapes-c2i: mcsjd 3.53x at 16, 4.03x at 32, 4.33x at 64; the
# tree planned with a GPU's cost 4.40x at 32, 4.61x at 64; docs/performance.md)
DEVICE_WINDOW = {"cpu": 16, "cuda": 64}


@register_sampler
@dataclass(frozen=True)
class Speculative(Sampler):
    """Speculative decoding with any ``drafter`` x ``accept`` rule.

    ``drafter``: ``jacobi`` (SJD: the target's previous pass), ``neighbour`` (Jacobi drafts whose fresh positions
    draw from the target's law at their grid neighbour), ``head`` (a trained draft head shipped with the model) or
    ``auto`` (the head when the model has one, else Jacobi). ``accept``: ``exact`` (lossless),
    ``lantern``, ``gsd`` or ``match`` (deterministic Jacobi). ``window``: positions per target pass (drafts + 1).
    The ``lantern_*`` and ``gsd_*`` fields are read only by their rule.
    """

    name: ClassVar[str] = "speculative"
    description: ClassVar[str] = ("any drafter (jacobi, neighbour, head) x any acceptance rule (exact and match "
                                  "lossless, lantern and gsd not; default exact)")
    lossless: ClassVar[bool | None] = True
    drafter: str = option("jacobi", "who proposes the drafts", choices=lambda: [*available_drafters(), "auto"],
                          unknown="drafter")
    accept: str = option("exact", "acceptance rule", choices=available_rules, unknown="acceptance rule")
    window: int = option(16, "target positions per forward pass (drafts + 1)", at_least=0, at_most=MAX_TOKENS,
                         note="0 = the device's: 16 on a CPU, 64 on a GPU")
    draft_init: str = option("random", "fresh Jacobi drafts", choices=DRAFT_INITS)
    draft_coupling: str = option("none", "Jacobi draft refresh (maximal or gumbel: MC-SJD)", choices=DRAFT_COUPLINGS)
    # LANTERN's run.sh uses 5-10; its script's default 1000 lost the class (see Lantern)
    lantern_k: int = option(8, "latent neighbours per token", at_least=0, at_most=MAX_VOCAB)
    lantern_delta: float = option(0.1, "total-variation budget in [0, 1] (lantern_mode tv) or lambda >= 1 "
                                       "(lantern_mode relative)", at_least=0, at_most=MAX_LANTERN_LAMBDA)
    lantern_mode: str = option("tv", "tv (LANTERN) or relative (LANTERN++)", choices=LANTERN_MODES)
    gsd_rank_window: int = option(7, "GSD candidates within +-this many ranks", at_least=0, at_most=MAX_VOCAB)
    gsd_p_threshold: float = option(0.15, "GSD probability threshold of a group", at_least=0, at_most=1)
    gsd_dist_threshold: float = option(0.5, "GSD latent-distance threshold of a group", at_least=0,
                                       at_most=MAX_GSD_DISTANCE)
    candidates: int = option(1, "candidates judged per window position: more than 1 verifies a draft tree with "
                                "alternatives where the planner expects them to pay (exact rule, Jacobi or "
                                "neighbour drafts)", at_least=1, at_most=MAX_CANDIDATES)
    branch_depth: int = option(8, "nodes on each alternative's line in a draft tree", at_least=1, at_most=MAX_TOKENS)
    node_cost: float = option(0.0, "what one more draft tree node adds to a pass's cost, in one-token passes (the "
                                   "planner weighs it against the tokens a branch is expected to add)", at_least=0,
                              at_most=1, note="0 = the device's default")
    free_nodes: int = option(0, "draft tree nodes a pass holds at about one step's cost", at_least=0,
                             at_most=MAX_TOKENS, note="0 = the device's default")
    compile: bool | str = option(False, COMPILE_HELP)

    def __post_init__(self) -> None:
        check_options(self)
        check_compile(self.compile)
        check_lantern_budget(self.lantern_mode, self.lantern_delta)
        if self.candidates > 1:
            check_tree_options(self)

    def resolve_drafter(self, draft_head: nn.Module | None) -> str:
        """The drafter this run uses: ``auto`` becomes ``head`` when there is a draft head, else ``jacobi``."""
        if self.drafter != "auto":
            return self.drafter
        return "head" if draft_head is not None else "jacobi"

    @property
    def compile_mode(self) -> str | None:
        """The ``torch.compile`` mode of the verify pass, None when it runs eagerly."""
        return compile_mode(self.compile)

    @torch.no_grad()
    def sample(self, model: nn.Module, cond: Condition, params: SamplingParams, *,
               generator: torch.Generator | None = None, progress: bool = False,
               tokenizer: nn.Module | None = None, draft_head: nn.Module | None = None) -> SampleOutput:
        start_time = time.perf_counter()
        cond, batch_cond = prepare_condition(self, model, cond, params)
        drafter_name = self.resolve_drafter(draft_head)
        rule = build_rule(self.accept, self, model, tokenizer)
        mode = self.compile_mode
        device, batch, n = cond.device, len(cond), model.num_tokens
        length = min(self.window or DEVICE_WINDOW.get(device.type, DEVICE_WINDOW["cuda"]), max(n - 1, 1))
        config = (self, drafter_name, length)  # the graphs of one configuration, apart from other ones'
        drafting = None if mode is None else functools.partial(compile_step, mode=DRAFTING_MODES.get(mode, mode),
                                                               config=config)
        graphs = mode in CUDA_GRAPH_MODES
        fuse = mode is not None and not graphs  # the drafter's step inside the pass's graph, where it has one
        options = self if self.window else dataclasses.replace(self, window=length)
        drafter = build_drafter(drafter_name, options, model, DraftContext(params, draft_head, static=mode is not None,
                                                                        compile=drafting, fuse=fuse))
        rows = len(batch_cond)
        planner = tree_planner(self, length, device) if self.candidates > 1 else None
        room = length if planner is None else planner.max_nodes(length)
        cache = take_static_cache(model, rows, extra=room) if graphs else model.new_cache(rows, extra=room)
        verify = verify_pass if mode is None else compile_step(verify_pass, mode, config)
        verify_drafting = compile_step(verify_and_draft, mode, config) if fuse else None
        # with a compiled pass on a device whose values cost a wait, the host asks whether every row is done only
        # every few passes; the passes after a row's last one write nothing
        check_every = DONE_CHECK_PASSES if mode is not None and not reads_are_free(device) else 1
        # where the host reads for free, a compiled pass attends only up to the rows' last window
        bounded = mode is not None and not graphs and reads_are_free(device)

        tokens = torch.zeros(batch, n + length, dtype=torch.long, device=device)  # room for drafts past the end
        steps = torch.zeros_like(tokens)  # the pass that produced each token (the acceptance map)
        out = model.prefill(batch_cond, cache, return_hidden=drafter.needs_hidden)
        logits, hidden = out if drafter.needs_hidden else (out, None)
        p = target_probs(logits, params, 0)
        first = draw(p, params.greedy, generator)
        tokens[:, 0] = first
        steps[:, 0] = 1
        passes = torch.ones((), dtype=torch.long, device=device)  # passes that produced a token, the prefill's too
        zero = torch.zeros(batch, dtype=torch.long, device=device)
        none = torch.zeros(batch, 0, dtype=torch.long, device=device)
        drafter.observe(Verification(zero, zero, p[:, None], first[:, None], hidden, tokens, none,
                                     p.new_zeros(batch, 0, p.shape[-1]), generator))
        pos = torch.ones(batch, dtype=torch.long, device=device)
        # tokens each pass gave each row (-1: the row was done), read once at the end
        produced_by_pass = torch.full((n + check_every, batch), -1, dtype=torch.long, device=device)
        run = 0
        counted = 0  # tokens put on the bar so far
        with progress_bar(progress, batch * n, self.name) as bar:
            while True:
                if run % check_every == 0:
                    done = int(pos.sum())  # the one device sync of a check
                    bar.update(done - counted)
                    counted = done
                    if done == batch * n:
                        break
                drafts, q = drafter.propose(tokens, pos, length - 1, generator)
                uniforms = pass_uniforms(batch, length, params.greedy, generator, device)
                plan = (planner.prepare(q, drafts, tokens, pos, drafter.stride, n)
                        if planner is not None and planner.pays(length - 1) else None)
                if plan is not None and plan.branched:
                    tokens, steps, next_pos, passes, produced_by_pass[run], accepted, path, judged = tree_step(
                        model, params, plan, drafter, tokens, steps, pos, passes, drafts, q, cache, uniforms,
                        generator)
                    planner.learn(plan, pos, tokens, accepted, path, judged)
                    planner.count(produced_by_pass[run])
                    pos = next_pos
                    run += 1
                    continue
                draft_step = drafter.pass_step(pos, length, generator) if fuse else None
                if graphs:
                    torch.compiler.cudagraph_mark_step_begin()
                image_end = int(pos.max()) + length if bounded else None
                inputs = (model, rule, params, mode is not None, drafter.needs_hidden, tokens, steps, pos, passes,
                          drafts, q, cache, uniforms, image_end)
                if draft_step is None:
                    out = verify(*inputs)
                else:
                    out, next_drafts = verify_drafting(draft_step.fn, draft_step.args, *inputs)
                    drafter.adopt(*next_drafts)
                tokens, steps, next_pos, passes, p, proposals, accepted, hidden, produced_by_pass[run] = out
                if draft_step is None:
                    drafter.observe(Verification(pos, accepted, p, proposals, hidden, tokens, drafts, q, generator))
                if plan is not None:
                    planner.learn(plan, pos, tokens, accepted)
                if planner is not None:
                    planner.count(produced_by_pass[run])
                pos = next_pos
                run += 1
        if graphs:
            keep_static_cache(model, cache, length)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        produced = produced_by_pass[:run].flatten()
        stats = SamplerStats(sampler=self.name, forward_passes=int(passes), tokens=batch * n,
                             wall_time_s=time.perf_counter() - start_time, batch_size=batch,
                             draft_forward_passes=drafter.forward_passes,
                             accepted_lengths=produced[produced >= 0].tolist(), accept_step=steps[:, :n].cpu(),
                             details={**self.to_dict(), "drafter": drafter_name, "window": length,
                                      **(planner.summary() if planner is not None else {})})
        return SampleOutput(tokens=tokens[:, :n].clone(), stats=stats)


def check_tree_options(options: Speculative) -> None:
    """A draft tree (``candidates`` > 1) is judged by the exact rule over Jacobi or neighbour drafts; its tree
    passes run eagerly beside compiled single-draft passes, outside CUDA graphs."""
    if options.accept != "exact":
        raise ValueError(f"candidates > 1 verifies a draft tree with the exact rule; accept={options.accept!r} "
                         "judges one draft per position")
    if options.drafter not in ("jacobi", "neighbour"):
        raise ValueError(f"candidates > 1 takes Jacobi or neighbour drafts, not drafter={options.drafter!r}")
    if compile_mode(options.compile) in CUDA_GRAPH_MODES:
        raise ValueError(f"candidates > 1 runs its tree passes eagerly, which a CUDA graph's fixed buffers do not "
                         f"allow: compile={options.compile!r} takes candidates=1; compile=True compiles the "
                         "passes without branches")


def tree_planner(options: Speculative, length: int, device: torch.device) -> BranchPlanner:
    """The run's branch planner: the pass cost from the options, else the device's default."""
    node_cost, free_nodes = DEVICE_PASS_COST.get(device.type, DEVICE_PASS_COST["cuda"])
    return BranchPlanner(options.candidates - 1, options.branch_depth, options.node_cost or node_cost,
                         options.free_nodes or free_nodes)


def pass_uniforms(batch: int, length: int, greedy: bool, generator: torch.Generator | None,
                  device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """The uniform draws of one verify pass over windows of ``length``, in the order the pass uses them: one per
    position for the target's proposals (None when greedy), one per draft for acceptance, one per row for the
    recovered token (None when greedy or there are no drafts).

    The proposals come from the inverse CDF at one draw each: ``torch.multinomial`` draws a number per vocabulary
    entry, which for a window of a batch costs about 20x more on a CPU. Drawing before the pass lets an eager pass
    and a compiled one, which cannot take a generator, read the same stream.
    """
    proposals = None if greedy else torch.rand(batch, length, generator=generator, device=device)
    accept = torch.rand(batch, length - 1, generator=generator, device=device)
    recovery = None if greedy or length == 1 else torch.rand(batch, generator=generator, device=device)
    return proposals, accept, recovery


def verify_pass(model: nn.Module, rule: AcceptanceRule, params: SamplingParams, static: bool, needs_hidden: bool,
                tokens: torch.Tensor, steps: torch.Tensor, pos: torch.Tensor, passes: torch.Tensor,
                drafts: torch.Tensor, q: torch.Tensor, cache: KVCache,
                uniforms: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None],
                image_end: int | None = None) -> tuple:
    """Steps 2-5 of a pass (the module docstring) for windows ``[last token, drafts]`` (drafts [B, L - 1] with
    their draft distributions ``q``) of rows at ``pos`` [B]; ``uniforms`` from :func:`pass_uniforms`; ``passes``:
    the passes so far that produced a token.

    Returns the new ``tokens`` and ``steps`` (the committed tokens marked with this pass's number), the next
    ``pos``, the new pass count (one more unless every row was done), the target's distributions ``p`` [B, L, V]
    and proposals [B, L], the accepted lengths, the final hidden states (None unless ``needs_hidden``) and the
    tokens each row produced (-1 for a row that was done). Only the cache changes in place.
    ``static``: the form a compiled pass takes, shapes that do not depend on the drafts (attention over the whole
    cache under a mask, or up to image token ``image_end``, at least ``max(pos) + L``; every draft judged; the torch
    references of the ops, whose kernels inductor generates itself).
    """
    n, batch, length = model.num_tokens, drafts.shape[0], drafts.shape[1] + 1
    active = pos < n
    passes = passes + active.any()
    probs_op, accept_op, recover_op = ((target_probs.reference, window_accepted_length, recover.reference) if static
                                       else (target_probs, accept_drafts, recover))
    window = torch.cat([tokens.gather(1, (pos - 1)[:, None]), drafts], dim=1)
    if params.guided:
        window, starts = torch.cat([window, window]), torch.cat([pos, pos])
    else:
        starts = pos
    out = model.decode_rows(window, starts, cache, return_hidden=needs_hidden, static=static, image_end=image_end)
    logits, hidden = out if needs_hidden else (out, None)
    offsets = torch.arange(length, device=pos.device)
    index = pos[:, None] + offsets  # the image token each window position predicts
    p = probs_op(logits, params, index)
    proposal_uniforms, accept_uniforms, recovery_uniforms = uniforms
    proposals = p.argmax(-1) if proposal_uniforms is None else inverse_cdf(p, proposal_uniforms, torch.float32)
    # left to right: drafts kept until the first rejection (or the end of the image)
    accepted = accept_op(rule, p[:, :-1], q, drafts, proposals[:, :-1], accept_uniforms, index[:, :-1] < n)
    nxt = pos + accepted  # the recovered or bonus token's index
    emits = nxt < n
    token = proposals[:, -1]  # bonus: every draft accepted
    if length > 1:
        at = accepted.clamp(max=length - 2)
        recovered = recover_op(rule, p, q, drafts, proposals, at, recovery_uniforms)[0]
        token = torch.where(accepted < length - 1, recovered, token)
    # commit: accepted drafts, then the recovered/bonus token, with the pass that produced them
    kept = offsets[None, :-1] < accepted[:, None]
    tokens = written(tokens, index[:, :-1], drafts, kept)
    steps = written(steps, index[:, :-1], passes.expand_as(drafts), kept)
    tokens = written(tokens, nxt[:, None], token[:, None], emits[:, None])
    steps = written(steps, nxt[:, None], passes.expand(batch, 1), emits[:, None])
    return (tokens, steps, (nxt + emits.long()).clamp(max=n), passes, p, proposals, accepted, hidden,
            torch.where(active, accepted + emits.long(), -1))


def verify_and_draft(draft: Callable, draft_args: tuple, *verify_args) -> tuple[tuple, tuple]:
    """:func:`verify_pass`, then a drafter's :class:`~vgen.samplers.speculative.drafters.DraftStep` (``draft``
    with ``draft_args``) on what it decided, as one function for the compiler: the pass's outputs, then the
    step's."""
    out = verify_pass(*verify_args)
    tokens, _, pos, _, p, proposals, accepted, _, _ = out
    return out, draft(p, proposals, accepted, tokens, pos, *draft_args)


@register_sampler
@dataclass(frozen=True)
class SJD(Speculative):
    """Speculative Jacobi decoding (Teng et al., ICLR 2025): Jacobi drafts, exact (lossless) acceptance."""

    name: ClassVar[str] = "sjd"
    description: ClassVar[str] = "speculative Jacobi decoding, the target's previous pass drafts, exact acceptance"


@register_sampler
@dataclass(frozen=True)
class MCSJD(Speculative):
    """SJD with coupled drafts (MC-SJD): Gumbel-coupled Jacobi refreshes and vertical initialisation; lossless.
    On the embedded default it needs about half the forward passes of plain SJD (docs/samplers.md)."""

    name: ClassVar[str] = "mcsjd"
    description: ClassVar[str] = ("SJD with coupled drafts (MC-SJD), Gumbel-coupled refreshes and vertical "
                                  "initialisation")
    draft_init: str = "vertical"
    draft_coupling: str = "gumbel"


@register_sampler
@dataclass(frozen=True)
class MCSJDTree(MCSJD):
    """MC-SJD with draft trees: at the window columns where the planner expects a catch, the carried law's next
    tokens (or the grid neighbour's) are verified beside the carried draft in the same pass, each followed by the
    chain's later drafts, under recursive rejection sampling; lossless. The planner weighs a branch's expected
    tokens against the pass's cost (``node_cost`` and ``free_nodes``, per device), and the window is the device's
    (``window=0``): on a GPU a window of 64 with branches wherever alternatives catch; on a CPU, where nodes cost
    nearly as much as window positions, ``mcsjd`` at its window of 16 with few branches or none
    (docs/samplers.md)."""

    name: ClassVar[str] = "mcsjd-tree"
    description: ClassVar[str] = ("MC-SJD with draft trees: alternatives where they are expected to pay, verified in "
                                  "one pass by recursive rejection sampling; the device's window")
    window: int = 0
    candidates: int = 3


@register_sampler
@dataclass(frozen=True)
class Lantern(Speculative):
    """LANTERN (ICLR 2025): relaxed acceptance over latent neighbourhoods, on Jacobi drafts coupled and vertically
    initialised as in ``mcsjd``. LANTERN paired it with an EAGLE draft head (``drafter="head"`` or ``"auto"``),
    but the relaxation leans every accepted token toward the drafter's distribution: on the embedded default the
    head's drafts lost most of the class control (37.5% class accuracy against AR's 77.1% over 48 images, 3.06x
    fewer passes), the target's own coupled drafts far less and faster, so Jacobi drafts are the default. The
    neighbourhood is the 8 nearest codes: with 1,000 the budget came from far codes (68.8% against AR's 80.7%
    over 512 images), with 8 it keeps the class (79.9%) at 3.26x fewer passes (docs/samplers.md)."""

    name: ClassVar[str] = "lantern"
    description: ClassVar[str] = "coupled drafts, LANTERN's relaxed acceptance (8 nearest codes, TV <= 0.1)"
    lossless: ClassVar[bool | None] = False
    accept: str = "lantern"
    draft_init: str = "vertical"
    draft_coupling: str = "gumbel"


@register_sampler
@dataclass(frozen=True)
class GSD(Speculative):
    """Grouped speculative decoding (ICCV 2025): grouped acceptance of Jacobi drafts, coupled and vertically
    initialised as in ``mcsjd`` (on the embedded default: 3.82x fewer passes against 2.83x with GSD's
    independent drafts, docs/samplers.md)."""

    name: ClassVar[str] = "gsd"
    description: ClassVar[str] = "coupled drafts, GSD's grouped acceptance"
    lossless: ClassVar[bool | None] = False
    accept: str = "gsd"
    draft_init: str = "vertical"
    draft_coupling: str = "gumbel"
