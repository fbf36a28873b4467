"""Lossless verification of several candidates per position: recursive rejection sampling (SpecInfer's multi-step
speculative sampling; RSD when the candidates are drawn without replacement).

At a node with target law ``p`` (the law of the token after it), the children ``c_1 .. c_m`` in stage order carry
tokens ``x_s``, each drawn from a **known** law ``q_s`` that may depend on ``x_1 .. x_{s-1}``: an independent draft
(``q_s = q``), a draw without replacement (``q`` without ``x_{<s}``, renormalised), or a deterministic candidate (a
one-hot ``q_s``). The stage targets are ``p_1 = p`` and ``p_{s+1} = norm(max(0, p_s - q_s))``. Child s is accepted
with probability ``min(1, p_s(x_s) / q_s(x_s))``, in stage order; the first accepted child is taken, and when none
is, the **recovered** token is drawn from ``p_{m+1}``. Each stage is the single-draft rule (:mod:`exact`) with
target ``p_s``, whose rejection branch outputs ``p_{s+1}``, so by induction the output is distributed exactly as
``p``. This needs each ``q_s`` to be the law the candidate was really drawn from: top-k tokens declared as draws
from ``q``, or draws without replacement declared as independent ones, are not lossless.

A node with no valid children gives its own ``p`` (the **bonus** token). Over a chain this is today's exact rule.
"""

from __future__ import annotations

import torch

from vgen.kernels.spec import TINY
from vgen.samplers.speculative.rules import gather_last, normalized_residual
from vgen.samplers.speculative.tree import TreeShape


def stage_targets(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The stage targets ``p_1 .. p_{m+1}`` [..., m + 1, V] of a target ``p`` [..., V] and the candidates' laws ``q``
    [..., m, V] in stage order."""
    targets = [p]
    for s in range(q.shape[-2]):
        targets.append(normalized_residual(targets[-1], q[..., s, :]))
    return torch.stack(targets, dim=-2)


def _child_at(children: torch.Tensor, valid: torch.Tensor, at: torch.Tensor,
              s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The stage-s child [B, N] of nodes ``at`` [B, N] (0 where there is none, so it can index) and whether it
    exists and is valid (so it is judged)."""
    child = children[at, s]
    exists = child >= 0
    child = child.clamp_min(0)
    return child, exists & valid.gather(1, child)


def _after(target: torch.Tensor, q: torch.Tensor, child: torch.Tensor, judged: torch.Tensor) -> torch.Tensor:
    """The stage targets [B, N, V] after one more stage: ``norm(max(0, target - q_child))`` where the stage's
    ``child`` [B, N] was ``judged`` (and, since the walk went on, rejected), ``target`` unchanged elsewhere."""
    q_child = q.gather(1, child[..., None].expand(-1, -1, q.shape[-1]))
    return torch.where(judged[..., None], normalized_residual(target, q_child), target)


def tree_accept_probs(shape: TreeShape, p: torch.Tensor, tokens: torch.Tensor, q: torch.Tensor,
                      valid: torch.Tensor) -> torch.Tensor:
    """p [B, T, V]: the target law of the token after each node (so a child's acceptance is judged against its
    parent's row); tokens [B, T] (node 0's token is the committed root, never judged); q [B, T, V]: each node's draft
    law; valid [B, T] bool: invalid nodes (unused slots) are skipped - they neither take a stage nor change the stage
    targets. Returns [B, T] acceptance probabilities (root and invalid nodes: 0).

    Every node is judged, whether or not the walk reaches it: shapes that do not depend on the draws.
    """
    batch, size = tokens.shape
    device = p.device
    parent = shape.parent.to(device).clamp_min(0)[None].expand(batch, -1)
    stage = shape.stage.to(device)
    children = shape.children().to(device)
    nodes = torch.arange(size, device=device)[None].expand(batch, -1)
    rows = torch.arange(batch, device=device)[:, None]
    q_own = gather_last(q, tokens).clamp_min(TINY)
    accept = torch.zeros_like(q_own)
    target = p  # each node's current stage target
    for s in range(shape.max_children):
        ratio = target[rows, parent, tokens] / q_own  # against the parent's stage target
        judged = (stage == s) & (nodes > 0) & valid
        accept = torch.where(judged, ratio.clamp(max=1), accept)
        if s + 1 < shape.max_children:
            target = _after(target, q, *_child_at(children, valid, nodes, s))
    return accept


def tree_walk(shape: TreeShape, accept_probs: torch.Tensor, uniforms: torch.Tensor,
              valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Walk from the root: at each node take the first valid child (stage order) whose ``uniforms < accept_probs``
    (both [B, T]); stop where none is. Returns path [B, D + 1] (the node at each depth 0..D, D = ``max_depth``; -1
    past the stop), accepted [B] (the stop node's depth = tokens accepted) and stop [B] (the stop node)."""
    batch, device = accept_probs.shape[0], accept_probs.device
    children = shape.children().to(device)
    kept = valid & (uniforms < accept_probs)
    at = torch.zeros(batch, dtype=torch.long, device=device)
    nodes = [at]
    going = torch.ones(batch, dtype=torch.bool, device=device)
    for _ in range(shape.max_depth):
        child = children[at].clamp_min(0)  # [B, K]
        ok = (children[at] >= 0) & kept.gather(1, child)
        going = going & ok.any(dim=1)
        nxt = child.gather(1, ok.long().argmax(dim=1, keepdim=True))[:, 0]  # argmax: the first True
        at = torch.where(going, nxt, at)
        nodes.append(torch.where(going, at, -1))
    path = torch.stack(nodes, dim=1)
    return path, (path[:, 1:] >= 0).sum(dim=1), at


def tree_residual(shape: TreeShape, p: torch.Tensor, q: torch.Tensor, valid: torch.Tensor,
                  stop: torch.Tensor) -> torch.Tensor:
    """[B, V]: the law of the recovered token at each row's stop node [B]: ``p_{m+1}`` of the stop node over its m
    valid children (the stop node's own p when it has none - the bonus token)."""
    children = shape.children().to(p.device)
    at = stop[:, None]
    target = p.gather(1, at[..., None].expand(-1, -1, p.shape[-1]))  # [B, 1, V]
    for s in range(shape.max_children):
        target = _after(target, q, *_child_at(children, valid, at, s))
    return target[:, 0]
