"""Tree verify passes: several candidates per window position, judged in one forward pass, losslessly.

A single-draft pass (:func:`~vgen.samplers.speculative.sampler.verify_pass`) ends at its first rejected draft, where
the target commits a recovered token drawn from ``norm(max(0, p - q))``. A tree pass also lays out, at chosen
window columns, **alternatives** to the carried draft: the carried law's next most likely tokens (where that law
has no other mass, the grid neighbour's token), each a deterministic candidate given the draft (its law one-hot),
each followed by the chain's later drafts. One forward
pass over the tree (:meth:`LlamaGen.decode_rows` with ``tree=``: every node at the slot after the last, rotated at
its depth, attending to its ancestors) gives the target's law after every node, and recursive rejection sampling
(:mod:`~vgen.samplers.speculative.multidraft`) walks it: at a node, the children are judged in turn against the
stage targets ``p_1 = p``, ``p_{s+1} = norm(max(0, p_s - q_s))``; where none is kept, the token comes from the last
stage target. The token committed at each position is then exactly a draw from ``p`` whatever the candidates were,
as long as each candidate's law given the ones before it is the law it declares and the tree depends only on what
was known before the pass. Both hold here: the carried draft is an exact sample of its carried law (MC-SJD's
coupling argument, unchanged: the walk judges only positions it commits), an alternative is a function of the
carried law and the draft, and the planner reads only earlier passes.

A caught rejection keeps the pass going down the alternative's line, whose later nodes are the chain's drafts in the
alternative's context. The accepted line's keys and values are moved to their sequence slots afterwards
(:meth:`~vgen.models.cache.KVCache.move_slots`), so no second pass is needed.

:class:`BranchPlanner` picks the tree before each pass from the entropy of each column's carried law and online
tables of how often carried drafts are kept and alternatives catch a rejection, adding a branch only while the
expected tokens per pass grow faster than the pass's cost (in one-token passes, per node past a free width).
On a CPU, where nodes cost almost as much as window positions, it adds few or none; on a GPU, where a pass costs
about the same up to a width, it branches at every column where alternatives catch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from vgen.models.cache import KVCache
from vgen.samplers.base import SamplingParams
from vgen.samplers.logits import inverse_cdf, target_probs
from vgen.samplers.speculative.drafters import Drafter, Verification
from vgen.samplers.speculative.multidraft import tree_accept_probs, tree_residual, tree_walk
from vgen.samplers.speculative.rules import written
from vgen.samplers.speculative.tree import TreeShape


@dataclass(frozen=True)
class Branch:
    """Alternatives at draft column ``column`` of the window (node ``column + 1`` of the chain): ``alternatives``
    of them, each the head of a line ``depth`` nodes long (the alternative, then the chain's later drafts)."""

    column: int
    alternatives: int
    depth: int


@dataclass(frozen=True)
class TreeLayout:
    """A tree over a window of ``length`` (root + drafts) and, per node, the draft column whose position it fills
    (-1: the root) and its ``rank``: 0 for the carried draft, s for the column's s-th alternative."""

    shape: TreeShape
    column: torch.Tensor
    rank: torch.Tensor


@functools.lru_cache(maxsize=256)
def tree_layout(length: int, branches: tuple[Branch, ...]) -> TreeLayout:
    """The chain (root, then drafts 0 .. length - 2) followed by each branch's lines, cut at the window's end."""
    parents, column, rank = list(range(-1, length - 1)), list(range(-1, length - 1)), [0] * length
    for branch in branches:
        if not 0 <= branch.column < length - 1:
            raise ValueError(f"branch column {branch.column} lies outside a window of {length - 1} drafts")
        for s in range(1, branch.alternatives + 1):
            parent = branch.column  # the chain node before the column
            for c in range(branch.column, min(branch.column + branch.depth, length - 1)):
                parents.append(parent)
                column.append(c)
                rank.append(s if c == branch.column else 0)
                parent = len(parents) - 1
    return TreeLayout(TreeShape.from_parents(parents), torch.tensor(column), torch.tensor(rank))


@dataclass(frozen=True)
class PassPlan:
    """One pass's tree (``layout``; no branches: the single-draft pass) and what the planner learns from after it:
    the columns' table buckets and whether each lies inside a running row's image [B, J], the alternatives and
    their validity [B, J, S]."""

    layout: TreeLayout
    buckets: torch.Tensor
    live: torch.Tensor
    alternatives: torch.Tensor
    alternative_valid: torch.Tensor

    @property
    def branched(self) -> bool:
        return self.layout.shape.size > self.live.shape[1] + 1


def draft_alternatives(q: torch.Tensor, drafts: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor, stride: int,
                 count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to ``count`` alternatives to each draft [B, J] of windows at ``pos`` [B], and whether each is one: the
    most likely tokens of the carried law ``q`` [B, J, V] other than the draft, and in the first slot that law
    leaves empty (a fresh draft's one-hot law, a greedy run's) the grid neighbour's token (``stride`` back: the
    token above, or a frame back; the left one on the first row), committed or drafted before the pass, where it
    differs from the draft and the others. Tokens and valid [B, J, count]; every one is fixed before the pass."""
    others = q.scatter(-1, drafts[..., None], -1.0)
    values, top = others.topk(count, dim=-1)
    has_mass = values > 0
    index = pos[:, None] + torch.arange(drafts.shape[1], device=pos.device)
    source = torch.where(index >= stride, index - stride, index - 1)
    rel = source - pos[:, None]  # < 0: a committed token
    neighbour = torch.where(rel >= 0, drafts.gather(1, rel.clamp(min=0)), tokens.gather(1, source.clamp(min=0)))
    fresh_token = (neighbour != drafts) & (index >= 1) & ~((top == neighbour[..., None]) & has_mass).any(-1)
    slots = torch.arange(count, device=pos.device)
    first_empty = torch.where(has_mass, count, slots).amin(-1)  # [B, J]
    takes = (slots == first_empty[..., None]) & fresh_token[..., None]
    return torch.where(takes, neighbour[..., None], top), has_mass | takes


def node_inputs(layout: TreeLayout, root: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor,
                alternatives: torch.Tensor, alternative_valid: torch.Tensor,
                draft_valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each node's token [B, T], declared law [B, T, V] and validity [B, T]: the root's token ``root`` [B]; a
    carried node's draft and law; an alternative's token with a one-hot law (deterministic given the draft); a node
    is valid where its position is inside the image (``draft_valid`` [B, J]) and, on an alternative's line, where
    the alternative has mass."""
    column, rank = layout.column.to(drafts.device), layout.rank.to(drafts.device)
    col = column.clamp(min=0)
    tokens = drafts[:, col]
    alt_rank = (rank - 1).clamp(min=0)
    alt_tokens = alternatives[:, col, alt_rank]
    is_alt = rank > 0
    tokens = torch.where(is_alt, alt_tokens, tokens)
    tokens = torch.where(column < 0, root[:, None], tokens)
    laws = torch.where(is_alt[None, :, None], nn.functional.one_hot(tokens, q.shape[-1]).to(q.dtype), q[:, col])
    valid = torch.where(column < 0, True, draft_valid[:, col])
    # a line is valid where its head alternative is: its head's column and rank, carried down the line
    head = line_heads(layout)
    head_col, head_rank = column[head].clamp(min=0), (rank[head] - 1).clamp(min=0)
    valid &= torch.where(head >= 0, alternative_valid[:, head_col, head_rank], True)
    return tokens, laws, valid


@functools.lru_cache(maxsize=256)
def _line_heads(parent: tuple[int, ...], rank: tuple[int, ...]) -> torch.Tensor:
    heads = []
    for node, up in enumerate(parent):
        heads.append(node if rank[node] > 0 else (heads[up] if up >= 0 else -1))
    return torch.tensor(heads)


def line_heads(layout: TreeLayout) -> torch.Tensor:
    """Per node, the alternative its line starts at (-1 on the chain)."""
    return _line_heads(tuple(layout.shape.parent.tolist()), tuple(layout.rank.tolist())).to(layout.rank.device)


@functools.lru_cache(maxsize=256)
def _descents(parent: tuple[int, ...], stage: tuple[int, ...], depth: tuple[int, ...], length: int) -> torch.Tensor:
    first_child = [-1] * len(parent)
    for node, up in enumerate(parent):
        if up >= 0 and stage[node] == 0:
            first_child[up] = node
    table = torch.full((len(parent), length), -1, dtype=torch.long)
    for node in range(len(parent)):
        below = node
        while below >= 0 and depth[below] < length:
            table[node, depth[below]] = below
            below = first_child[below]
    return table


def descents(shape: TreeShape, length: int) -> torch.Tensor:
    """[T, length]: for each node, the node at each depth on its line of first children (itself at its own depth),
    -1 elsewhere. A node's first child is the carried draft or the line's next draft, valid wherever the node's
    next position is inside the image, so this is where a row's next window reads the target's laws from."""
    return _descents(tuple(shape.parent.tolist()), tuple(shape.stage.tolist()), tuple(shape.depth.tolist()),
                     length)


def preferred_line(shape: TreeShape, path: torch.Tensor, accepted: torch.Tensor, stop: torch.Tensor,
                   length: int) -> torch.Tensor:
    """The nodes [B, length] whose laws a row's next window reads: the walked path, then the stop node's line of
    first children, then, past that line's end, the chain's nodes (laws in the chain's context: the same guesses a
    single-draft pass carries after a rejection)."""
    below = descents(shape, length).to(path.device)[stop]
    columns = torch.arange(length, device=path.device)
    line = torch.where(columns[None] <= accepted[:, None], path[:, :length], below)
    return torch.where(line >= 0, line, columns[None])


def verify_tree_pass(model: nn.Module, params: SamplingParams, layout: TreeLayout, tokens: torch.Tensor,
                     steps: torch.Tensor, pos: torch.Tensor, passes: torch.Tensor, drafts: torch.Tensor,
                     q: torch.Tensor, cache: KVCache, uniforms: tuple[torch.Tensor | None, torch.Tensor,
                                                                     torch.Tensor | None],
                     tree_uniforms: torch.Tensor, alternatives: torch.Tensor,
                     alternative_valid: torch.Tensor) -> tuple:
    """:func:`~vgen.samplers.speculative.sampler.verify_pass` over a draft tree (``layout``) with the exact rule.

    ``uniforms`` are a single-draft pass's (:func:`pass_uniforms`: proposals [B, L], acceptance [B, L - 1] for the
    chain's nodes, recovery [B]); ``tree_uniforms`` [B, T - L] judge the branch nodes. With no branches the pass is
    the single-draft pass with the exact rule, draw for draw. Returns ``verify_pass``'s tuple (with the target's
    laws and proposals along each row's :func:`preferred_line`), then the walked path and each node's validity."""
    n, batch, length = model.num_tokens, drafts.shape[0], drafts.shape[1] + 1
    shape = layout.shape
    active = pos < n
    passes = passes + active.any()
    depth = shape.depth.to(pos.device)
    draft_valid = pos[:, None] + torch.arange(length - 1, device=pos.device) < n
    root = tokens.gather(1, (pos - 1)[:, None])[:, 0]
    node_tokens, node_q, valid = node_inputs(layout, root, drafts, q, alternatives, alternative_valid, draft_valid)
    window, starts = (torch.cat([node_tokens, node_tokens]), torch.cat([pos, pos])) if params.guided else (
        node_tokens, pos)
    logits = model.decode_rows(window, starts, cache, tree=shape)
    index = pos[:, None] + depth  # the image token each node's law predicts
    p = target_probs(logits, params, index)
    proposal_uniforms, accept_uniforms, recovery_uniforms = uniforms
    judge = torch.cat([torch.zeros_like(accept_uniforms[:, :1]), accept_uniforms, tree_uniforms], dim=1)
    accept = tree_accept_probs(shape, p, node_tokens, node_q, valid)
    path, accepted, stop = tree_walk(shape, accept, judge, valid)
    line = preferred_line(shape, path, accepted, stop, length)
    line_p = p.gather(1, line.clamp(min=0)[..., None].expand(-1, -1, p.shape[-1]))
    proposals = (line_p.argmax(-1) if proposal_uniforms is None
                 else inverse_cdf(line_p, proposal_uniforms, torch.float32))
    residual = tree_residual(shape, p, node_q, valid, stop)
    recovered = residual.argmax(-1) if recovery_uniforms is None else inverse_cdf(residual, recovery_uniforms)
    children = shape.children().to(pos.device)[stop]
    has_children = ((children >= 0) & valid.gather(1, children.clamp(min=0))).any(1)
    nxt = pos + accepted
    emits = nxt < n
    bonus = proposals.gather(1, accepted.clamp(max=length - 1)[:, None])[:, 0]
    token = torch.where(has_children, recovered, bonus)
    path_tokens = node_tokens.gather(1, path[:, 1:length].clamp(min=0))
    offsets = torch.arange(length - 1, device=pos.device)
    kept = offsets[None] < accepted[:, None]
    target_index = pos[:, None] + offsets
    tokens = written(tokens, target_index, path_tokens, kept)
    steps = written(steps, target_index, passes.expand_as(path_tokens), kept)
    tokens = written(tokens, nxt[:, None], token[:, None], emits[:, None])
    steps = written(steps, nxt[:, None], passes.expand(batch, 1), emits[:, None])
    commit_path(model, cache, pos, path, depth, params.guided)
    return (tokens, steps, (nxt + emits.long()).clamp(max=n), passes, line_p, proposals, accepted, None,
            torch.where(active, accepted + emits.long(), -1), path, valid)


def commit_path(model: nn.Module, cache: KVCache, pos: torch.Tensor, path: torch.Tensor, depth: torch.Tensor,
                guided: bool) -> None:
    """Move the keys and values of each row's accepted path to its sequence slots: a node off the chain sits at
    slot ``root + node`` and belongs at ``root + depth``."""
    nodes = path[:, 1:]
    move = nodes > torch.arange(1, path.shape[1], device=path.device)  # off the chain (a chain node is its depth)
    if not bool(move.any()):
        return
    root = model.tree_root_slots(pos, cache)[:, None]
    src, dst = root + nodes.clamp(min=0), root + depth[nodes.clamp(min=0)]
    if guided:
        src, dst, move = torch.cat([src, src]), torch.cat([dst, dst]), torch.cat([move, move])
    cache.move_slots(src, dst, move)


def tree_step(model: nn.Module, params: SamplingParams, plan: PassPlan, drafter: Drafter, tokens: torch.Tensor,
              steps: torch.Tensor, pos: torch.Tensor, passes: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor,
              cache: KVCache, uniforms: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None],
              generator: torch.Generator | None) -> tuple:
    """One tree pass of a planned run (``plan`` from :meth:`BranchPlanner.prepare` for the drafts ``drafts`` and
    laws ``q``): verify the tree, tell the drafter. Returns the new tokens, steps, pos, pass count, the tokens each
    row produced (-1: the row was done), the accepted lengths, the walked path and whether each row's stop node had
    children judged."""
    batch, length = drafts.shape[0], drafts.shape[1] + 1
    shape = plan.layout.shape
    tree_uniforms = torch.rand(batch, shape.size - length, generator=generator, device=pos.device)
    out = verify_tree_pass(model, params, plan.layout, tokens, steps, pos, passes, drafts, q, cache, uniforms,
                           tree_uniforms, plan.alternatives, plan.alternative_valid)
    tokens, steps, next_pos, passes, line_p, proposals, accepted, _, produced, path, valid = out
    drafter.observe(Verification(pos, accepted, line_p, proposals, None, tokens, drafts, q, generator))
    children = shape.children().to(pos.device)[path.gather(1, accepted[:, None])[:, 0]]
    judged_stop = ((children >= 0) & valid.gather(1, children.clamp(min=0))).any(1)
    return tokens, steps, next_pos, passes, produced, accepted, path, judged_stop
