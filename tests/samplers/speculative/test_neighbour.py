"""The ``neighbour`` drafter: a fresh draft is a draw from the target's distribution at its grid neighbour (the
token above, the same cell one frame earlier), carried drafts stay MC-SJD's, and the drafts change only what is
proposed: greedy output equals greedy AR's on image, text-to-image, video and fixed-token layouts (the sampled law
is checked by the chi-square tests of test_speculative_sampler.py)."""

import pytest
import torch
import torch.nn.functional as F

from vgen.models.conditioning import PrefixCondition
from vgen.models.llamagen import GPTConfig
from vgen.samplers import ARSampler, SamplingParams, get_sampler
from vgen.samplers.speculative import available_drafters
from vgen.samplers.speculative.drafters import Verification
from vgen.samplers.speculative.neighbour import NeighbourDrafter, grid_neighbour

V = 5
GREEDY = {"greedy": SamplingParams(temperature=0.0), "greedy-cfg": SamplingParams(temperature=0.0, cfg_scale=3.0)}
IMAGE = GPTConfig(vocab_size=32, dim=32, n_layer=1, n_head=2, num_classes=3, block_size=36)  # 6 x 6
VIDEO = GPTConfig(vocab_size=32, dim=32, n_layer=1, n_head=2, num_classes=3, block_size=27, frames=3)  # 3 x 3 x 3
T2I = GPTConfig(vocab_size=32, dim=32, n_layer=1, n_head=2, block_size=16, model_type="t2i", caption_dim=8,
                cls_token_num=6)
CLASSES = torch.tensor([0, 2])


def test_the_neighbour_is_one_step_back_along_the_outermost_axis_that_allows_it() -> None:
    image = grid_neighbour(torch.arange(12), (3, 4))
    assert image.tolist() == [-1, 0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 7]  # first row: left; then the token above
    video = grid_neighbour(torch.arange(12), (3, 2, 2))
    assert video.tolist() == [-1, 0, 0, 1, 0, 1, 2, 3, 4, 5, 6, 7]  # frame 0 as an image; then the previous frame


def one_hot(tokens: list[int]) -> torch.Tensor:
    return F.one_hot(torch.tensor([tokens], dtype=torch.long), V).float()


def observe(drafter: NeighbourDrafter, pos: int, probs: torch.Tensor, accepted: int, drafts: list[int]) -> None:
    """Tell the drafter a pass at ``pos`` gave ``probs`` [1, L, V] and kept ``accepted`` of ``drafts``."""
    d = torch.tensor([drafts], dtype=torch.long)
    drafter.observe(Verification(torch.tensor([pos]), torch.tensor([accepted]), probs, probs.argmax(-1), None,
                                 torch.zeros(1, 24, dtype=torch.long), d, one_hot(drafts)))


@pytest.mark.parametrize("coupling", ["gumbel", "none"])
def test_fresh_drafts_draw_from_the_targets_distribution_at_their_neighbour(coupling: str) -> None:
    """A 3x4 grid, windows of 4 (3 drafts). After the prefill every draft chains back to token 0's law. The pass at
    token 1 reaches tokens 1 .. 4 and keeps one draft, so the next window (tokens 3 .. 5) carries tokens 3 and 4 with
    their own laws and drafts token 5 fresh from the law the target gave at token 1 (above it)."""
    drafter = NeighbourDrafter(V, (3, 4), window=4, coupling=coupling)
    observe(drafter, 0, one_hot([3]), 0, [])  # the prefill: token 0
    first, q_first = drafter.propose(torch.zeros(1, 24, dtype=torch.long), torch.tensor([1]), 3, None)
    assert first.tolist() == [[3, 3, 3]] and torch.equal(q_first, one_hot([3, 3, 3]))
    at_one = torch.tensor([[[0.0, 0.0, 1.0, 0.0, 0.0], [0.1, 0.2, 0.3, 0.2, 0.2], [0.0, 0.0, 0.0, 1.0, 0.0],
                            [0.0, 0.0, 0.0, 0.0, 1.0]]])  # tokens 1 (one-hot 2), 2, 3 (one-hot 3) and 4 (4)
    observe(drafter, 1, at_one, 1, first[0].tolist())
    drafts, q = drafter.propose(torch.zeros(1, 24, dtype=torch.long), torch.tensor([3]), 3, None)
    assert drafts.tolist() == [[3, 4, 2]]  # tokens 3 and 4 carried; token 5 drawn from token 1's law
    torch.testing.assert_close(q, at_one[:, [2, 3, 0]])


def test_a_neighbour_no_pass_reached_hands_over_to_its_own() -> None:
    """A 5x4 grid, windows of 9. The pass at token 1 accepts every draft (tokens 1 .. 9 reached, token j's law
    one-hot at j % 5); in the next window, tokens 10 .. 13 draw from the tokens above them (6 .. 9), and tokens
    14 .. 17, whose neighbours 10 .. 13 are fresh too, from those neighbours' neighbours."""
    drafter = NeighbourDrafter(V, (5, 4), window=9)
    observe(drafter, 0, one_hot([0]), 0, [])
    drafts, _ = drafter.propose(torch.zeros(1, 32, dtype=torch.long), torch.tensor([1]), 8, None)
    observe(drafter, 1, one_hot([j % V for j in range(1, 10)]), 8, drafts[0].tolist())
    drafts, q = drafter.propose(torch.zeros(1, 32, dtype=torch.long), torch.tensor([10]), 8, None)
    assert drafts.tolist() == [[1, 2, 3, 4, 1, 2, 3, 4]]
    assert torch.equal(q, one_hot(drafts[0].tolist()))


def test_every_speculative_sampler_takes_the_drafter() -> None:
    assert "neighbour" in available_drafters()
    sampler = get_sampler("mcsjd", drafter="neighbour", window=16)
    assert get_sampler(sampler.to_dict()) == sampler


def ar(model, cond, params: SamplingParams) -> torch.Tensor:
    return ARSampler().sample(model, cond, params, generator=torch.Generator().manual_seed(0)).tokens


@pytest.mark.parametrize(("sampler", "config", "window", "params"),
                         [("mcsjd", IMAGE, 4, GREEDY["greedy"]), ("mcsjd", IMAGE, 16, GREEDY["greedy-cfg"]),
                          ("sjd", IMAGE, 8, GREEDY["greedy-cfg"]), ("mcsjd", VIDEO, 6, GREEDY["greedy-cfg"]),
                          ("mcsjd", VIDEO, 16, GREEDY["greedy"])],
                         ids=["image-w4", "image-w16-cfg", "image-sjd-w8-cfg", "video-w6-cfg", "video-w16"])
def test_greedy_output_equals_greedy_ar(run_sampler, tiny_gpt_factory, sampler, config, window, params) -> None:
    """Windows shorter and longer than a row (and than a frame); Gumbel-coupled and independent refreshes."""
    model = tiny_gpt_factory(config)
    out = run_sampler(get_sampler(sampler, drafter="neighbour", window=window), model, CLASSES, params)
    assert torch.equal(out.tokens, ar(model, CLASSES, params))
    assert out.stats.details["drafter"] == "neighbour"


def test_greedy_output_equals_greedy_ar_on_a_text_to_image_model(run_sampler, tiny_gpt_factory) -> None:
    model = tiny_gpt_factory(T2I)
    g = torch.Generator().manual_seed(0)
    mask = torch.arange(T2I.cls_token_num)[None] >= T2I.cls_token_num - torch.tensor([[4], [2]])
    prompts = PrefixCondition(torch.randn(2, T2I.cls_token_num, T2I.caption_dim, generator=g) * mask[..., None], mask)
    params = GREEDY["greedy-cfg"]
    out = run_sampler(get_sampler("mcsjd", drafter="neighbour", window=6), model, prompts, params)
    assert torch.equal(out.tokens, ar(model, prompts, params))


@pytest.mark.parametrize("params", GREEDY.values(), ids=GREEDY.keys())
def test_fixed_tokens_stay_outside_the_drafts(run_sampler, tiny_layout_lm, layout_prompts, params) -> None:
    """A model with a row end after every row of codes: the grid is the codes' (3 x 4), the row ends are the
    backbone's, and greedy output equals greedy AR's codes across row ends."""
    model = tiny_layout_lm((3, 4))
    prompts = layout_prompts(model, (4, 1))
    cond = PrefixCondition(prompts.values, prompts.mask, layout_prompts(model, (2, 5), seed=3))
    out = run_sampler(get_sampler("mcsjd", drafter="neighbour", window=6), model, cond, params)
    assert out.tokens.shape == (2, 12) and torch.equal(out.tokens, ar(model, cond, params))
    assert out.stats.forward_passes < 12
