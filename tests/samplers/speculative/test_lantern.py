"""LANTERN: latent neighbourhoods from the codebook, the moved mass stays within the budget, and for a one-hot
draft the accepted-or-recovered token is distributed exactly as the adjusted distribution."""

import pytest
import torch

from vgen.samplers.speculative.lantern import LanternRule, latent_neighbours, tokenizer_neighbours

# codes on a line: 0 and 1 are close, 2 a bit further, 3 far away
CODEBOOK = torch.tensor([[0.0], [0.1], [0.3], [5.0]])


def test_neighbours_are_the_k_closest_other_codes_closest_first() -> None:
    assert latent_neighbours(CODEBOOK, 2).tolist() == [[1, 2], [0, 2], [1, 0], [2, 1]]
    assert latent_neighbours(CODEBOOK, 0).shape == (4, 0)
    assert latent_neighbours(CODEBOOK, 1000).shape == (4, 3)  # every other code
    with pytest.raises(ValueError, match="lantern_k must be >= 0"):
        latent_neighbours(CODEBOOK, -1)


def test_neighbours_are_computed_once_per_tokenizer_and_k() -> None:
    class Tokenizer(torch.nn.Module):
        calls = 0

        def codebook(self) -> torch.Tensor:
            Tokenizer.calls += 1
            return CODEBOOK

    tok = Tokenizer()
    first = tokenizer_neighbours(tok, 2)
    assert tokenizer_neighbours(tok, 2) is first and Tokenizer.calls == 1


def test_hand_computed_tv_mode() -> None:
    """Draft 0 with p = [.2, .05, .1, .65]: neighbours 1 (.05) then 2 (.1); delta .1 moves only .05."""
    rule = LanternRule(latent_neighbours(CODEBOOK, 2), delta=0.1)
    p, draft = torch.tensor([0.2, 0.05, 0.1, 0.65]), torch.tensor(0)
    one_hot = torch.nn.functional.one_hot(draft, 4).float()
    assert rule.accept_probs(p, one_hot, draft, draft).item() == pytest.approx(0.25)
    torch.testing.assert_close(rule.adjusted(p, draft), torch.tensor([0.25, 0.0, 0.1, 0.65]))
    rule = LanternRule(latent_neighbours(CODEBOOK, 2), delta=0.15)
    assert rule.accept_probs(p, one_hot, draft, draft).item() == pytest.approx(0.35)


def test_hand_computed_relative_mode() -> None:
    """LANTERN++: lambda 1.5 allows moving 0.5 * p(x) = 0.1: neighbour 1 (.05) fits, then 2 (.1) would not."""
    rule = LanternRule(latent_neighbours(CODEBOOK, 2), delta=1.5, mode="relative")
    p, draft = torch.tensor([0.2, 0.05, 0.1, 0.65]), torch.tensor(0)
    torch.testing.assert_close(rule.adjusted(p, draft), torch.tensor([0.25, 0.0, 0.1, 0.65]))


@pytest.mark.parametrize(("delta", "mode"), [(0.05, "tv"), (0.2, "tv"), (1.0, "tv"), (2.0, "relative")])
def test_adjusted_distribution_stays_within_the_budget(delta: float, mode: str) -> None:
    g = torch.Generator().manual_seed(0)
    codebook = torch.randn(32, 4, generator=g)
    rule = LanternRule(latent_neighbours(codebook, 8), delta=delta, mode=mode)
    p = (torch.randn(500, 32, generator=g) * 2).softmax(-1)
    drafts = torch.randint(32, (500,), generator=g)
    adjusted = rule.adjusted(p, drafts)
    torch.testing.assert_close(adjusted.sum(-1), torch.ones(500))
    tv = 0.5 * (adjusted - p).abs().sum(-1)
    bound = delta if mode == "tv" else (delta - 1) * p.gather(-1, drafts[:, None])[:, 0]
    assert bool((tv <= bound + 1e-6).all())
    assert bool((tv > 0).any())  # the budget is actually used


def test_one_hot_draft_output_distribution_is_the_adjusted_one() -> None:
    """Accept with p~(x), else draw from the residual: the output law, enumerated exactly, is p~_x."""
    g = torch.Generator().manual_seed(1)
    rule = LanternRule(latent_neighbours(torch.randn(10, 3, generator=g), 4), delta=0.3)
    p = torch.randn(10, generator=g).softmax(-1)
    for x in range(10):
        draft = torch.tensor(x)
        q = torch.nn.functional.one_hot(draft, 10).float()
        a = rule.accept_probs(p, q, draft, draft)
        out = a * q + (1 - a) * rule.residual(p, q, draft, draft)
        torch.testing.assert_close(out, rule.adjusted(p, draft))


def test_zero_budget_is_the_exact_rule() -> None:
    from vgen.samplers.speculative.exact import ExactRule

    g = torch.Generator().manual_seed(2)
    rule = LanternRule(latent_neighbours(torch.randn(12, 3, generator=g), 5), delta=0.0)
    p, q = torch.randn(7, 12, generator=g).softmax(-1), torch.randn(7, 12, generator=g).softmax(-1)
    drafts = torch.randint(12, (7,), generator=g)
    exact = ExactRule()
    torch.testing.assert_close(rule.accept_probs(p, q, drafts, drafts), exact.accept_probs(p, q, drafts, drafts))
    torch.testing.assert_close(rule.residual(p, q, drafts, drafts), exact.residual(p, q, drafts, drafts))


@pytest.mark.parametrize(("delta", "mode", "message"), [
    (1.5, "tv", "total-variation budget in \\[0, 1\\]"),
    (-0.1, "tv", "total-variation budget"),
    (0.5, "relative", "lambda >= 1"),
    (0.1, "absolute", "lantern_mode must be one of"),
])
def test_bad_budgets_are_rejected(delta: float, mode: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LanternRule(latent_neighbours(CODEBOOK, 1), delta=delta, mode=mode)


@pytest.mark.parametrize(("mode", "delta"), [("tv", 0.2), ("relative", 3.0)])
def test_kernel_spec_carries_the_neighbours_budget_and_mode(mode: str, delta: float) -> None:
    neighbours = latent_neighbours(CODEBOOK, 2)
    spec = LanternRule(neighbours, delta, mode=mode).kernel_spec()
    assert (spec.kind, spec.delta, spec.relative) == ("lantern", delta, mode == "relative")
    assert spec.neighbours is neighbours
    assert type("Subclass", (LanternRule,), {})(neighbours, delta, mode=mode).kernel_spec() is None
