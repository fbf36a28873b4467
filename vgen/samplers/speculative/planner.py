"""Which draft tree a pass verifies: branches where they are expected to pay, from what earlier passes showed.

Before each pass the planner reads, for every draft column of the window, the entropy of its carried law (a fresh
column, with a one-hot law, has a bucket of its own) and how far the column lies from the window's root, and three
online tables, each a running mean over the positions earlier passes judged, started from a prior worth a few
observations:

- ``kept[h, c]``: how often a carried draft in entropy bucket ``h`` at column bucket ``c`` was accepted. The column
  matters: after a rejection the root is the recovered token, and a carried draft's law was computed with the
  rejected one in its context, one position back at column 0, further back at later columns, so the first column
  is kept least;
- ``catch[h, c, s]``: at a rejected carried draft, how often the committed token was the carried law's ``s``-th
  alternative (counted whether or not the pass had that branch, so the table learns about branches it never built);
- ``line``: how often a draft on a caught alternative's line (the chain's draft in a new context) was accepted.

A branch's worth is the expected tokens it adds to a pass (the chance the walk reaches its column, is rejected
there, and the alternative catches, times the tokens down its line); a pass of T nodes costs
``1 + node_cost * max(0, T - free_nodes)`` one-token passes: on a GPU a pass costs about one step up to a width
(``free_nodes``), then grows; on a CPU it grows from the first node. Alternatives are added best first, while tokens
per unit of cost still grow. The plan depends only on earlier passes, so it leaves the output law alone.

Planning costs host work on every pass (on this project's CPU about 1.5 ms, a fifth of a compiled pass), so before
it the planner asks whether any branch could pay: the tables' most favourable case (the least-kept cell's rejection, the
best first alternative's catch, a whole line at the line rate, the column surely reached) against the recent tokens
per pass (a running average). Where even that does not pay, as at a CPU's cost, the pass is the single-draft pass
without planning or learning.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vgen.samplers.speculative.tree_pass import (
    Branch,
    PassPlan,
    draft_alternatives,
    line_heads,
    tree_layout,
)

ENTROPY_EDGES = (0.01, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0)  # nats; the last bucket holds fresh (one-hot) columns
COLUMN_EDGES = (1, 2, 4, 8)  # window columns 0, 1, 2-3, 4-7 and 8 on: the rejected token's distance, less one
PRIOR_WEIGHT = 8.0  # pseudo-observations behind each prior
# on the embedded image models (docs/samplers.md): carried drafts were kept 74% of the time; the carried law's next
# tokens caught about a third of the rejections at k = 3, the neighbour's token less; a caught line's drafts were kept
# 77-80% of the time (shapes-c2i, window 32)
PRIOR_KEPT, PRIOR_CATCH, PRIOR_NEIGHBOUR, PRIOR_LINE = 0.74, (0.2, 0.12, 0.06, 0.04), 0.15, 0.78
RECENT_WEIGHT = 0.25  # the weight of the latest pass in the running tokens per pass
PRIOR_TOKENS = 3.0  # tokens per pass before the first
# (node_cost, free_nodes) where not measured: shapes-c2i's k-token pass on this project's CPU (1.6 steps at 16 tokens,
# 2.35 at 32); a GPU's pass is about one step wide up to a hundred-odd tokens (benchmarks/tree_speed.py measures it)
DEVICE_PASS_COST = {"cpu": (0.05, 1), "cuda": (0.004, 128)}


def entropy_buckets(q: torch.Tensor) -> torch.Tensor:
    """The bucket [B, J] of each carried law ``q`` [B, J, V]; one-hot (fresh) laws take the last one."""
    entropy = -(q * q.clamp_min(1e-30).log()).sum(-1)
    fresh = q.amax(-1) >= 1.0
    bucket = torch.bucketize(entropy, torch.tensor(ENTROPY_EDGES, dtype=entropy.dtype, device=q.device))
    return torch.where(fresh, len(ENTROPY_EDGES) + 1, bucket)


def column_buckets(columns: int) -> torch.Tensor:
    """The bucket [columns] of each draft column of a window (:data:`COLUMN_EDGES`)."""
    return torch.bucketize(torch.arange(columns), torch.tensor(COLUMN_EDGES), right=True)


@dataclass
class RunningMean:
    """Successes and trials seen per cell, and a prior mean worth ``PRIOR_WEIGHT`` trials that the estimate starts
    from."""

    prior_mean: torch.Tensor
    hits: torch.Tensor
    trials: torch.Tensor

    @classmethod
    def prior(cls, mean: torch.Tensor) -> RunningMean:
        mean = mean.double()
        return cls(mean, torch.zeros_like(mean), torch.zeros_like(mean))

    def mean(self) -> torch.Tensor:
        """The estimate per cell: the prior's pseudo-trials and the trials seen together."""
        return (self.prior_mean * PRIOR_WEIGHT + self.hits) / (PRIOR_WEIGHT + self.trials)

    def seen(self, dims: tuple[int, ...] = ()) -> list[float] | float | None:
        """The success rate of the trials seen, summed over the cells' ``dims`` (all of them: one number; None
        where nothing was seen)."""
        hits, trials = (self.hits.sum(dims), self.trials.sum(dims)) if dims else (self.hits.sum(), self.trials.sum())
        rate = (hits / trials.clamp_min(1)).tolist()
        if isinstance(rate, list):
            return [r if t > 0 else None for r, t in zip(rate, trials.tolist(), strict=True)]
        return rate if float(trials) > 0 else None

    def add(self, index: tuple[torch.Tensor, ...], hits: torch.Tensor) -> None:
        self.hits.index_put_(index, hits.double(), accumulate=True)
        self.trials.index_put_(index, torch.ones_like(hits, dtype=torch.float64), accumulate=True)


class BranchPlanner:
    """Plans each pass's branches (module docstring): at most ``max_alternatives`` a column, lines ``line_depth``
    nodes deep, a pass costing ``1 + node_cost * max(0, T - free_nodes)`` one-token passes at T nodes."""

    def __init__(self, max_alternatives: int, line_depth: int, node_cost: float, free_nodes: int = 1) -> None:
        buckets, columns = len(ENTROPY_EDGES) + 2, len(COLUMN_EDGES) + 1
        self.max_alternatives, self.line_depth = max_alternatives, line_depth
        self.node_cost, self.free_nodes = node_cost, free_nodes
        self.kept = RunningMean.prior(torch.full((buckets, columns), PRIOR_KEPT))
        catch = torch.tensor((PRIOR_CATCH * max_alternatives)[:max_alternatives], dtype=torch.float64)
        # a fresh column's one alternative is its grid neighbour's token, which caught less often than the carried
        # law's top in the same measurements
        catch = catch.expand(buckets, columns, -1).clone()
        catch[-1] = 0.0
        catch[-1, :, 0] = PRIOR_NEIGHBOUR
        self.catch = RunningMean.prior(catch)
        self.line = RunningMean.prior(torch.tensor(PRIOR_LINE))
        self.recent_tokens = PRIOR_TOKENS
        # the tables' best chance that a first alternative catches, and the line rate (kept until they change)
        self.best_case: tuple[float, float] | None = None
        # passes observed, their nodes, their rows, the rows that took an alternative, and passes left unplanned
        self.passes = self.nodes = self.rows = self.catches = self.unplanned = 0

    def pays(self, columns: int) -> bool:
        """Whether a branch could pay in a pass over ``columns`` draft columns (module docstring); counts the pass
        as unplanned when not."""
        nodes, depth = columns + 1, min(self.line_depth, columns)
        if self.max_alternatives == 0 or columns == 0:
            return False
        extra = self.cost(nodes + depth) - self.cost(nodes)
        if extra <= 0:
            return True
        if self.best_case is None:  # the tables change only when a pass is planned
            self.best_case = (float((1 - self.kept.mean()).max() * self.catch.mean()[..., 0].max()),
                              float(self.line.mean()))
        catch, line_rate = self.best_case
        best = catch * sum(line_rate ** t for t in range(depth))
        tokens, cost = self.recent_tokens, self.cost(nodes)
        if (tokens + best) / (cost + extra) > tokens / cost:
            return True
        self.unplanned += 1
        return False

    def count(self, produced: torch.Tensor) -> None:
        """Add a pass's tokens per row (``produced`` [B], -1 for a row that was done) to the running average."""
        made = produced[produced >= 0]
        if made.numel():
            self.recent_tokens += RECENT_WEIGHT * (float(made.double().mean()) - self.recent_tokens)

    def prepare(self, q: torch.Tensor, drafts: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor, stride: int,
                num_tokens: int) -> PassPlan:
        """The plan of a pass over the drafts [B, J] with laws ``q`` of windows at ``pos`` (``stride``: the grid's
        step to a token's neighbour, for :func:`draft_alternatives`; ``num_tokens``: the image's length)."""
        alternatives, valid = draft_alternatives(q, drafts, tokens, pos, stride, self.max_alternatives)
        live = pos[:, None] + torch.arange(drafts.shape[1], device=pos.device) < num_tokens
        buckets = entropy_buckets(q).cpu()
        layout = tree_layout(drafts.shape[1] + 1, self.plan(buckets, live.cpu()))
        return PassPlan(layout, buckets, live.cpu(), alternatives, valid)

    def plan(self, buckets: torch.Tensor, live: torch.Tensor) -> tuple[Branch, ...]:
        """The branches of the next pass for columns in ``buckets`` [B, J] (host tensor) of rows ``live`` [B, J]
        (a column inside a running row's image)."""
        if self.max_alternatives == 0 or buckets.shape[1] == 0 or not bool(live.any()):
            return ()
        rows = live.any(1)
        buckets, live = buckets[rows], live[rows]
        columns = buckets.shape[1]
        places = column_buckets(columns).expand_as(buckets)
        kept = torch.where(live, self.kept.mean()[buckets, places], 0.0)  # [R, J]
        reach = torch.cumprod(torch.cat([torch.ones_like(kept[:, :1]), kept[:, :-1]], 1), 1)
        catch = torch.where(live[..., None], self.catch.mean()[buckets, places], 0.0)  # [R, J, S]
        line_kept = float(self.line.mean())
        lengths = [min(self.line_depth, columns - j) for j in range(columns)]
        line_tokens = torch.tensor([sum(line_kept ** t for t in range(d)) for d in lengths], dtype=torch.float64)
        # expected gain of each column's s-th alternative, averaged over the rows that share the tree
        gain = (reach * (1 - kept))[..., None] * catch * line_tokens[None, :, None]
        gain = gain.mean(0).tolist()  # [J][S]
        tokens = float((reach * kept).sum(1).mean()) + 1.0  # the chain's expected tokens a pass
        nodes = columns + 1
        taken = [0] * columns
        while True:
            best, best_ratio = None, 0.0
            for j in range(columns):
                s = taken[j]
                if s < self.max_alternatives and gain[j][s] / lengths[j] > best_ratio:
                    best, best_ratio = j, gain[j][s] / lengths[j]
            if best is None:
                break
            more, extra = gain[best][taken[best]], lengths[best]
            if (tokens + more) / self.cost(nodes + extra) <= tokens / self.cost(nodes):
                break
            tokens, nodes, taken[best] = tokens + more, nodes + extra, taken[best] + 1
        return tuple(Branch(j, s, self.line_depth) for j, s in enumerate(taken) if s)

    def summary(self) -> dict[str, float]:
        """What the run's trees were: the share of passes planned, nodes a planned pass, the share of row-passes
        that took an alternative, and the tables' rates over the trials seen (carried drafts kept, in all and by
        column bucket; the committed token at a rejected carried draft being each alternative rank; a caught line's
        drafts kept)."""
        return {"planned_share": self.passes / max(self.passes + self.unplanned, 1),
                "tree_nodes_per_pass": self.nodes / max(self.passes, 1),
                "caught_share": self.catches / max(self.rows, 1),
                "carried_kept": self.kept.seen(), "carried_kept_by_column": self.kept.seen((0,)),
                "catch_by_rank": self.catch.seen((0, 1)), "line_kept": self.line.seen()}

    def max_nodes(self, length: int) -> int:
        """The most nodes a tree over a window of ``length`` holds (the cache's room past the last token): every
        column with all its alternatives, each line cut at the window's end."""
        return length + self.max_alternatives * sum(min(self.line_depth, length - 1 - j) for j in range(length - 1))

    def cost(self, nodes: int) -> float:
        """A pass over ``nodes`` in one-token passes."""
        return 1.0 + self.node_cost * max(0, nodes - self.free_nodes)

    def learn(self, plan: PassPlan, pos: torch.Tensor, tokens: torch.Tensor, accepted: torch.Tensor,
              path: torch.Tensor | None = None, judged_stop: torch.Tensor | None = None) -> None:
        """:meth:`observe` a pass at ``pos`` that left ``tokens`` and ``accepted``; without ``path`` (and
        ``judged_stop``) the pass was the chain's: a path along it, its stop's child judged where it lies inside the
        image."""
        columns = plan.live.shape[1]
        if columns == 0:  # a window of one token: nothing drafted, nothing to learn
            self.passes, self.nodes = self.passes + 1, self.nodes + 1
            return
        index = pos[:, None] + torch.arange(columns, device=pos.device)
        committed = tokens.gather(1, index.clamp(max=tokens.shape[1] - 1))
        if path is None:
            depth = torch.arange(columns + 1, device=pos.device)
            path = torch.where(depth[None] <= accepted[:, None], depth[None], -1)
            inside = plan.live.to(pos.device).gather(1, accepted.clamp(max=max(columns - 1, 0))[:, None])[:, 0]
            judged_stop = (accepted < columns) & inside
        self.observe(plan, path.cpu(), accepted.cpu(), judged_stop.cpu(), committed.cpu())

    def observe(self, plan: PassPlan, path: torch.Tensor, accepted: torch.Tensor, judged_stop: torch.Tensor,
                committed: torch.Tensor) -> None:
        """Update the tables from the pass ``plan`` planned: the walked ``path`` [B, L] (node per depth, -1 past the
        stop), ``accepted`` [B], whether the stop node's children were judged [B] and the tokens committed at the
        window's columns [B, J] (host tensors)."""
        layout, buckets, live = plan.layout, plan.buckets, plan.live
        alternatives, alternative_valid = plan.alternatives.cpu(), plan.alternative_valid.cpu()
        self.best_case = None
        columns = buckets.shape[1]
        self.passes, self.nodes = self.passes + 1, self.nodes + layout.shape.size
        if columns == 0:
            return
        batch = torch.arange(path.shape[0])
        self.rows += path.shape[0]
        depth = torch.arange(1, columns + 1)
        on_chain = path[:, 1:columns + 1] == depth[None]  # [B, J]
        judged = (depth[None] - 1 < accepted[:, None]) | ((depth[None] - 1 == accepted[:, None])
                                                          & judged_stop[:, None])
        judged &= live
        # the first column where the walk left the chain (a caught rejection) or stopped on it
        left = torch.where(~on_chain, depth[None] - 1, columns).amin(1)
        first_off = torch.minimum(left, accepted)
        chain_judged = judged & (depth[None] - 1 <= first_off[:, None])
        chain_kept = on_chain & (depth[None] - 1 < accepted[:, None])
        places = column_buckets(columns).expand_as(buckets)
        self.kept.add((buckets[chain_judged], places[chain_judged]), chain_kept[chain_judged])
        # the catch at the first rejected carried draft, whether or not its branch was built
        at = first_off.clamp(max=columns - 1)
        rejected = chain_judged[batch, at] & ~chain_kept[batch, at]
        if bool(rejected.any()):
            rows = batch[rejected]
            alts, ok = alternatives[rows, at[rows]], alternative_valid[rows, at[rows]]
            hits = (alts == committed[rows, at[rows]][:, None]) & ok
            ranks = torch.arange(alts.shape[1])
            cells = (buckets[rows, at[rows]][:, None].expand_as(hits), places[rows, at[rows]][:, None].expand_as(hits),
                     ranks[None].expand_as(hits))
            self.catch.add(cells, hits)
        # drafts on a caught line: kept up to the stop, the stop's child rejected if judged
        heads = line_heads(layout)
        on_line = (heads[path[:, 1:columns + 1].clamp(min=0)] >= 0) & (path[:, 1:columns + 1] >= 0)
        self.catches += int(on_line.any(1).sum())
        continuation = on_line & (path[:, 1:columns + 1] != heads[path[:, 1:columns + 1].clamp(min=0)])
        line_kept = int((continuation & judged).sum())
        stopped_on_line = judged_stop & on_line[batch, (accepted - 1).clamp(min=0, max=columns - 1)] & (accepted > 0)
        trials = line_kept + int(stopped_on_line.sum())
        if trials:
            self.line.hits += line_kept
            self.line.trials += trials
