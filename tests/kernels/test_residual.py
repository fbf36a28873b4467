"""The recover kernel equals its torch reference for every built-in rule: the same residual distribution (within
float32 rounding) and, handed the same uniform draws, the same recovered tokens."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="the kernel tests need triton (pip install -e '.[triton]')")

from vgen.kernels import RuleSpec, residual  # noqa: E402
from vgen.samplers.speculative.exact import ExactRule  # noqa: E402
from vgen.samplers.speculative.grouped import GroupedRule  # noqa: E402
from vgen.samplers.speculative.lantern import LanternRule, latent_neighbours  # noqa: E402
from vgen.samplers.speculative.match import MatchRule  # noqa: E402
from vgen.samplers.speculative.rules import recover  # noqa: E402

V = 53
_g = torch.Generator().manual_seed(0)
_CODEBOOK = torch.randn(V, 3, generator=_g)
RULES = {
    "exact": ExactRule(),
    "match": MatchRule(),
    "lantern-tv": LanternRule(latent_neighbours(_CODEBOOK, 10), delta=0.3),
    "lantern-relative": LanternRule(latent_neighbours(_CODEBOOK, 10), delta=4.0, mode="relative"),
    "gsd": GroupedRule(torch.randn(V, 4, generator=_g)),
}


def window(batch: int, length: int, seed: int, one_hot_q: bool):
    """p [B, L, V], q [B, L - 1, V], drafts [B, L - 1], proposals [B, L], a rejected position per row, a draw."""
    g = torch.Generator().manual_seed(seed)
    p = (torch.randn(batch, length, V, generator=g) * 2).softmax(-1)
    drafts = torch.randint(V, (batch, length - 1), generator=g)
    q = F.one_hot(drafts, V).float() if one_hot_q else (torch.randn(batch, length - 1, V, generator=g) * 2).softmax(-1)
    proposals = torch.randint(V, (batch, length), generator=g)
    at = torch.randint(length - 1, (batch,), generator=g)
    return p, q, drafts, proposals, at, torch.rand(batch, generator=g)


def check(both, rule, p, q, drafts, proposals, at, uniforms) -> tuple[torch.Tensor, torch.Tensor]:
    (ref_tokens, ref_residual), (tokens, res) = both(recover, rule, p, q, drafts, proposals, at, uniforms)
    torch.testing.assert_close(res, ref_residual, rtol=1e-5, atol=1e-7)
    assert torch.equal(tokens, ref_tokens) and tokens.dtype == torch.long
    return tokens, res


@pytest.mark.parametrize("name", RULES)
@pytest.mark.parametrize(("batch", "one_hot_q"), [(1, True), (5, False)])
@pytest.mark.parametrize("greedy", [False, True], ids=["sampled", "greedy"])
def test_random_rejections_match_the_reference(name: str, batch: int, one_hot_q: bool, greedy: bool, both) -> None:
    p, q, drafts, proposals, at, uniforms = window(batch, 4, seed=batch + 10 * greedy, one_hot_q=one_hot_q)
    tokens, res = check(both, RULES[name], p, q, drafts, proposals, at, None if greedy else uniforms)
    assert bool((res.gather(-1, tokens[:, None]) > 0).all())  # never a token the residual rules out


@pytest.mark.parametrize("name", RULES)
def test_rejections_at_both_ends_of_the_window(name: str, both) -> None:
    """The first draft rejected (every draft rejected) and only the last one (all the others accepted)."""
    p, q, drafts, proposals, _, uniforms = window(2, 5, seed=8, one_hot_q=False)
    at = torch.tensor([0, 3])
    for draws in (uniforms, None):
        check(both, RULES[name], p, q, drafts, proposals, at, draws)


def test_many_draws_agree_token_for_token(both) -> None:
    """One residual row, 64 draws spread over [0, 1): the kernel walks the same CDF as the reference."""
    p, q, drafts, proposals, _, _ = window(1, 3, seed=4, one_hot_q=False)
    rows = 64
    expand = lambda x: x.expand(rows, *x.shape[1:]).contiguous()  # noqa: E731
    uniforms = (torch.arange(rows) + 0.5) / rows
    tokens, _ = check(both, RULES["exact"], expand(p), expand(q), expand(drafts), expand(proposals),
                      torch.zeros(rows, dtype=torch.long), uniforms)
    assert len(set(tokens.tolist())) > 5  # the draws reached many tokens


def test_draws_at_the_ends_take_the_first_and_last_possible_tokens(both) -> None:
    p, q, drafts, proposals, at, _ = window(2, 3, seed=5, one_hot_q=True)
    for u, pick in ((0.0, lambda nz: nz[0]), (1 - 2 ** -24, lambda nz: nz[-1])):
        tokens, res = check(both, RULES["exact"], p, q, drafts, proposals, at, torch.full((2,), u))
        assert tokens.tolist() == [int(pick(row.nonzero().flatten())) for row in res]


def test_p_equal_to_q_falls_back_to_the_target(both) -> None:
    p, _, drafts, proposals, at, uniforms = window(3, 3, seed=6, one_hot_q=True)
    _, res = check(both, RULES["exact"], p, p[:, :-1], drafts, proposals, at, uniforms)
    torch.testing.assert_close(res, p[torch.arange(3), at])


def test_greedy_takes_the_first_of_tied_maxima(both) -> None:
    p = torch.full((2, 2, V), 1.0 / V)
    q = F.one_hot(torch.tensor([[3], [0]]), V).float()
    tokens, _ = check(both, RULES["exact"], p, q, torch.tensor([[3], [0]]), torch.zeros(2, 2, dtype=torch.long),
                      torch.zeros(2, dtype=torch.long), None)
    assert tokens.tolist() == [0, 1]  # the draft's own token is ruled out; the first of the rest is taken


def test_the_kernel_takes_a_spec_of_plain_values() -> None:
    """The kernel called with a spec written out by hand (no sampler types) gives the residual and token of the
    rule it describes in torch."""
    neighbours = latent_neighbours(_CODEBOOK, 10)
    spec, rule = RuleSpec("lantern", neighbours=neighbours, delta=0.3), LanternRule(neighbours, delta=0.3)
    p, q, drafts, proposals, at, uniforms = window(4, 4, seed=12, one_hot_q=False)
    tokens, res = residual.recover(spec, p, q, drafts, proposals, at, uniforms)
    ref_tokens, ref_residual = recover.reference(rule, p, q, drafts, proposals, at, uniforms)
    torch.testing.assert_close(res, ref_residual, rtol=1e-5, atol=1e-7)
    assert torch.equal(tokens, ref_tokens)
