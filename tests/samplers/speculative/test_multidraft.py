"""Recursive rejection sampling over a draft tree. The oracle is an exact enumeration: summed over every draw of the
candidates and every accept / reject outcome, the law of the tokens a pass outputs is the target's, for independent,
without-replacement, deterministic and mixed candidate lists, and is not when a list's laws are misdeclared."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from vgen.samplers.speculative import multidraft
from vgen.samplers.speculative.exact import ExactRule
from vgen.samplers.speculative.multidraft import stage_targets, tree_accept_probs, tree_residual, tree_walk
from vgen.samplers.speculative.rules import leading_kept, normalized_residual
from vgen.samplers.speculative.tree import TreeShape

Law = Callable[[list[int]], torch.Tensor]  # a candidate's law given the tokens of its earlier siblings
Target = Callable[[tuple[int, ...]], torch.Tensor]  # the law of the next token after a prefix of drafted tokens


def independent(q: torch.Tensor) -> Law:
    return lambda earlier: q


def without_replacement(q: torch.Tensor) -> Law:
    def law(earlier: list[int]) -> torch.Tensor:
        kept = q.clone()
        kept[earlier] = 0
        return kept / kept.sum()

    return law


def fixed(token: int, vocab: int) -> Law:
    return lambda earlier: F.one_hot(torch.tensor(token), vocab).double()


def autoregressive(target: Target, prefix: tuple[int, ...], length: int) -> torch.Tensor:
    """The target's joint law [V] * length of the next ``length`` tokens after ``prefix``."""
    if length == 0:
        return torch.tensor(1.0, dtype=torch.float64)
    p = target(prefix)
    return torch.stack([p[y] * autoregressive(target, (*prefix, y), length - 1) for y in range(len(p))])


def pass_law(shape: TreeShape, target: Target, draws: dict[int, Law], vocab: int, valid: list[bool] | None = None,
             declared: dict[int, Law] | None = None) -> torch.Tensor:
    """The exact joint law [V] * D of the first D tokens after the root (D = the tree's depth): one pass, then plain
    decoding from the target where the pass output fewer. Node c's token is drawn from ``draws[c]`` and the rule is
    told it came from ``declared[c]`` (default: the same law)."""
    declared = declared or draws
    size, depth, parents = shape.size, shape.max_depth, shape.parent.tolist()
    children = [[c for c in row if c >= 0] for row in shape.children().tolist()]
    prefixes = [()] * size  # each node's drafted tokens, root to node
    rows, weights, ps, qs = [], [], [], []
    for assignment in itertools.product(range(vocab), repeat=size - 1):
        tokens, weight, q = (0, *assignment), 1.0, [torch.zeros(vocab, dtype=torch.float64)] * size
        for node in range(size):
            earlier = []
            for c in children[node]:
                weight *= draws[c](earlier)[tokens[c]].item()
                q[c] = declared[c](earlier)
                earlier.append(tokens[c])
        if weight == 0:
            continue
        for node in range(1, size):
            prefixes[node] = (*prefixes[parents[node]], tokens[node])
        rows.append(tokens)
        weights.append(weight)
        ps.append(torch.stack([target(prefixes[node]) for node in range(size)]))
        qs.append(torch.stack(q))
    tokens, p, q = torch.tensor(rows), torch.stack(ps), torch.stack(qs)
    mask = torch.tensor(valid or [True] * size).expand(len(rows), -1)
    accept = tree_accept_probs(shape, p, tokens, q, mask)
    # every accept / reject outcome of every node: uniforms 0 (accepted where possible) or 1 (rejected)
    outcomes = torch.tensor(list(itertools.product([0.0, 1.0], repeat=size - 1)), dtype=torch.float64)
    uniforms = torch.cat([torch.ones(len(outcomes), 1, dtype=torch.float64), outcomes], dim=1)
    n, m = len(rows), len(outcomes)
    chance = torch.where(uniforms[None] == 0, accept[:, None], 1 - accept[:, None]).prod(-1)  # [n, m]
    weight = (torch.tensor(weights, dtype=torch.float64)[:, None] * chance).flatten()

    def tile(x: torch.Tensor) -> torch.Tensor:
        return x.repeat_interleave(m, dim=0)

    path, accepted, stop = tree_walk(shape, tile(accept), uniforms.repeat(n, 1), tile(mask))
    residual = tree_residual(shape, tile(p), tile(q), tile(mask), stop)
    law = torch.zeros([vocab] * depth, dtype=torch.float64)
    for row in torch.nonzero(weight).flatten().tolist():
        drafted = tuple(tokens[row // m, path[row, 1:accepted[row] + 1]].tolist())
        if len(drafted) == depth:
            law[drafted] += weight[row]
            continue
        for y in range(vocab):
            prefix = (*drafted, y)
            law[prefix] += weight[row] * residual[row, y] * autoregressive(target, prefix, depth - len(prefix))
    return law


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * (a - b).abs().sum().item()


def random_law(generator: torch.Generator, vocab: int, zeros: int = 0) -> torch.Tensor:
    """A law [V] with ``zeros`` entries of probability zero."""
    law = torch.randn(vocab, generator=generator, dtype=torch.float64).softmax(0)
    law[torch.randperm(vocab, generator=generator)[:zeros]] = 0
    return law / law.sum()


def star(m: int) -> TreeShape:
    return TreeShape.from_parents([-1] + [0] * m)


def lists(generator: torch.Generator, vocab: int, m: int) -> dict[str, list[Law]]:
    """Candidate lists of m entries, each as the sampler could build it."""
    q, others = random_law(generator, vocab), [random_law(generator, vocab, zeros=1) for _ in range(m)]
    mixed = [without_replacement(q), fixed(vocab - 1, vocab), independent(others[0]), without_replacement(q)]
    return {
        "independent": [independent(law) for law in others],
        "without-replacement": [without_replacement(q)] * m,
        "deterministic": [fixed(token, vocab) for token in (2, 0, 3)[:m]],
        "mixed": mixed[:m],
    }


@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("kind", ["independent", "without-replacement", "deterministic", "mixed"])
@pytest.mark.parametrize("target_kind", ["full", "sparse", "greedy"])
def test_one_stage_of_candidates_outputs_exactly_the_target(m: int, kind: str, target_kind: str) -> None:
    generator = torch.Generator().manual_seed(m)
    p = {"full": random_law(generator, 5), "sparse": random_law(generator, 5, zeros=2),
         "greedy": F.one_hot(torch.tensor(3), 5).double()}[target_kind]
    candidates = lists(generator, 5, m)[kind]
    law = pass_law(star(m), lambda prefix: p, dict(enumerate(candidates, start=1)), 5)
    torch.testing.assert_close(law, p, atol=1e-6, rtol=0)


@pytest.mark.parametrize("valid", [[True] * 5, [True, False, True, True, True], [True, True, True, True, False]],
                         ids=["all", "chain-unused", "branch-tail-unused"])
def test_a_two_level_tree_outputs_the_targets_joint_law(valid: list[bool]) -> None:
    """Root -> 1 -> 2 (the chain) and root -> 3 -> 4 (a branch): the first two tokens are jointly the target's, also
    when a slot is unused."""
    generator = torch.Generator().manual_seed(0)
    vocab, first = 4, random_law(generator, 4)
    second = torch.stack([random_law(generator, vocab, zeros=1) for _ in range(vocab)])  # given the first token
    q, q_next = random_law(generator, vocab), random_law(generator, vocab)

    def target(prefix: tuple[int, ...]) -> torch.Tensor:
        return first if not prefix else second[prefix[-1]] if len(prefix) == 1 else torch.full((vocab,), 0.25)

    draws = {1: independent(q), 2: independent(q_next), 3: without_replacement(q), 4: fixed(1, vocab)}
    shape = TreeShape.from_parents([-1, 0, 1, 0, 3])
    law = pass_law(shape, target, draws, vocab, valid)
    torch.testing.assert_close(law, autoregressive(target, (), 2), atol=1e-6, rtol=0)


FLAT_P = torch.tensor([0.3, 0.25, 0.2, 0.15, 0.1], dtype=torch.float64)
FLAT_Q = FLAT_P.flip(0)


@pytest.mark.parametrize("misdeclared", ["top-k as draws from q", "without replacement as independent"])
def test_candidates_whose_laws_are_misdeclared_do_not_output_the_target(misdeclared: str) -> None:
    top = FLAT_Q.argsort(descending=True, stable=True).tolist()
    draws = ({s: fixed(top[s - 1], 5) for s in (1, 2, 3)} if misdeclared.startswith("top-k")
             else {s: without_replacement(FLAT_Q) for s in (1, 2, 3)})
    declared = {s: independent(FLAT_Q) for s in (1, 2, 3)}
    law = pass_law(star(3), lambda prefix: FLAT_P, draws, 5, declared=declared)
    assert tv(law, FLAT_P) > 0.02  # the correct rule is exact to 1e-6


def test_a_residual_that_does_not_subtract_each_rejected_law_does_not_output_the_target(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(multidraft, "normalized_residual", lambda target, q: target)  # p_{s+1} = p_s
    draws = {1: independent(FLAT_Q), 2: independent(FLAT_Q.roll(1))}
    law = pass_law(star(2), lambda prefix: FLAT_P, draws, 5)
    assert tv(law, FLAT_P) > 0.02


def test_stage_targets_subtract_each_candidates_law_in_turn() -> None:
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.1, 0.6, 0.1, 0.2]])
    expected = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.0, 0.6, 0.4, 0.0], [0.0, 0.0, 1.0, 0.0]])
    torch.testing.assert_close(stage_targets(p, q), expected)
    torch.testing.assert_close(stage_targets(p, p[None]), torch.stack([p, p]))  # p == q: the target stays
    assert stage_targets(torch.rand(2, 3, 7), torch.rand(2, 3, 4, 7)).shape == (2, 3, 5, 7)


def test_siblings_are_judged_against_their_stage_targets_and_unused_ones_are_skipped() -> None:
    generator = torch.Generator().manual_seed(1)
    p = torch.stack([random_law(generator, 6) for _ in range(4)])[None]  # [1, 4, V]
    q = torch.stack([random_law(generator, 6) for _ in range(4)])[None]
    tokens = torch.tensor([[0, 2, 2, 5]])
    targets = stage_targets(p[0, 0], q[0, 1:])
    expected = [0.0] + [min(1.0, (targets[s, tokens[0, s + 1]] / q[0, s + 1, tokens[0, s + 1]]).item())
                        for s in range(3)]
    torch.testing.assert_close(tree_accept_probs(star(3), p, tokens, q, torch.ones(1, 4, dtype=torch.bool)),
                               torch.tensor([expected], dtype=torch.float64))
    # node 2 unused: node 3 takes its stage, judged after node 1 only
    skipped = tree_accept_probs(star(3), p, tokens, q, torch.tensor([[True, True, False, True]]))
    third = normalized_residual(p[0, 0], q[0, 1])[5] / q[0, 3, 5]
    torch.testing.assert_close(skipped, torch.tensor([[0.0, expected[1], 0.0, min(1.0, third.item())]],
                                                     dtype=torch.float64))
    stop = torch.tensor([0])
    torch.testing.assert_close(tree_residual(star(3), p, q, torch.ones(1, 4, dtype=torch.bool), stop),
                               targets[3][None])


def test_the_walk_takes_the_first_accepted_valid_child_at_each_depth() -> None:
    shape = TreeShape.from_parents([-1, 0, 1, 2, 0, 1, 1, 5])  # see test_tree.py: chain 0-1-2-3, branches 4, 5-7, 6
    accept = torch.full((6, 8), 0.5)
    # nodes 1..7 of each row: a = a uniform below its acceptance probability, r = above
    draws = ["araaaar", "raaaaaa", "araarra", "aaaaaaa", "aaaaraa", "aaarrrr"]
    uniforms = torch.tensor([[0.0] + [0.1 if c == "a" else 0.9 for c in row] for row in draws])
    valid = torch.ones(6, 8, dtype=torch.bool)
    valid[3, 1] = False  # row 3: node 1 would be taken but is unused, so its sibling 4 is
    valid[4, 2] = False  # row 4: node 2 unused, 5 rejected, 6 taken
    path, accepted, stop = tree_walk(shape, accept, uniforms, valid)
    assert path.tolist() == [
        [0, 1, 5, -1],  # 1 taken (so 4 never judged), 2 rejected, 5 taken, 7 rejected
        [0, 4, -1, -1],  # 1 rejected, 4 taken: a leaf
        [0, 1, -1, -1],  # every child of 1 rejected
        [0, 4, -1, -1],
        [0, 1, 6, -1],
        [0, 1, 2, 3],  # the whole chain
    ]
    assert accepted.tolist() == [2, 1, 1, 1, 2, 3]
    assert stop.tolist() == [5, 4, 1, 4, 6, 3]
    assert tree_walk(shape, accept, torch.ones(6, 8), valid)[2].tolist() == [0] * 6  # all rejected: stop at the root


def test_a_chain_is_the_single_draft_exact_rule() -> None:
    generator = torch.Generator().manual_seed(2)
    batch, length, vocab = 5, 6, 7
    p = torch.rand(batch, length, vocab, generator=generator).pow(3).softmax(-1)
    q = torch.rand(batch, length, vocab, generator=generator).pow(3).softmax(-1)
    tokens = torch.randint(vocab, (batch, length), generator=generator)
    uniforms = torch.rand(batch, length, generator=generator) * 0.6
    valid = torch.ones(batch, length, dtype=torch.bool)
    valid[0, 4:] = False  # the image ends inside row 0's window
    chain = TreeShape.chain(length)
    accept = tree_accept_probs(chain, p, tokens, q, valid)
    single = ExactRule().accept_probs(p[:, :-1], q[:, 1:], tokens[:, 1:], tokens[:, 1:])
    torch.testing.assert_close(accept[:, 1:], torch.where(valid[:, 1:], single, 0))
    path, accepted, stop = tree_walk(chain, accept, uniforms, valid)
    assert accepted.equal(leading_kept((uniforms < accept)[:, 1:] & valid[:, 1:]))
    assert stop.equal(accepted)
    assert path.equal(torch.where(torch.arange(length) <= accepted[:, None], torch.arange(length), -1))
    rows = torch.arange(batch)
    judged = (stop < length - 1) & valid[rows, (stop + 1).clamp(max=length - 1)]
    recovered = normalized_residual(p[rows, stop], q[rows, (stop + 1).clamp(max=length - 1)])
    expected = torch.where(judged[:, None], recovered, p[rows, stop])  # a rejected draft's residual, else the bonus
    torch.testing.assert_close(tree_residual(chain, p, q, valid, stop), expected)


def test_a_greedy_target_accepts_exactly_its_argmax_whatever_the_draft_laws() -> None:
    generator = torch.Generator().manual_seed(3)
    p = F.one_hot(torch.tensor([[2, 1, 0, 3, 1]]), 4).float()  # each node's argmax
    q = torch.rand(1, 5, 4, generator=generator).softmax(-1)
    tokens = torch.tensor([[0, 1, 1, 2, 3]])
    shape = TreeShape.from_parents([-1, 0, 1, 0, 3])  # root -> 1 -> 2 and root -> 3 -> 4
    valid = torch.ones(1, 5, dtype=torch.bool)
    accept = tree_accept_probs(shape, p, tokens, q, valid)
    assert accept.tolist() == [[0.0, 0.0, 1.0, 1.0, 1.0]]  # node 1 is not the root's argmax, 3 is; 2 and 4 are theirs
    path, accepted, stop = tree_walk(shape, accept, torch.rand(1, 5, generator=generator), valid)
    assert path.tolist() == [[0, 3, 4]]
    assert torch.equal(tree_residual(shape, p, q, valid, torch.tensor([0])), p[:, 0])  # the root's argmax


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_ops_give_the_cpu_results() -> None:
    generator = torch.Generator().manual_seed(4)
    shape = TreeShape.from_parents([-1, 0, 1, 2, 0, 1, 1, 5])  # built on the CPU, used on CUDA
    p = torch.rand(3, 8, 9, generator=generator).softmax(-1)
    q = torch.rand(3, 8, 9, generator=generator).softmax(-1)
    tokens = torch.randint(9, (3, 8), generator=generator)
    uniforms, valid = torch.rand(3, 8, generator=generator), torch.rand(3, 8, generator=generator) > 0.2

    def run(device: str) -> tuple[torch.Tensor, ...]:
        p_, q_, tokens_, uniforms_, valid_ = (x.to(device) for x in (p, q, tokens, uniforms, valid))
        accept = tree_accept_probs(shape, p_, tokens_, q_, valid_)
        path, accepted, stop = tree_walk(shape, accept, uniforms_, valid_)
        return accept, path, accepted, stop, tree_residual(shape, p_, q_, valid_, stop)

    for cpu, cuda in zip(run("cpu"), run("cuda")):
        torch.testing.assert_close(cuda.cpu(), cpu)
