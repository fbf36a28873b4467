"""Would several candidates per position, verified in one tree pass, save passes? An oracle over recorded runs.

A speculative pass of a Jacobi-style sampler (``mcsjd``) ends at its first rejected draft ``x_1`` (drawn from the
carried law ``q_c``); the target then commits a recovered token ``y ~ r = norm(max(0, p - q_c))``. Under recursive
rejection sampling over an ordered candidate list (SpecInfer's multi-step speculative sampling), a tree pass that
had also verified alternatives ``S'`` at that position catches the pass's end when the recovered draw lands in them:
for a list fixed before the pass, the tree commits ``y`` itself exactly when ``y`` is in ``S'`` (probability
``sum_{S'} r``). For each recorded pass end this script computes, by candidate source (each list excludes ``x_1``):

- ``carried``: the top of ``q_c``; ``neighbour``: the top of the target's latest law ``p_n`` at the grid neighbour
  (the token above, the same cell one frame earlier; ``neighbour.grid_neighbour``); ``both``: the two interleaved,
  ``carried`` first; ``r-oracle``: the top of ``r`` itself (a ceiling no drafter can reach);
- ``neighbour draws``: ``k - 1`` independent draws from ``p_n`` (a second noise stream), caught with probability
  ``1 - prod_s (1 - sum min(r_s, p_n))``, ``r_1 = r``, ``r_{s+1} = norm(max(0, r_s - p_n))``.

It prints the catch rate ``c`` (the expected ``sum_{S'} r``, or the probability above) for k = 2, 3, 4 candidates
(``x_1`` and k - 1 alternatives), by the entropy of ``q_c``, and the step compression of a depth-1 tree: a caught end
of pass t at window place j < 9 merges pass t + 1 into t when pass t + 1's tokens fit the branch depth d (the
alternative and d - 1 later drafts judge at most d tokens), merged passes merging nothing further. Deterministic
lists are caught when the recorded ``y`` is in them, so the emulation follows the recorded run; the stochastic
source is caught by a uniform of the oracle's own. Approximation: the merged pass's tokens are the recorded pass
t + 1's, which judged drafts refreshed after pass t, where the tree's branch would carry the drafts before it; the
``same drafts`` column merges only where the drafts pass t + 1 kept are the ones pass t held. The ``2 levels``
column lets a merged pass merge the next one too (a second branch level under each alternative).

    python benchmarks/multidraft_oracle.py --model shapes-c2i --images 16 --threads 1 mcsjd:window=16 mcsjd:window=32
"""

import argparse
import collections
import importlib.util
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

import vgen
from vgen.data.scenes import evaluation_prompts
from vgen.eval.bench import PROMPT_SPLIT
from vgen.models.conditioning import Condition
from vgen.pipelines import ImagePipeline
from vgen.samplers import SamplingParams
from vgen.samplers.speculative.drafters import JacobiDrafter, Verification
from vgen.samplers.speculative.exact import normalized_residual
from vgen.samplers.speculative.neighbour import grid_neighbour

_spec = importlib.util.spec_from_file_location("draft_sources", Path(__file__).with_name("draft_sources.py"))
draft_sources = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(draft_sources)

LISTS = ("carried", "neighbour", "both", "r-oracle")  # deterministic candidate lists
SOURCES = (*LISTS, "neighbour draws")
CANDIDATES = (2, 3, 4)  # k: x_1 and k - 1 alternatives
DEPTHS = (4, 8, 16)
BRANCHED = 9  # window places j < BRANCHED carry alternatives
ENTROPY_EDGES = (0.01, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0)  # nats: buckets of H(q_c), the first holds fresh drafts


@dataclass(frozen=True)
class End:
    """A pass's first rejection, at window place ``at``: whether the rejected draft was carried, the entropy of its
    law ``q_c``, the recovered token's place in each list's alternatives (past them all when not in it) and the
    catch rate each source reaches with 0, 1, 2, ... alternatives; ``uniform``: the stochastic source's own
    draw."""

    at: int
    carried: bool
    entropy: float
    rank: dict[str, int]
    catch: dict[str, list[float]]
    uniform: float

    def caught(self, source: str, k: int) -> bool:
        """Whether a tree with k candidates here from ``source`` commits the recorded end in this pass."""
        if source in LISTS:
            return self.rank[source] < k - 1
        return self.uniform < self.catch[source][k - 1]


def alternatives(law: torch.Tensor | None, drafted: int, count: int) -> list[int]:
    """The ``count`` most likely tokens of ``law`` [V] that carry mass, the drafted token left out."""
    if law is None:
        return []
    scores = law.clone()
    scores[drafted] = 0
    top = scores.topk(min(count, len(scores)))
    return top.indices[top.values > 0].tolist()


def interleaved(first: list[int], second: list[int], count: int) -> list[int]:
    """``first`` and ``second`` taken in turn, each token once, up to ``count``."""
    merged: list[int] = []
    for pair in zip(first + [-1] * len(second), second + [-1] * len(first), strict=True):
        for token in pair:
            if token >= 0 and token not in merged:
                merged.append(token)
    return merged[:count]


def stochastic_catch(r: torch.Tensor, law: torch.Tensor | None, draws: int) -> list[float]:
    """P(one of 0, 1, ..., ``draws`` independent draws from ``law`` is accepted) under recursive rejection sampling
    against the residual ``r``: stage s accepts with ``sum min(r_s, law)``, then ``r_{s+1} = norm(max(0, r_s -
    law))``."""
    if law is None:
        return [0.0] * (draws + 1)
    caught, missed, target = [0.0], 1.0, r
    for _ in range(draws):
        missed *= 1 - float(torch.minimum(target, law).sum().clamp(max=1))
        caught.append(1 - missed)
        target = normalized_residual(target, law)
    return caught


def pass_end(p: torch.Tensor, q: torch.Tensor, drafted: int, recovered: int, at: int, carried: bool,
             neighbour_law: torch.Tensor | None, uniform: float, count: int = max(CANDIDATES) - 1) -> End:
    """The :class:`End` of a pass rejecting ``drafted`` (law ``q`` [V]) against the target's ``p`` [V] at window
    place ``at``, where the target then committed ``recovered``; ``neighbour_law``: ``p_n`` (None where none);
    ``count``: the most alternatives a list holds."""
    r = normalized_residual(p, q)
    lists = {"carried": alternatives(q, drafted, count), "neighbour": alternatives(neighbour_law, drafted, count),
             "r-oracle": alternatives(r, drafted, count)}
    lists["both"] = interleaved(lists["carried"], lists["neighbour"], count)
    rank = {name: tokens.index(recovered) if recovered in tokens else count for name, tokens in lists.items()}
    catch = {name: [float(r[tokens[:m]].sum()) for m in range(count + 1)] for name, tokens in lists.items()}
    catch["neighbour draws"] = stochastic_catch(r, neighbour_law, count)
    return End(at, carried, float(torch.special.entr(q).sum()), rank, catch, uniform)


class Oracle(draft_sources.Recording):
    """A recording drafter (one row) that also notes every pass's :class:`End` (None where the pass kept every
    draft or ended past the image), keeping each token's latest target law for the neighbour source."""

    def __init__(self, inner: JacobiDrafter, grid: tuple[int, ...], num_tokens: int, seed: int = 0) -> None:
        super().__init__(inner)
        self.grid, self.num_tokens = grid, num_tokens
        self.ends: list[End | None] = []  # one per recorded pass
        self.drafts: list[list[int]] = []  # ... and the drafts it judged
        self.laws: torch.Tensor | None = None  # [N + L, V]: each token's latest law from the target
        self.reached = 0  # tokens 0 .. reached - 1 have one
        self.uniforms = torch.Generator().manual_seed(seed)

    def neighbour_law(self, token: int) -> torch.Tensor | None:
        """The latest law at ``token``'s grid neighbour, walking on to the neighbour's own where a pass has not
        reached it yet (as the neighbour drafter does); None for the first token."""
        source = grid_neighbour(torch.tensor(token), self.grid)
        while source >= self.reached:
            source = grid_neighbour(source, self.grid)
        return None if source < 0 else self.laws[source]

    def observe(self, result: Verification) -> None:
        if result.pos.shape[0] != 1:
            raise ValueError(f"the oracle records one row at a time, got a batch of {result.pos.shape[0]}")
        drafted, pos, accepted = result.drafts.shape[1], int(result.pos[0]), int(result.accepted[0])
        if drafted > 0:
            uniform = float(torch.rand((), generator=self.uniforms))
            end = None
            if accepted < drafted and pos + accepted < self.num_tokens:
                end = pass_end(result.probs[0, accepted], result.draft_probs[0, accepted],
                               int(result.drafts[0, accepted]), int(result.tokens[0, pos + accepted]), accepted,
                               accepted < int(self.carried_count[0]), self.neighbour_law(pos + accepted), uniform)
            self.ends.append(end)
            self.drafts.append(result.drafts[0].tolist())
        length = result.probs.shape[1]
        if self.laws is None:
            self.laws = result.probs.new_zeros(result.tokens.shape[1] + length, result.probs.shape[-1])
        self.laws[pos:pos + length] = result.probs[0]
        self.reached = max(self.reached, pos + length)
        super().observe(result)

    def produced(self) -> list[int]:
        """The tokens each recorded pass committed."""
        return [min(int(a[0]) + 1, self.num_tokens - int(p[0])) for p, _, a, _ in self.passes]


def merges(oracle: Oracle, source: str, k: int, depth: int, same_drafts: bool = False, levels: int = 1) -> int:
    """Passes a tree with k candidates from ``source`` at window places < BRANCHED saves in ``oracle``'s run: pass
    t + 1 merges into t when t's end is caught there and t + 1 committed at most ``depth`` tokens (with
    ``same_drafts``, only if the drafts t + 1 kept are the ones pass t held there, which the branch would judge).
    A tree of ``levels`` branch levels merges up to that many passes in a row; one level (a depth-1 tree): a merged
    pass merges nothing further."""
    ends, produced, drafts = oracle.ends, oracle.produced(), oracle.drafts
    saved, nested = 0, 0  # nested: passes merged into the current tree pass so far
    for t in range(len(produced) - 1):
        end = ends[t]
        fits = end is not None and end.at < BRANCHED and end.caught(source, k) and produced[t + 1] <= depth
        if fits and same_drafts:
            kept = drafts[t + 1][:int(oracle.passes[t + 1][2][0])]
            fits = drafts[t][end.at + 1:end.at + 1 + len(kept)] == kept
        if fits and nested < levels:
            saved, nested = saved + 1, nested + 1
        else:
            nested = 0
    return saved


def bucket(entropy: float) -> int:
    return sum(entropy >= edge for edge in ENTROPY_EDGES)


def bucket_names() -> list[str]:
    edges = ("0", *map(str, ENTROPY_EDGES))
    return [f"{lo}-{hi}" for lo, hi in zip(edges, edges[1:], strict=False)] + [f">={ENTROPY_EDGES[-1]}"]


def report(oracles: Sequence[Oracle], passes: int, tokens: int) -> str:
    """The catch and compression table, c by entropy bucket (k = 3) and the histogram of tokens per pass."""
    ends = [e for o in oracles for e in o.ends if e is not None]
    branched = [e for e in ends if e.at < BRANCHED]
    lines = [f"recorded: {tokens} tokens, {passes} passes, {tokens / passes:.2f}x; {len(ends)} ends at a rejection, "
             f"{len(branched) / max(len(ends), 1):.0%} at window place < {BRANCHED}, "
             f"{sum(e.carried for e in ends) / max(len(ends), 1):.0%} at a carried draft",
             "| source | k | c | c at j < 9 | " + " | ".join(f"d={d}" for d in DEPTHS)
             + " | d=8, same drafts | d=8, 2 levels |", "|---|---|---|---|" + "---|" * (len(DEPTHS) + 2)]
    for source in SOURCES:
        for k in CANDIDATES:
            c = sum(e.catch[source][k - 1] for e in ends) / max(len(ends), 1)
            c_branched = sum(e.catch[source][k - 1] for e in branched) / max(len(branched), 1)
            rates = [tokens / (passes - sum(merges(o, source, k, d, same, levels) for o in oracles))
                     for d, same, levels in [*((d, False, 1) for d in DEPTHS), (8, True, 1), (8, False, 2)]]
            lines.append(f"| {source} | {k} | {c:.2f} | {c_branched:.2f} | "
                         + " | ".join(f"{x:.2f}x" for x in rates) + " |")
    buckets = collections.defaultdict(list)
    for e in ends:
        buckets[bucket(e.entropy)].append(e)
    lines += ["c at k = 3 by H(q_c) (nats):", "| H | ends | " + " | ".join(SOURCES) + " |",
              "|---|---|" + "---|" * len(SOURCES)]
    for index, name in enumerate(bucket_names()):
        if buckets[index]:
            share = [sum(e.catch[s][2] for e in buckets[index]) / len(buckets[index]) for s in SOURCES]
            lines.append(f"| {name} | {len(buckets[index])} | " + " | ".join(f"{x:.2f}" for x in share) + " |")
    histogram = collections.Counter(n for o in oracles for n in o.produced())
    lines.append("tokens per pass (drafts kept + 1): " + ", ".join(f"{n}: {histogram[n]}" for n in sorted(histogram)))
    return "\n".join(lines)


def conditions(pipe: ImagePipeline, count: int) -> Iterator[Condition]:
    """One row each: a text model's held-out scene prompts, else classes in turn."""
    if pipe.text_conditional:
        prompts, _ = evaluation_prompts(count, PROMPT_SPLIT)
        cond = pipe.condition(None, prompts, None, None, None)[0]
        return (cond[i:i + 1] for i in range(count))
    return (torch.tensor([i % pipe.num_classes]) for i in range(count))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("specs", nargs="+", help="Jacobi-drafter sampler specs, name:key=value,... (mcsjd:window=32)")
    parser.add_argument("--model", default="shapes-c2i", help="embedded model name or pipeline folder")
    parser.add_argument("--images", type=int, default=16, help="images (clips) per spec, batch 1; a text model "
                                                               "draws held-out scene prompts, a class model classes")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads")
    args = parser.parse_args(argv)
    if args.images < 1:
        parser.error(f"--images must be at least 1, got {args.images}")
    torch.set_num_threads(args.threads)
    pipe = vgen.load(args.model)
    model, params = pipe.model, SamplingParams(**{k: v for k, v in pipe.info.defaults.items()
                                                  if k in SamplingParams.__dataclass_fields__})

    seeds = itertools.count()  # each run's stochastic-source uniforms apart

    def oracle(inner: JacobiDrafter) -> Oracle:
        return Oracle(inner, tuple(model.grid), model.num_tokens, seed=next(seeds))

    for spec in args.specs:
        oracles, passes = draft_sources.recorded(draft_sources.parse_spec(spec), model,
                                                 conditions(pipe, args.images), params, oracle)
        table = report(oracles, passes, args.images * model.num_tokens)
        print(f"## {args.model} {spec}, {args.images} images\n{table}", flush=True)


if __name__ == "__main__":
    main()
