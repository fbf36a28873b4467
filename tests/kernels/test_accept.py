"""The accept_drafts kernel equals its torch reference for every built-in rule: the same accepted length per
sample under many uniform draws (so the same acceptance probabilities, to the resolution of the draws), and at the
exact boundaries where the probabilities are formed exactly, edge cases included."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="the kernel tests need triton (pip install -e '.[triton]')")

from vgen.kernels import RuleSpec, accept  # noqa: E402
from vgen.samplers.speculative.exact import ExactRule  # noqa: E402
from vgen.samplers.speculative.grouped import GroupedRule  # noqa: E402
from vgen.samplers.speculative.lantern import LanternRule, latent_neighbours  # noqa: E402
from vgen.samplers.speculative.match import MatchRule  # noqa: E402
from vgen.samplers.speculative.rules import accept_drafts  # noqa: E402

V = 45  # not a power of two


def make_rules(vocab: int = V) -> dict:
    g = torch.Generator().manual_seed(0)
    codebook, embeddings = torch.randn(vocab, 3, generator=g), torch.randn(vocab, 6, generator=g) * 0.4
    return {
        "exact": ExactRule(),
        "match": MatchRule(),
        "lantern-tv": LanternRule(latent_neighbours(codebook, 8), delta=0.2),
        "lantern-relative": LanternRule(latent_neighbours(codebook, 8), delta=3.0, mode="relative"),
        "lantern-k0": LanternRule(latent_neighbours(codebook, 0), delta=0.2),
        "gsd": GroupedRule(embeddings, rank_window=4, p_threshold=0.05, dist_threshold=1.0),
        "gsd-w0": GroupedRule(embeddings, rank_window=0),
        "gsd-bf16": GroupedRule(embeddings.bfloat16(), rank_window=4, p_threshold=0.05, dist_threshold=1.0),
    }


RULES = make_rules()


def window(batch: int, count: int, seed: int, one_hot_q: bool):
    """p [B, J, V] (a view of a [B, J + 1, V] window, as the sampler passes it), q, drafts, proposals."""
    g = torch.Generator().manual_seed(seed)
    p = (torch.randn(batch, count + 1, V, generator=g) * 2).softmax(-1)
    drafts = torch.multinomial(p[:, :-1].reshape(-1, V), 1, generator=g).view(batch, count)  # plausible drafts
    q = F.one_hot(drafts, V).float() if one_hot_q else (torch.randn(batch, count, V, generator=g) * 2).softmax(-1)
    proposals = torch.where(torch.rand(batch, count + 1, generator=g) < 0.5, torch.randint(V, (batch, count + 1),
                                                                                             generator=g), 0)
    proposals[:, :-1] = torch.where(proposals[:, :-1] == 0, drafts, proposals[:, :-1])  # match: about half equal
    return p[:, :-1], q, drafts, proposals[:, :-1], g


def check(both, rule, p, q, drafts, proposals, uniforms, valid) -> torch.Tensor:
    ref_len, len_ = both(accept_drafts, rule, p, q, drafts, proposals, uniforms, valid)
    assert torch.equal(len_, ref_len) and len_.dtype == torch.long
    return len_


@pytest.mark.parametrize("name", RULES)
@pytest.mark.parametrize(("batch", "one_hot_q"), [(1, True), (4, False)])
def test_random_windows_match_the_reference(name: str, batch: int, one_hot_q: bool, both) -> None:
    """Each window judged under 16 draws of its uniforms, and under draws that test one position at a time (every
    earlier draft kept with a draw of 0), so that every position's probability is compared, not only the first
    rejection's."""
    p, q, drafts, proposals, g = window(batch, 5, seed=batch, one_hot_q=one_hot_q)
    draws = 16
    uniforms = torch.rand(draws, batch, 5, generator=g)
    per_position = torch.rand(draws, 5, generator=g)
    probe = torch.where(torch.arange(5) < torch.arange(5)[:, None], 0.0, 1.0)  # [position, J]: 0 before it
    probe = (probe[None] * per_position[..., None]).reshape(-1, 1, 5).expand(-1, batch, 5)
    uniforms = torch.cat([uniforms, probe]).reshape(-1, 5)
    n = len(uniforms) // batch
    lengths = check(both, RULES[name], p.repeat(n, 1, 1), q.repeat(n, 1, 1), drafts.repeat(n, 1),
                    proposals.repeat(n, 1), uniforms, torch.ones(len(uniforms), 5, dtype=torch.bool))
    assert 0 < lengths.float().mean() < 5  # the draws do decide


@pytest.mark.parametrize("name", RULES)
def test_all_accepted_all_rejected_and_the_end_of_the_image(name: str, both) -> None:
    p, q, drafts, _, _ = window(3, 4, seed=7, one_hot_q=True)
    proposals = drafts  # the target drew every draft: exact-match accepts with certainty too
    valid = torch.ones_like(drafts, dtype=torch.bool)
    rule = RULES[name]
    accepted = check(both, rule, p, q, drafts, proposals, torch.zeros(drafts.shape), valid)
    assert accepted.tolist() == [4, 4, 4]  # a draw of 0 keeps every draft
    accepted = check(both, rule, p, q, drafts, proposals, torch.ones(drafts.shape), valid)
    assert accepted.tolist() == [0, 0, 0]  # a draw of 1 keeps none
    valid[0, 2:], valid[1, :] = False, False  # the image ends inside the window
    accepted = check(both, rule, p, q, drafts, proposals, torch.zeros(drafts.shape), valid)
    assert accepted.tolist() == [2, 0, 4]


def test_the_first_rejection_stops_the_window(both) -> None:
    """Exact rule, one-hot drafts: draft j is kept iff u_j < p_j(x_j); a later keep does not count."""
    p, q, drafts, proposals, _ = window(2, 5, seed=3, one_hot_q=True)
    target = p.gather(-1, drafts[..., None])[..., 0]
    uniforms = torch.where(torch.tensor([[1, 1, 0, 1, 1], [0, 1, 1, 1, 1]], dtype=torch.bool), target / 2,
                           (1 + target) / 2)
    accepted = check(both, RULES["exact"], p, q, drafts, proposals, uniforms, torch.ones_like(drafts).bool())
    assert accepted.tolist() == [2, 0]


@pytest.mark.parametrize("name", ["exact", "match"])
def test_a_draw_equal_to_the_acceptance_probability_rejects(name: str, both) -> None:
    """Ties at the boundary: a draft is kept only when its draw lies strictly below its acceptance probability
    (exact: p(x) in (0, 1) with one-hot q, formed exactly on both sides; match: 1, every draft drawn by p)."""
    p, q, drafts, _, _ = window(2, 5, seed=11, one_hot_q=True)
    valid = torch.ones_like(drafts, dtype=torch.bool)
    chance = RULES[name].accept_probs(p, q, drafts, drafts)
    accepted = check(both, RULES[name], p, q, drafts, drafts, chance, valid)
    assert accepted.tolist() == [0, 0]
    accepted = check(both, RULES[name], p, q, drafts, drafts, torch.nextafter(chance, torch.zeros(())), valid)
    assert accepted.tolist() == [5, 5]


@pytest.mark.parametrize(("mode", "delta", "moved"), [("tv", 0.375, 0.375), ("tv", 0.37, 0.25),
                                                       ("relative", 1.75, 0.375), ("relative", 1.7, 0.25)])
def test_lantern_moves_the_neighbour_mass_that_meets_the_budget_exactly(mode: str, delta: float, moved: float,
                                                                        both) -> None:
    """Masses that are exact binary fractions: a neighbour whose running mass equals the budget (delta, or
    (lambda - 1) p(x) with p(x) = 0.5) still gives its mass, one just past it does not."""
    p = torch.tensor([[[0.5, 0.25, 0.125, 0.0625, 0.0625]]])
    neighbours = torch.tensor([[1, 2, 3, 4], [0, 2, 3, 4], [0, 1, 3, 4], [0, 1, 2, 4], [0, 1, 2, 3]])
    drafts = torch.zeros(1, 1, dtype=torch.long)
    q = torch.ones(1, 1, 5)  # q(x) = 1: the acceptance probability is p~(x) itself
    rule, valid = LanternRule(neighbours, delta, mode=mode), torch.ones(1, 1, dtype=torch.bool)
    chance = torch.full((1, 1), 0.5 + moved)
    assert check(both, rule, p, q, drafts, drafts, chance, valid).item() == 0  # a draw at p~(x) rejects
    assert check(both, rule, p, q, drafts, drafts, torch.nextafter(chance, torch.zeros(())), valid).item() == 1


def test_gsd_groups_over_tied_probabilities(both) -> None:
    """Many equal target probabilities: the candidates are the draft's rank neighbours in the stable order."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randint(0, 3, (3, 6, V), generator=g).float()
    p = logits.softmax(-1)
    drafts = torch.randint(V, (3, 6), generator=g)
    rule = GroupedRule(torch.randn(V, 2, generator=g), rank_window=5, p_threshold=0.5, dist_threshold=2.0)
    q = F.one_hot(drafts, V).float()
    exact = p.gather(-1, drafts[..., None])[..., 0]
    grouped = rule.accept_probs(p, q, drafts, drafts)
    assert bool((grouped > exact + 1e-3).any())  # groups did form
    for uniforms in (torch.rand(3, 6, generator=g), (exact + grouped) / 2):  # the second: kept by the group only
        check(both, rule, p, q, drafts, drafts, uniforms, torch.ones(3, 6, dtype=torch.bool))


def test_an_empty_window_accepts_nothing(both) -> None:
    p, q, drafts, proposals, _ = window(2, 0, seed=1, one_hot_q=True)
    for name in ("exact", "gsd"):
        accepted = check(both, RULES[name], p, q, drafts, proposals, torch.zeros(2, 0),
                         torch.ones(2, 0, dtype=torch.bool))
        assert accepted.tolist() == [0, 0]


def test_the_kernel_takes_a_spec_of_plain_values() -> None:
    """The kernel called with a spec written out by hand (no sampler types) keeps the drafts the rule it describes
    keeps in torch."""
    g = torch.Generator().manual_seed(9)
    neighbours, embeddings = latent_neighbours(torch.randn(V, 3, generator=g), 8), torch.randn(V, 6, generator=g)
    cases = [(RuleSpec("lantern", neighbours=neighbours, delta=3.0, relative=True),
              LanternRule(neighbours, 3.0, mode="relative")),
             (RuleSpec("gsd", embeddings=embeddings, rank_window=4, p_threshold=0.05, dist_threshold=1.0),
              GroupedRule(embeddings, rank_window=4, p_threshold=0.05, dist_threshold=1.0))]
    p, q, drafts, proposals, g = window(4, 5, seed=2, one_hot_q=False)
    uniforms, valid = torch.rand(4, 5, generator=g), torch.ones(4, 5, dtype=torch.bool)
    for spec, rule in cases:
        kernel = accept.accept_drafts(spec, p, q, drafts, proposals, uniforms, valid)
        assert torch.equal(kernel, rule.accepted_length(p, q, drafts, proposals, uniforms, valid))
