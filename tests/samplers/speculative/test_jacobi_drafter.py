"""The Jacobi drafter: fresh-draft initialisation, carrying the last pass's draws, and coupled refreshes that
stay exact samples of the new distribution while changing less often than independent draws."""

import pytest
import torch

from vgen.models.llamagen import GPTConfig, LlamaGenGPT
from vgen.samplers.base import SamplingParams
from vgen.samplers.speculative.drafters import DraftContext, JacobiDrafter, Verification, build_drafter
from vgen.samplers.speculative.sampler import Speculative

V = 6


def verification(probs: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor, seed: int, pos: int = 1,
                 accepted: int = 0) -> Verification:
    """One pass over a batch of identical rows: outputs ``probs`` [B, L, V], verified ``drafts`` [B, L-1]."""
    b = probs.shape[0]
    g = torch.Generator().manual_seed(seed)
    proposals = torch.multinomial(probs.reshape(-1, V), 1, generator=g).view(b, -1)
    tokens = torch.zeros(b, 32, dtype=torch.long)
    return Verification(torch.full((b,), pos), torch.full((b,), accepted), probs, proposals, None, tokens, drafts,
                        q, g)


@pytest.mark.parametrize("init", ["left", "vertical"])
def test_fresh_drafts_repeat_a_neighbour(init: str) -> None:
    drafter = JacobiDrafter(V, stride=4, init=init)
    tokens = torch.tensor([[1, 2, 3, 4, 5, 0, 0, 0, 0, 0]])
    drafts, q = drafter.propose(tokens, torch.tensor([5]), 3, None)
    # token 5 (row 1, column 1): left neighbour is token 4 (= 5), the one above is token 1 (= 2)
    assert drafts.tolist() == ([[5, 5, 5]] if init == "left" else [[2, 3, 4]])
    assert torch.equal(q, torch.nn.functional.one_hot(drafts, V).float())


def _repeat_left_to_right(tokens: torch.Tensor, pos: torch.Tensor, drafts: torch.Tensor, fresh: torch.Tensor,
                          init: str, stride: int) -> list[list[int]]:
    """The reference: walk the window left to right, each fresh draft copying its (already drafted) neighbour."""
    out = []
    for row, start, row_drafts, row_fresh in zip(tokens.tolist(), pos.tolist(), drafts.tolist(), fresh.tolist()):
        seq = row[:start] + row_drafts + row[start + len(row_drafts):]
        for i, is_fresh in enumerate(row_fresh):
            at = start + i
            source = at - stride if init == "vertical" and at >= stride else at - 1
            if is_fresh:
                seq[at] = seq[source]
        out.append(seq[start:start + len(row_drafts)])
    return out


@pytest.mark.parametrize("init", ["left", "vertical"])
@pytest.mark.parametrize("stride", [3, 4, 16])
def test_fresh_drafts_follow_chains_of_fresh_neighbours(init: str, stride: int) -> None:
    """Rows at different positions, with carried drafts then fresh ones, and windows longer than a row, so a
    fresh draft may repeat a neighbour that is itself a fresh draft (and that one another)."""
    g = torch.Generator().manual_seed(0)
    batch, count, n = 6, 9, 40
    tokens = torch.randint(V, (batch, n + count), generator=g)
    pos = torch.tensor([1, 2, 5, 9, 17, 30])
    carried_count = torch.tensor([0, 3, 9, 1, 5, 0])
    carried_tokens = torch.randint(V, (batch, count), generator=g)
    drafter = JacobiDrafter(V, stride=stride, init=init)
    drafter.carried = (carried_tokens, torch.rand(batch, count, V, generator=g), carried_count)
    drafts, _ = drafter.propose(tokens, pos, count, None)
    fresh = torch.arange(count)[None] >= carried_count[:, None]
    assert drafts.tolist() == _repeat_left_to_right(tokens, pos, carried_tokens, fresh, init, stride)


def test_the_last_pass_draws_become_the_next_drafts_with_their_distributions() -> None:
    drafter = JacobiDrafter(V, stride=4)
    probs = torch.rand(1, 4, V).softmax(-1)
    result = verification(probs, torch.zeros(1, 3, dtype=torch.long), torch.rand(1, 3, V).softmax(-1), seed=0,
                          accepted=1)
    drafter.observe(result)
    # the pass at pos 1 kept 1 draft and a recovered token: the next window starts at 3 = output 2 of this pass
    drafts, q = drafter.propose(result.tokens, torch.tensor([3]), 3, torch.Generator().manual_seed(0))
    assert drafts[0, :2].tolist() == result.proposals[0, 2:].tolist()
    torch.testing.assert_close(q[0, :2], probs[0, 2:])
    assert q[0, 2].max() == 1  # the position the last pass did not reach: a fresh one-hot draft


@pytest.mark.parametrize("coupling", ["maximal", "gumbel"])
def test_coupled_refreshes_are_exact_samples_and_change_less_often(coupling: str) -> None:
    """Draft x ~ q was refreshed from p: the new draft must be ~ p (whatever the coupling) and equal x more often
    than an independent draw would."""
    torch.manual_seed(0)
    n = 40000
    q = torch.tensor([0.4, 0.3, 0.1, 0.1, 0.05, 0.05])
    p = torch.tensor([0.35, 0.25, 0.2, 0.1, 0.05, 0.05])
    gen = torch.Generator().manual_seed(1)
    drafts = torch.multinomial(q.expand(n, V), 1, generator=gen)  # [n, 1]: the previous pass's drafts
    # gumbel: the previous draft came from argmax(log q + g) with the same per-position noise g
    drafter = JacobiDrafter(V, stride=4, coupling=coupling)
    if coupling == "gumbel":
        first = verification(q.expand(n, 2, V).clone(), torch.zeros(n, 1, dtype=torch.long), q.expand(n, 1, V),
                             seed=2, pos=1)
        drafts = drafter.refresh(first)[:, :1]
    second = verification(p.expand(n, 2, V).clone(), drafts, q.expand(n, 1, V), seed=3, pos=1)
    refreshed = drafter.refresh(second)[:, 0]
    freq = torch.bincount(refreshed, minlength=V) / n
    torch.testing.assert_close(freq, p, atol=0.01, rtol=0)  # ~5 standard errors
    same = (refreshed == drafts[:, 0]).float().mean()
    independent = (p * q).sum()  # P(fresh draw == old draft)
    assert same > independent + 0.3


@pytest.mark.parametrize(("frames", "block_size", "stride"), [(1, 16, 4), (3, 12, 4), (2, 32, 16)])
def test_vertical_drafts_step_back_one_row_of_an_image_or_one_frame_of_a_clip(frames: int, block_size: int,
                                                                             stride: int) -> None:
    with torch.device("meta"):
        model = LlamaGenGPT(GPTConfig(vocab_size=V, dim=32, n_layer=1, n_head=2, num_classes=2,
                                      block_size=block_size, frames=frames))
    drafter = build_drafter("jacobi", Speculative(draft_init="vertical"), model, DraftContext(SamplingParams()))
    assert drafter.stride == stride  # 4 x 4 image: a row; 3 frames of 2 x 2: a frame; 2 frames of 4 x 4: a frame


@pytest.mark.parametrize(("init", "coupling"), [("random", "none"), ("vertical", "gumbel")])
def test_a_pass_of_the_drafter_reads_no_value_from_the_device(init: str, coupling: str) -> None:
    """Between two compiled verify passes on a GPU, a host read of a tensor's value would wait for the device: on
    meta tensors, which hold no values, any such read fails, so proposing and observing there proves none."""
    batch, length, n = 3, 6, 32
    drafter = JacobiDrafter(V, stride=4, init=init, coupling=coupling)
    with torch.device("meta"):
        tokens = torch.zeros(batch, n + length, dtype=torch.long)
        for pos in (torch.ones(batch, dtype=torch.long), torch.full((batch,), 4)):
            drafts, q = drafter.propose(tokens, pos, length - 1, None)
            probs = torch.rand(batch, length, V).softmax(-1)
            drafter.observe(Verification(pos, torch.zeros(batch, dtype=torch.long), probs,
                                         torch.zeros(batch, length, dtype=torch.long), None, tokens, drafts, q))
    assert drafts.shape == (batch, length - 1) and q.shape == (batch, length - 1, V)
