"""GSD: the group is the draft's rank neighbours that are both similarly probable and close in the AR model's
embedding space; grouped acceptance is never below exact acceptance."""

import pytest
import torch

from vgen.samplers.speculative.exact import ExactRule
from vgen.samplers.speculative.grouped import GroupedRule, rank_neighbours

# embeddings: tokens 0, 1, 2 close together, 3 and 4 far away
EMBEDDINGS = torch.tensor([[0.0, 0.0], [0.3, 0.0], [0.0, 0.4], [3.0, 0.0], [0.0, 3.0]])
P = torch.tensor([0.30, 0.25, 0.20, 0.15, 0.10])


def test_hand_computed_group_and_acceptance() -> None:
    """Draft 1 (p .25): ranks 0..4 are within the window; |p - .25| < .15 keeps 0, 2, 3, 4 (|.10 - .25| = .15
    fails); distance^2 < .5 keeps 0 and 2 (3 is 7.29 away). Group {0, 1, 2}: one-hot accept = .75."""
    rule = GroupedRule(EMBEDDINGS, rank_window=7, p_threshold=0.15, dist_threshold=0.5)
    draft = torch.tensor(1)
    candidates, keep = rule.group(P, draft)
    assert sorted(candidates[keep].tolist()) == [0, 1, 2]
    one_hot = torch.nn.functional.one_hot(draft, 5).float()
    assert rule.accept_probs(P, one_hot, draft, draft).item() == pytest.approx(0.75)


def test_rank_window_limits_the_candidates() -> None:
    """rank_window 1 looks at ranks rank(x) - 1 .. rank(x): for draft 2 (rank 2) only token 1 and itself."""
    rule = GroupedRule(EMBEDDINGS, rank_window=1, p_threshold=1.0, dist_threshold=100.0)
    candidates, keep = rule.group(P, torch.tensor(2))
    assert sorted(candidates[keep].tolist()) == [1, 2]


def test_the_draft_counts_once_at_the_edge_of_the_ranking() -> None:
    rule = GroupedRule(EMBEDDINGS, rank_window=7, p_threshold=0.0, dist_threshold=0.0)
    draft = torch.tensor(0)  # rank 0: clamped ranks below 0 must not repeat it
    assert rule.accept_probs(P, torch.nn.functional.one_hot(draft, 5).float(), draft, draft).item() == \
        pytest.approx(0.30)


def test_grouped_acceptance_is_never_below_exact() -> None:
    g = torch.Generator().manual_seed(0)
    embeddings = torch.randn(40, 8, generator=g) * 0.2
    rule, exact = GroupedRule(embeddings, dist_threshold=0.5), ExactRule()
    for q_kind in ("one-hot", "carried"):
        p = (torch.randn(400, 40, generator=g) * 1.5).softmax(-1)
        drafts = torch.randint(40, (400,), generator=g)
        if q_kind == "one-hot":
            q = torch.nn.functional.one_hot(drafts, 40).float()
        else:
            q = (torch.randn(400, 40, generator=g) * 1.5).softmax(-1)
        grouped = rule.accept_probs(p, q, drafts, drafts)
        assert bool((grouped >= exact.accept_probs(p, q, drafts, drafts) - 1e-7).all())
        assert bool((grouped > exact.accept_probs(p, q, drafts, drafts) + 1e-3).any())  # it does relax


@pytest.mark.parametrize("q_kind", ["one-hot", "carried"])
def test_accepted_length_forms_the_group_only_where_needed_and_decides_the_same(q_kind: str) -> None:
    """The lazy verification (exact test first, then the group at each row's first exact rejection) keeps exactly
    the drafts that ``uniforms < accept_probs`` keeps, image end included, and forms far fewer groups."""
    g = torch.Generator().manual_seed(1)
    batch, window, vocab = 64, 8, 40
    rule = GroupedRule(torch.randn(vocab, 8, generator=g) * 0.2, dist_threshold=0.5)
    p = (torch.randn(batch, window, vocab, generator=g) * 1.5).softmax(-1)
    drafts = torch.multinomial(p.reshape(-1, vocab), 1, generator=g).view(batch, window)
    if q_kind == "one-hot":
        q = torch.nn.functional.one_hot(drafts, vocab).float()
    else:
        q = (torch.randn(batch, window, vocab, generator=g) * 1.5).softmax(-1)
    uniforms = torch.rand(batch, window, generator=g)
    valid = torch.arange(window) < torch.randint(1, window + 1, (batch, 1), generator=g)  # some images end
    eager = ((uniforms < rule.accept_probs(p, q, drafts, drafts)) & valid).long().cumprod(1).sum(1)
    exact = ((uniforms < ExactRule().accept_probs(p, q, drafts, drafts)) & valid).long().cumprod(1).sum(1)
    formed = []
    grouped_ratio = rule.grouped_ratio
    rule.grouped_ratio = lambda *args: formed.append(len(args[0])) or grouped_ratio(*args)
    lengths = rule.accepted_length(p, q, drafts, drafts, uniforms, valid)
    assert torch.equal(lengths, eager)
    assert bool((lengths > exact).any())  # the group kept drafts that the exact test rejected
    assert sum(formed) < batch * window / 2


def test_residual_is_sjds() -> None:
    q = torch.tensor([0.1, 0.6, 0.1, 0.1, 0.1])
    got = GroupedRule(EMBEDDINGS).residual(P, q, torch.tensor(1), torch.tensor(1))
    torch.testing.assert_close(got, ExactRule().residual(P, q, torch.tensor(1), torch.tensor(1)))


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(rank_window=-1), "gsd_rank_window must be an integer >= 0"),
    (dict(p_threshold=1.5), "gsd_p_threshold must be in \\[0, 1\\]"),
    (dict(dist_threshold=-1.0), "gsd_dist_threshold must be >= 0"),
])
def test_bad_thresholds_are_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GroupedRule(EMBEDDINGS, **kwargs)


def _ranks_by_sorting(p: torch.Tensor, drafts: torch.Tensor, window: int) -> list[set[int]]:
    """The candidate sets the slow way: a stable descending sort of the whole vocabulary."""
    order = p.argsort(dim=-1, descending=True, stable=True)
    sets = []
    for row, draft in zip(order, drafts):
        rank = int((row == draft).nonzero())
        sets.append({int(row[r]) for r in range(rank - window, rank + window) if 0 <= r < len(row)})
    return sets


@pytest.mark.parametrize("window", [1, 3, 7, 40])
def test_rank_neighbours_match_a_stable_sort_of_the_vocabulary(window: int) -> None:
    """Ties included: top-k filtering leaves many zero probabilities, and repeated values occur; the stable
    sort ranks equal probabilities by index, and so must the sort-free selection."""
    g = torch.Generator().manual_seed(1)
    p = (torch.randn(300, 30, generator=g) * 2).softmax(-1)
    p[:100, 10:] = 0.0  # top-k style zeros, with drafts among them
    p[100:200] = torch.randint(4, (100, 30), generator=g).float() / 10  # heavy ties
    drafts = torch.randint(30, (300,), generator=g)
    candidates, inside = rank_neighbours(p, drafts, window)
    assert candidates.shape[-1] <= 2 * window + 1
    for got_row, mask, want in zip(candidates, inside, _ranks_by_sorting(p, drafts, window)):
        got = got_row[mask].tolist()
        assert len(got) == len(set(got)) and set(got) == want


def test_kernel_spec_carries_the_embeddings_window_and_thresholds() -> None:
    spec = GroupedRule(EMBEDDINGS, rank_window=5, p_threshold=0.2, dist_threshold=0.7).kernel_spec()
    assert (spec.kind, spec.rank_window, spec.p_threshold, spec.dist_threshold) == ("gsd", 5, 0.2, 0.7)
    assert spec.embeddings is EMBEDDINGS
    assert type("Subclass", (GroupedRule,), {})(EMBEDDINGS).kernel_spec() is None
