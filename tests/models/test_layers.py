"""Rotary tables for grids of any rank against the closed form written out here (the 2-D square case is also
LlamaGen's table, checked against LlamaGen's formula in test_llamagen.py)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from vgen.models.layers import rope_2d_table, rope_grid_table


def closed_form_angles(shape: tuple[int, ...], head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """[prod(shape), head_dim // 2] angles: axis a owns a contiguous block of k_a pairs (the first axis the
    remainder of an even split), and pair j of that block turns by coord_a * base^(-j / k_a)."""
    pairs, rank = head_dim // 2, len(shape)
    counts = [pairs - (rank - 1) * (pairs // rank)] + [pairs // rank] * (rank - 1)
    rows = []
    for coord in itertools.product(*(range(n) for n in shape)):  # raster order: last axis fastest
        rows.append([coord[a] * base ** (-j / k) for a, k in enumerate(counts) for j in range(k)])
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize(("shape", "head_dim"), [((2, 3, 4), 64), ((4, 16, 16), 48), ((3, 5), 16), ((5, 3), 12),
                                                  ((2, 2, 2), 6)])
def test_grid_table_matches_the_closed_form(shape: tuple[int, ...], head_dim: int) -> None:
    table = rope_grid_table(shape, head_dim, num_prefix=2).double()
    assert table.shape == (2 + math.prod(shape), head_dim // 2, 2)
    assert torch.count_nonzero(table[:2]) == 0
    angles = closed_form_angles(shape, head_dim)
    torch.testing.assert_close(table[2:, :, 0], angles.cos(), atol=1e-5, rtol=0)
    torch.testing.assert_close(table[2:, :, 1], angles.sin(), atol=1e-5, rtol=0)


def test_three_axis_split_of_64_dims() -> None:
    """32 pairs over (frames, rows, columns): 12 for frames, 10 each for rows and columns."""
    table = rope_grid_table((2, 2, 2), 64, num_prefix=0)
    # position (1, 0, 0) turns only the frame block; (0, 1, 0) only the row block; (0, 0, 1) only the columns
    turned = [(table[i, :, 1] != 0).nonzero().flatten().tolist() for i in (4, 2, 1)]
    assert turned == [list(range(0, 12)), list(range(12, 22)), list(range(22, 32))]


def test_square_grid_is_llamagens_2d_table() -> None:
    assert torch.equal(rope_grid_table((16, 16), 64), rope_2d_table(16, 64))


@pytest.mark.parametrize(("shape", "head_dim"), [((4, 0), 16), ((2, 2, 2), 4), ((3, 3), 7)])
def test_grid_table_rejects_empty_axes_and_too_few_pairs(shape: tuple[int, ...], head_dim: int) -> None:
    with pytest.raises(ValueError, match="rotary table for grid"):
        rope_grid_table(shape, head_dim)
