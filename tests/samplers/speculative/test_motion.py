"""Motion-compensated fresh drafts (``draft_init="motion"``): a fresh draft in a clip copies the previous frame's
token under the local motion that best explains the known tokens around it, the motion-free cell on ties; only
tokens known before the pass are read, so greedy output equals greedy AR's."""

import pytest
import torch

from vgen.models.llamagen import GPTConfig
from vgen.samplers import ARSampler, SamplingParams, get_sampler
from vgen.samplers.speculative.drafters import draft_window
from vgen.samplers.speculative.motion import motion_offsets, motion_sources

GRID = (2, 4, 4)  # two frames of 4 x 4
VIDEO = GPTConfig(vocab_size=32, dim=32, n_layer=1, n_head=2, num_classes=3, block_size=48, frames=3)  # 3 x 4 x 4
CLASSES = torch.tensor([0, 2])


def moving_clip() -> torch.Tensor:
    """Frame 0: a 2 x 2 block of distinct tokens (1, 2 / 3, 4) at rows 1-2, columns 0-1 on background 0; frame 1:
    the same block one column to the right."""
    frame = torch.zeros(4, 4, dtype=torch.long)
    frame[1:3, 0:2] = torch.tensor([[1, 2], [3, 4]])
    return torch.cat([frame.flatten(), frame.roll(1, dims=1).flatten()])[None]


def test_candidate_motions_start_with_none_then_the_smallest() -> None:
    offsets = motion_offsets(1).tolist()
    assert len(offsets) == 9 and offsets[0] == [0, 0] and offsets[1:5] == [[-1, 0], [0, -1], [0, 1], [1, 0]]


def test_a_moving_block_is_followed_to_where_it_was() -> None:
    """In frame 1 the block moved one column right. Token (1, 2, 2) (the block's bottom-right, 4) sees its known
    template (left: 3; above: 2 and 1 to the left) matched by the motion (0, +1), so it copies frame 0's (2, 1),
    token 4; a background token with a flat template keeps the motion-free cell."""
    seq = moving_clip()
    known = torch.arange(32)[None] < 16 + 10  # frame 0 and frame 1 up to (1, 2, 1)
    index = torch.tensor([[16 + 10, 16 + 15]])  # (1, 2, 2) and (1, 3, 3)
    sources = motion_sources(seq, known, index, GRID)
    assert sources.tolist() == [[9, 15]]  # frame 0's (2, 1), and (3, 3) itself
    assert seq[0, 9] == seq[0, 16 + 10] == 4


def test_first_frame_tokens_and_image_grids_have_no_motion_source() -> None:
    seq, known = moving_clip(), torch.ones(1, 32, dtype=torch.bool)
    assert motion_sources(seq, known, torch.tensor([[5, 15]]), GRID).tolist() == [[-1, -1]]
    assert motion_sources(seq, known, torch.tensor([[5, 15]]), (4, 8)).tolist() == [[-1, -1]]


def test_fresh_drafts_copy_the_motion_source_and_vertical_ones_do_not() -> None:
    """The window at (1, 2, 2) with nothing carried: ``motion`` copies the block's token from where it was,
    ``vertical`` the token at the same cell of frame 0 (background)."""
    tokens = torch.cat([moving_clip()[:, :26], torch.zeros(1, 8, dtype=torch.long)], 1)
    carried = torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, 32), torch.zeros(1, dtype=torch.long)
    pos = torch.tensor([26])
    moved = draft_window(tokens, pos, *carried, None, 32, "motion", 16, True, GRID)[0]
    vertical = draft_window(tokens, pos, *carried, None, 32, "vertical", 16, True, GRID)[0]
    assert moved.tolist() == [[4]] and vertical.tolist() == [[0]]


@pytest.mark.parametrize(("window", "params"), [(6, SamplingParams(temperature=0.0)),
                                                (20, SamplingParams(temperature=0.0, cfg_scale=3.0))],
                         ids=["w6", "w20-cfg"])
def test_greedy_output_equals_greedy_ar(run_sampler, tiny_gpt_factory, window, params) -> None:
    model = tiny_gpt_factory(VIDEO)
    out = run_sampler(get_sampler("mcsjd", draft_init="motion", window=window), model, CLASSES, params)
    expected = ARSampler().sample(model, CLASSES, params, generator=torch.Generator().manual_seed(0)).tokens
    assert torch.equal(out.tokens, expected)
    assert out.stats.forward_passes < VIDEO.block_size
