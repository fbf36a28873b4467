"""The draft tree of one verify pass: its topology, and the walk that decides which branch is committed.

Vocabulary: a pass verifies T **nodes**. Node 0, the **root**, is the row's last committed token; every other node
is a draft token whose **parent** is the token before it, so a root-to-node path is one candidate continuation and
a node's **depth** is its length. The children of a node are judged in **stage** order (stage 0 first): the walk
takes the first child that is accepted and stops at a node none of whose children is. The topology is shared by the
rows of a batch; a row leaves a slot unused by marking the node invalid, and an invalid node is skipped as if it
were not there.

A single-draft window ``[last token, d_1 .. d_J]`` is the chain ``TreeShape.chain(J + 1)``. The plan's trees put
that chain at nodes 0..L-1 and branches after it, but nothing here depends on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


def _check_parents(parents: Sequence[int]) -> None:
    """A clear ValueError unless ``parents`` lists a rooted tree in topological order."""
    if len(parents) == 0:
        raise ValueError("a draft tree needs at least its root (node 0)")
    if parents[0] != -1:
        raise ValueError(f"node 0 is the root and its parent must be -1, got {parents[0]}")
    for node, parent in enumerate(parents[1:], start=1):
        if not 0 <= parent < node:
            raise ValueError(f"node {node} has parent {parent}: parents must be earlier nodes (0 <= parent < {node})")


def _depths(parents: Sequence[int]) -> list[int]:
    depth = [0] * len(parents)
    for node in range(1, len(parents)):
        depth[node] = depth[parents[node]] + 1
    return depth


def _sibling_ranks(parents: Sequence[int]) -> list[int]:
    """Each node's rank among its siblings, in node order."""
    seen: dict[int, int] = {}
    stage = [0] * len(parents)
    for node in range(1, len(parents)):
        stage[node] = seen.get(parents[node], 0)
        seen[parents[node]] = stage[node] + 1
    return stage


@dataclass(frozen=True, eq=False)
class TreeShape:
    """The topology of one verify pass's draft tree, shared by every row of a batch. Node 0 is the root (the row's
    last committed token, depth 0); nodes are in topological order (parent[i] < i for i > 0).

    Validated on construction, which reads the values (build it on the CPU: on an accelerator that is a sync).
    ``max_depth`` and ``max_children`` are host integers, so the ops below loop and size their outputs without
    reading the tensors.
    """

    parent: torch.Tensor  # LongTensor [T]; parent[0] == -1
    depth: torch.Tensor  # LongTensor [T]; depth[0] == 0, depth[i] == depth[parent[i]] + 1
    stage: torch.Tensor  # LongTensor [T]; the rank of a node among its siblings (0 = judged first); stage[0] == 0
    max_depth: int = field(init=False)  # D: the deepest node's depth
    max_children: int = field(init=False)  # K: the most children any node has

    def __post_init__(self) -> None:
        for name in ("parent", "depth", "stage"):
            value = getattr(self, name)
            if value.dtype != torch.long or value.dim() != 1 or value.shape != self.parent.shape:
                raise ValueError(f"TreeShape.{name} must be a 1-d LongTensor of one length T, got {value.dtype} "
                                 f"{tuple(value.shape)} (parent: {tuple(self.parent.shape)})")
        parents = self.parent.tolist()
        _check_parents(parents)
        if self.depth.tolist() != _depths(parents):
            raise ValueError(f"depth {self.depth.tolist()} does not follow from parent {parents}")
        stage = self.stage.tolist()
        if stage[0] != 0:
            raise ValueError(f"the root's stage must be 0, got {stage[0]}")
        for node in range(len(parents)):
            ranks = sorted(stage[i] for i in range(1, len(parents)) if parents[i] == node)
            if ranks != list(range(len(ranks))):
                raise ValueError(f"the stages of node {node}'s children must be 0..{len(ranks) - 1}, got {ranks}")
        object.__setattr__(self, "max_depth", max(self.depth.tolist()))
        object.__setattr__(self, "max_children", max(stage[1:], default=-1) + 1)

    @property
    def size(self) -> int:
        """T, the number of nodes."""
        return self.parent.shape[0]

    @classmethod
    def from_parents(cls, parents: Sequence[int]) -> TreeShape:
        """The tree with these parents (``parents[0] == -1``, ``parents[i] < i``); siblings are judged in node
        order."""
        parents = list(parents)
        _check_parents(parents)
        return cls(torch.tensor(parents), torch.tensor(_depths(parents)), torch.tensor(_sibling_ranks(parents)))

    @classmethod
    def chain(cls, length: int) -> TreeShape:
        """The root and ``length - 1`` drafts in a line: a single-draft window."""
        return cls.from_parents(range(-1, length - 1))

    def ancestors(self) -> torch.Tensor:
        """bool [T, T]: ``[i, j]`` True where j is i or an ancestor of i (what node i attends to in the tree)."""
        eye = torch.eye(self.size, dtype=torch.bool, device=self.parent.device)
        out, up = eye, torch.arange(self.size, device=self.parent.device)
        for _ in range(self.max_depth):
            up = torch.where(up > 0, self.parent[up], up)  # the root is its own ancestor: a no-op past it
            out = out | eye[up]
        return out

    def children(self) -> torch.Tensor:
        """Long [T, K]: ``[u, s]`` is node u's child of stage s, -1 where it has none (K = ``max_children``)."""
        table = torch.full((self.size, self.max_children), -1, dtype=torch.long, device=self.parent.device)
        nodes = torch.arange(1, self.size, device=self.parent.device)
        return table.index_put((self.parent[1:], self.stage[1:]), nodes)
