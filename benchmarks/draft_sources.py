"""Where speculative passes end, and which drafts the target accepts, by where each draft came from.

For Jacobi-style drafters (``jacobi``, ``neighbour``): a draft is *carried* (the target's draw from an earlier pass)
or *fresh* (the drafter's guess at a position no pass reached). For each sampler spec this prints the step
compression, the acceptance rate of the drafts judged (those up to a pass's first rejection) by source, and where
passes end at a rejection: at a frame's or row's first token, at a row's second, or inside a row, and whether the
rejected draft was carried or fresh. It explains a step count: drafts rejected inside rows among the carried ones
bound what any initialisation of the fresh ones can give.

    python benchmarks/draft_sources.py --model shapes-c2i --images 8 mcsjd:window=16 mcsjd:window=16,drafter=neighbour
"""

from __future__ import annotations

import argparse
import collections
from collections.abc import Callable, Iterable

import torch
from torch import nn

import vgen
from vgen.models.conditioning import Condition
from vgen.samplers import Sampler, SamplingParams, get_sampler
from vgen.samplers.speculative import sampler as sampler_module
from vgen.samplers.speculative.drafters import Drafter, JacobiDrafter, Verification


class Recording(Drafter):
    """A Jacobi drafter that notes, for every pass, where its window started, how many drafts were carried and how
    many the target kept."""

    def __init__(self, inner: JacobiDrafter) -> None:
        super().__init__()
        self.inner, self.name = inner, inner.name
        self.carried_count: torch.Tensor | None = None
        self.passes: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]] = []  # pos, carried, accepted, J

    def propose(self, tokens: torch.Tensor, pos: torch.Tensor, count: int,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        carried = self.inner.carried
        self.carried_count = torch.zeros_like(pos) if carried is None else carried[2].clone()
        return self.inner.propose(tokens, pos, count, generator)

    def observe(self, result: Verification) -> None:
        if result.drafts.shape[1] > 0:
            self.passes.append((result.pos.clone(), self.carried_count, result.accepted.clone(),
                                result.drafts.shape[1]))
        self.inner.observe(result)


def parse_spec(spec: str) -> Sampler:
    """The sampler of a spec ``name:key=value,...`` (e.g. ``mcsjd:window=32``)."""
    name, _, options = spec.partition(":")
    return get_sampler(name, **{k: int(v) if v.isdigit() else v
                                for k, v in (kv.split("=") for kv in options.split(",") if kv)})


def recorded(sampler: Sampler, model: nn.Module, conditions: Iterable[Condition], params: SamplingParams,
             record: Callable[[JacobiDrafter], Recording] = Recording) -> tuple[list[Recording], int]:
    """Run ``sampler`` once per condition (one row each, seeded by its place in ``conditions``) with every run's
    drafter wrapped by ``record``: the recorders, one per run, and the forward passes of all runs."""
    build = sampler_module.build_drafter
    recorders: list[Recording] = []

    def recording(*inputs: object) -> Recording:
        recorders.append(record(build(*inputs)))
        return recorders[-1]

    sampler_module.build_drafter = recording
    try:
        passes = sum(sampler.sample(model, cond, params, generator=torch.Generator().manual_seed(i))
                     .stats.forward_passes for i, cond in enumerate(conditions))
    finally:
        sampler_module.build_drafter = build
    return recorders, passes


def place(token: int, grid: tuple[int, ...]) -> str:
    """Where ``token`` sits: a frame's first token, a row's first or second, or inside a row."""
    width = grid[-1]
    if len(grid) == 3 and token % (grid[1] * width) == 0:
        return "frame start"
    return {0: "row start", 1: "row 2nd"}.get(token % width, "inside row")


def tally(passes: list, grid: tuple[int, ...], n: int) -> tuple[collections.Counter, collections.Counter,
                                                                   collections.Counter]:
    """Drafts judged and kept by source, and pass-ending rejections by (place, source)."""
    judged, kept, ends = collections.Counter(), collections.Counter(), collections.Counter()
    for pos, carried, accepted, count in passes:
        for p, c, a in zip(pos.tolist(), carried.tolist(), accepted.tolist(), strict=True):
            if p >= n:
                continue
            for j in range(min(a + 1, count, n - p - 1)):  # the kept drafts and the first rejected one
                source = "carried" if j < c else "fresh"
                judged[source] += 1
                kept[source] += j < a
            if a < count and p + a < n - 1:
                ends[place(p + a, grid), "carried" if a < c else "fresh"] += 1
    return judged, kept, ends


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("specs", nargs="+", help="sampler specs, name:key=value,... (e.g. mcsjd:window=32)")
    parser.add_argument("--model", default="shapes-c2i", help="embedded model name or pipeline folder")
    parser.add_argument("--images", type=int, default=8, help="images (clips) per spec, classes in turn, batch 1")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    pipe = vgen.load(args.model)
    model, params = pipe.model, SamplingParams(**{k: v for k, v in pipe.info.defaults.items()
                                                  if k in SamplingParams.__dataclass_fields__})
    for spec in args.specs:
        classes = (torch.tensor([i % pipe.num_classes]) for i in range(args.images))
        recorders, passes = recorded(parse_spec(spec), model, classes, params)
        judged, kept, ends = tally([p for r in recorders for p in r.passes], tuple(model.grid), model.num_tokens)
        total = sum(ends.values())
        rates = ", ".join(f"{s} {kept[s]}/{judged[s]} = {kept[s] / max(judged[s], 1):.2f}"
                          for s in ("carried", "fresh"))
        where = ", ".join(f"{w}/{s} {v / total:.0%}" for (w, s), v in sorted(ends.items()))
        print(f"{spec}: {args.images * model.num_tokens / passes:.2f}x; accepted {rates}; {total} rejections: {where}",
              flush=True)


if __name__ == "__main__":
    main()
