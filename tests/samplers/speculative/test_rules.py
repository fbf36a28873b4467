"""Acceptance rules on hand-computed cases: exact (min(1, p/q) and the max(0, p - q) residual) and exact match."""

import pytest
import torch

from vgen.kernels import RuleSpec
from vgen.samplers.speculative.exact import ExactRule
from vgen.samplers.speculative.match import MatchRule
from vgen.samplers.speculative.rules import accept_drafts, available_rules, build_rule, normalized_residual, recover

P = torch.tensor([0.5, 0.3, 0.2, 0.0])
Q = torch.tensor([0.1, 0.6, 0.1, 0.2])


@pytest.mark.parametrize(("draft", "expected"), [(0, 1.0), (1, 0.5), (2, 1.0), (3, 0.0)])
def test_exact_accepts_with_min_one_p_over_q(draft: int, expected: float) -> None:
    got = ExactRule().accept_probs(P, Q, torch.tensor(draft), torch.tensor(0))
    assert got.item() == pytest.approx(expected)


def test_exact_residual_is_the_normalized_positive_part_of_p_minus_q() -> None:
    got = ExactRule().residual(P, Q, torch.tensor(1), torch.tensor(0))
    torch.testing.assert_close(got, torch.tensor([0.4, 0.0, 0.1, 0.0]) / 0.5)


def test_one_hot_draft_is_accepted_with_its_target_probability() -> None:
    q = torch.nn.functional.one_hot(torch.tensor(1), 4).float()
    assert ExactRule().accept_probs(P, q, torch.tensor(1), torch.tensor(0)).item() == pytest.approx(0.3)
    torch.testing.assert_close(ExactRule().residual(P, q, torch.tensor(1), torch.tensor(0)),
                               torch.tensor([0.5, 0.0, 0.2, 0.0]) / 0.7)


def test_residual_falls_back_to_the_target_when_p_equals_q() -> None:
    torch.testing.assert_close(normalized_residual(P, P), P)


def test_exact_accept_then_residual_reproduces_p_for_any_q() -> None:
    """The speculative sampling identity: q(y) a(y) + P(reject) r(y) = p(y)."""
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        p, q = torch.rand(6, generator=g).softmax(0), torch.rand(6, generator=g).pow(3).softmax(0)
        rule, tokens = ExactRule(), torch.arange(6)
        a = rule.accept_probs(p.expand(6, 6), q.expand(6, 6), tokens, tokens)
        reject = (q * (1 - a)).sum()
        out = q * a + reject * rule.residual(p, q, tokens[0], tokens[0])
        torch.testing.assert_close(out, p)


def test_match_accepts_exactly_when_the_draft_equals_the_targets_draw() -> None:
    drafts, proposals = torch.tensor([[1, 2, 3]]), torch.tensor([[1, 0, 3]])
    p = torch.full((1, 3, 4), 0.25)
    assert MatchRule().accept_probs(p, p, drafts, proposals).tolist() == [[1.0, 0.0, 1.0]]
    torch.testing.assert_close(MatchRule().residual(p, p, drafts, proposals)[0, 1], torch.tensor([1.0, 0, 0, 0]))


def test_rules_work_on_any_leading_shape() -> None:
    p = torch.rand(2, 3, 5).softmax(-1)
    q = torch.rand(2, 3, 5).softmax(-1)
    drafts = torch.randint(5, (2, 3))
    for rule in (ExactRule(), MatchRule()):
        assert rule.accept_probs(p, q, drafts, drafts).shape == (2, 3)
        assert rule.residual(p, q, drafts, drafts).shape == (2, 3, 5)


def test_registry_lists_the_rules_and_rejects_unknown_names() -> None:
    assert {"exact", "lantern", "gsd", "match"} <= set(available_rules())
    with pytest.raises(ValueError, match="unknown acceptance rule 'nope'; available: .*exact"):
        build_rule("nope", None, None, None)


def test_accept_drafts_keeps_the_prefix_before_the_first_rejection() -> None:
    p = torch.tensor([0.5, 0.3, 0.2, 0.0]).expand(2, 4, 4)
    drafts = torch.tensor([[0, 1, 0, 0], [1, 0, 0, 0]])
    q = torch.nn.functional.one_hot(drafts, 4).float()  # acceptance = p(draft): .5 / .3
    uniforms = torch.tensor([[0.4, 0.2, 0.9, 0.1], [0.1, 0.3, 0.1, 0.1]])
    valid = torch.tensor([[True] * 4, [True, True, False, True]])
    torch.testing.assert_close(ExactRule().accept_probs(p, q, drafts, drafts),
                               torch.tensor([[0.5, 0.3, 0.5, 0.5], [0.3, 0.5, 0.5, 0.5]]))
    accepted = accept_drafts(ExactRule(), p, q, drafts, drafts, uniforms, valid)
    assert accepted.tolist() == [2, 2]  # row 0: .9 >= .5 rejects the third; row 1: the image ends at the third


def test_recover_draws_from_the_residual_at_each_rows_rejection() -> None:
    p = torch.tensor([[[0.5, 0.3, 0.2, 0.0], [0.1, 0.1, 0.1, 0.7]]])
    q = torch.nn.functional.one_hot(torch.tensor([[1, 3]]), 4).float()
    tokens, residual = recover(ExactRule(), p, q, torch.tensor([[1, 3]]), torch.zeros(1, 2, dtype=torch.long),
                               torch.tensor([1]), torch.tensor([0.99]))
    torch.testing.assert_close(residual, torch.tensor([[1.0, 1.0, 1.0, 0.0]]) / 3)  # position 1, draft 3 removed
    assert tokens.tolist() == [2]
    assert recover(ExactRule(), p, q, torch.tensor([[1, 3]]), torch.zeros(1, 2, dtype=torch.long),
                   torch.tensor([0]), None)[0].tolist() == [0]  # greedy: the argmax of [.5, 0, .2, 0] / .7


def test_exact_and_match_describe_themselves_to_the_kernels_and_a_subclass_does_not() -> None:
    assert ExactRule().kernel_spec() == RuleSpec("exact")
    assert MatchRule().kernel_spec() == RuleSpec("match")

    class Stricter(ExactRule):  # may change the logic: its torch methods run, never the built-in's kernel
        def accept_probs(self, p, q, drafts, proposals):
            return super().accept_probs(p, q, drafts, proposals) / 2

    assert Stricter().kernel_spec() is None
