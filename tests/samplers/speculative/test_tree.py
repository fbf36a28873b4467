"""The draft tree's topology: the chain, depths and stages derived from parents, ancestors, children, validation."""

import pytest
import torch

from vgen.samplers.speculative.tree import TreeShape

#     0          the chain 0-1-2-3 first, then the branches: 4 under the root (judged after 1),
#    / \         5 and 6 under node 1 (judged after 2, in that order), and 7 continuing branch 5
#   1   4
#  /|\
# 2 5 6
# | |
# 3 7
PARENTS = [-1, 0, 1, 2, 0, 1, 1, 5]


def test_chain_is_a_single_draft_window() -> None:
    chain = TreeShape.chain(4)
    assert chain.parent.tolist() == [-1, 0, 1, 2]
    assert chain.depth.tolist() == [0, 1, 2, 3]
    assert chain.stage.tolist() == [0, 0, 0, 0]
    assert (chain.size, chain.max_depth, chain.max_children) == (4, 3, 1)
    assert chain.ancestors().equal(torch.ones(4, 4, dtype=torch.bool).tril())


def test_from_parents_derives_depth_and_sibling_rank_in_node_order() -> None:
    tree = TreeShape.from_parents(PARENTS)
    assert tree.depth.tolist() == [0, 1, 2, 3, 1, 2, 2, 3]
    assert tree.stage.tolist() == [0, 0, 0, 0, 1, 1, 2, 0]
    assert (tree.size, tree.max_depth, tree.max_children) == (8, 3, 3)


def test_ancestors_are_each_nodes_root_path() -> None:
    paths = {0: [0], 1: [0, 1], 2: [0, 1, 2], 3: [0, 1, 2, 3], 4: [0, 4], 5: [0, 1, 5], 6: [0, 1, 6],
             7: [0, 1, 5, 7]}
    expected = torch.zeros(8, 8, dtype=torch.bool)
    for node, path in paths.items():
        expected[node, path] = True
    assert TreeShape.from_parents(PARENTS).ancestors().equal(expected)


def test_children_lists_each_nodes_children_in_stage_order() -> None:
    assert TreeShape.from_parents(PARENTS).children().tolist() == [
        [1, 4, -1], [2, 5, 6], [3, -1, -1], [-1, -1, -1], [-1, -1, -1], [7, -1, -1], [-1, -1, -1], [-1, -1, -1]]
    # stages need not follow node order: here branch 2 is judged before the chain's node 1
    swapped = TreeShape(torch.tensor([-1, 0, 0]), torch.tensor([0, 1, 1]), torch.tensor([0, 1, 0]))
    assert swapped.children().tolist() == [[2, 1], [-1, -1], [-1, -1]]


def test_the_root_alone_is_a_tree_without_drafts() -> None:
    root = TreeShape.chain(1)
    assert (root.size, root.max_depth, root.max_children) == (1, 0, 0)
    assert root.children().shape == (1, 0)
    assert root.ancestors().tolist() == [[True]]


@pytest.mark.parametrize(("parents", "message"), [
    ([], "at least its root"),
    ([0, 0], "node 0 is the root and its parent must be -1, got 0"),
    ([-1, 0, 2], r"node 2 has parent 2: parents must be earlier nodes \(0 <= parent < 2\)"),
    ([-1, 0, 3, 1], "node 2 has parent 3"),
    ([-1, -1], "node 1 has parent -1"),
])
def test_from_parents_rejects_a_bad_topology(parents: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TreeShape.from_parents(parents)


def test_construction_rejects_depths_and_stages_that_do_not_fit_the_parents() -> None:
    parent = torch.tensor([-1, 0, 0])
    with pytest.raises(ValueError, match=r"depth \[0, 1, 2\] does not follow from parent \[-1, 0, 0\]"):
        TreeShape(parent, torch.tensor([0, 1, 2]), torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match=r"the stages of node 0's children must be 0..1, got \[0, 0\]"):
        TreeShape(parent, torch.tensor([0, 1, 1]), torch.tensor([0, 0, 0]))
    with pytest.raises(ValueError, match="the root's stage must be 0, got 1"):
        TreeShape(parent, torch.tensor([0, 1, 1]), torch.tensor([1, 0, 1]))
    with pytest.raises(ValueError, match="TreeShape.depth must be a 1-d LongTensor"):
        TreeShape(parent, torch.tensor([0.0, 1.0, 1.0]), torch.tensor([0, 0, 1]))
