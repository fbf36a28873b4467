"""The branch planner: alternatives come from the carried law (else the grid neighbour), branches are built where
their expected tokens outweigh their nodes' cost, and the tables learn from every pass, branched or not."""

import pytest
import torch
import torch.nn.functional as F

from vgen.samplers.speculative.planner import ENTROPY_EDGES, BranchPlanner, entropy_buckets
from vgen.samplers.speculative.tree_pass import Branch, draft_alternatives, tree_layout

FRESH = len(ENTROPY_EDGES) + 1


def test_alternatives_are_the_carried_laws_next_tokens_else_the_neighbours_token() -> None:
    """Window at token 5 of a 4-wide grid, two drafts: column 0 carries a law with two other tokens; column 1 is
    fresh (one-hot), so its one alternative is the token above (token 2, committed), and only where it differs."""
    q = torch.stack([torch.tensor([0.5, 0.3, 0.2, 0.0, 0.0]), F.one_hot(torch.tensor(4), 5).float()])[None]
    drafts = torch.tensor([[0, 4]])
    tokens = torch.tensor([[1, 1, 3, 1, 1, 0, 0, 0]])
    alts, valid = draft_alternatives(q, drafts, tokens, torch.tensor([5]), stride=4, count=2)
    assert alts[0, 0].tolist() == [1, 2] and valid[0, 0].tolist() == [True, True]
    assert alts[0, 1, 0] == 3 and valid[0, 1].tolist() == [True, False]
    q[0, 1] = F.one_hot(torch.tensor(3), 5).float()
    same = draft_alternatives(q, torch.tensor([[0, 3]]), tokens, torch.tensor([5]), stride=4, count=2)[1]
    assert not same[0, 1].any()  # the neighbour's token is the draft itself


def test_buckets_sort_carried_laws_by_entropy_and_fresh_ones_apart() -> None:
    q = torch.tensor([[[0.999, 0.001, 0.0], [0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3], [0.0, 1.0, 0.0]]])
    assert entropy_buckets(q).tolist() == [[0, 3, 4, FRESH]]  # 0.008, 0.69 and 1.10 nats


def test_expensive_nodes_get_no_branches_and_cheap_ones_get_the_early_columns() -> None:
    buckets = torch.full((1, 31), 4)  # carried laws of about 1 nat
    live = torch.ones(1, 31, dtype=torch.bool)
    assert BranchPlanner(2, 8, node_cost=0.05).plan(buckets, live) == ()  # a CPU's cost
    branches = BranchPlanner(2, 8, node_cost=0.004, free_nodes=128).plan(buckets, live)  # a GPU's
    columns = [b.column for b in branches]
    assert columns[0] == 0 and columns == sorted(columns) and all(b.alternatives <= 2 for b in branches)
    # the walk rarely reaches the window's far end, so the far columns are left alone
    assert len(columns) > 4 and max(columns) < 20


def test_columns_past_the_image_get_no_branches() -> None:
    live = torch.zeros(1, 6, dtype=torch.bool)
    live[0, :2] = True
    branches = BranchPlanner(2, 4, node_cost=1e-4).plan(torch.full((1, 6), 4), live)
    assert branches and {b.column for b in branches} <= {0, 1}


def test_the_tables_learn_the_catch_of_branches_never_built() -> None:
    """A chain pass: the carried draft of column 0 is rejected and the target commits the carried law's second
    token, the planner's first alternative there: a catch, although the pass had no branch."""
    planner = BranchPlanner(2, 4, node_cost=1.0)
    q = torch.tensor([[[0.5, 0.3, 0.2, 0.0], [0.1, 0.2, 0.3, 0.4]]])
    drafts, tokens, pos = torch.tensor([[0, 3]]), torch.zeros(1, 8, dtype=torch.long), torch.tensor([1])
    plan = planner.prepare(q, drafts, tokens, pos, stride=2, num_tokens=6)
    assert not plan.branched
    bucket = int(plan.buckets[0, 0])
    before = planner.catch.mean()[bucket, 0].clone()
    tokens[0, 1] = 1  # the pass committed token 1 at column 0 (accepted 0 drafts)
    planner.learn(plan, pos, tokens, torch.tensor([0]))
    after = planner.catch.mean()[bucket, 0]
    assert after[0] > before[0] and after[1] < before[1]
    assert planner.kept.trials.sum() == 1  # one judged carried draft, rejected
    seen = planner.summary()
    assert seen["carried_kept"] == 0.0 and seen["catch_by_rank"] == [1.0, 0.0] and seen["line_kept"] is None


def test_the_kept_table_tells_the_first_column_from_later_ones() -> None:
    """After a rejection the first column's carried law saw the rejected token one position back: passes that keep
    every draft but the first column's teach the planner to expect rejections there, and to branch there first."""
    planner = BranchPlanner(2, 4, node_cost=0.004, free_nodes=8)
    q = torch.tensor([[[0.5, 0.3, 0.2, 0.0]] * 6])
    drafts, pos = torch.zeros(1, 6, dtype=torch.long), torch.tensor([1])
    for accepted in (0, 6, 0, 6, 0, 6, 0, 6) * 4:
        plan = planner.prepare(q, drafts, torch.zeros(1, 16, dtype=torch.long), pos, stride=4, num_tokens=12)
        planner.learn(plan, pos, torch.zeros(1, 16, dtype=torch.long), torch.tensor([accepted]))
    by_column = planner.summary()["carried_kept_by_column"]
    assert by_column[0] == 0.5 and by_column[1] == 1.0 and by_column[2] == 1.0
    assert by_column[4] is None  # no window reached column 8
    branches = planner.plan(plan.buckets, plan.live)
    assert branches and branches[0].column == 0


def test_planning_is_skipped_while_no_branch_could_pay() -> None:
    """The best case the priors allow (a first alternative catching a fifth of the rejections of the least-kept
    cell, a line of 8) against the recent tokens per pass: at a CPU's cost it never pays, where a pass holds the
    branch for free it always does, and in between short runs make a branch worth its nodes and long runs do not."""
    cpu = BranchPlanner(2, 8, node_cost=0.05)
    assert not cpu.pays(15) and cpu.unplanned == 1
    assert BranchPlanner(2, 8, node_cost=0.004, free_nodes=128).pays(31)
    middle = BranchPlanner(2, 8, node_cost=0.01)
    middle.count(torch.tensor([1, 1, -1]))  # a hard region: one token a pass (a finished row is left out)
    for _ in range(20):
        middle.count(torch.tensor([1]))
    assert middle.recent_tokens == pytest.approx(1.0, abs=0.01) and middle.pays(15)
    for _ in range(20):
        middle.count(torch.tensor([6, 6]))
    assert not middle.pays(15)
    assert middle.summary()["planned_share"] == 0.0


def test_a_layouts_lines_follow_the_chain() -> None:
    layout = tree_layout(4, (Branch(0, 1, 3),))
    assert layout.shape.parent.tolist() == [-1, 0, 1, 2, 0, 4, 5]
    assert layout.column.tolist() == [-1, 0, 1, 2, 0, 1, 2]
