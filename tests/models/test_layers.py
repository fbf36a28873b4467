"""Rotary tables for grids of any rank against the closed form written out here (the 2-D square case is also
LlamaGen's table, checked against LlamaGen's formula in test_llamagen.py)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from vgen.models.layers import PrefixMask, apply_rope, rope_2d_table, rope_grid_table


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


def test_an_identity_prefix_is_unturned_and_the_grid_rows_are_unchanged() -> None:
    zero, identity = rope_2d_table(4, 16, num_prefix=3), rope_2d_table(4, 16, num_prefix=3, prefix="identity")
    assert torch.equal(identity[:3, :, 0], torch.ones(3, 8)) and torch.count_nonzero(identity[:3, :, 1]) == 0
    assert torch.equal(identity[3:], zero[3:])
    with pytest.raises(ValueError, match="prefix rotation must be one of \\('zero', 'identity'\\), got 'one'"):
        rope_2d_table(4, 16, prefix="one")


@pytest.mark.parametrize("prefix", ["zero", "identity"])
def test_only_an_identity_prefix_lets_a_query_score_the_prefix_by_its_column(prefix: str) -> None:
    """A query q at grid place (r, c) scores a prefix key k by <rot(q, r, c), rot(k, prefix)>. Under LlamaGen's zero
    prefix that is 0 everywhere, so no caption word can be looked up by where the query is; under the identity
    prefix the same q and k score differently in different columns of one row."""
    grid, head_dim = 4, 16
    table = rope_2d_table(grid, head_dim, num_prefix=1, prefix=prefix)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, head_dim, generator=g), torch.randn(1, 1, 1, head_dim, generator=g)
    key = apply_rope(k, table[:1])
    scores = torch.stack([(apply_rope(q, table[1 + c:2 + c]) * key).sum() for c in range(grid)])  # row 0
    if prefix == "zero":
        assert torch.count_nonzero(scores) == 0
    else:
        assert scores.max() - scores.min() > 0.1 * scores.abs().max()


@pytest.mark.parametrize(("shape", "head_dim"), [((4, 0), 16), ((2, 2, 2), 4), ((3, 3), 7)])
def test_grid_table_rejects_empty_axes_and_too_few_pairs(shape: tuple[int, ...], head_dim: int) -> None:
    with pytest.raises(ValueError, match="rotary table for grid"):
        rope_grid_table(shape, head_dim)


def dense_of(ends: torch.Tensor) -> torch.Tensor:
    return torch.arange(int(ends[-1]))[None, :] < ends[:, None]


@pytest.mark.parametrize("ends", [torch.arange(1, 41),  # causal
                                  torch.tensor([1] + [5] * 4 + [9] * 4 + [13] * 4 + [17] * 4),  # block-causal
                                  torch.tensor([1, 2, 4, 4, 7, 7, 7, 11, 11, 11, 11, 12])])  # NAR's steps, sorted
@pytest.mark.parametrize("min_chunk", [1, 3, 5, 128])
def test_prefix_mask_attention_equals_the_dense_mask_with_gradients(ends: torch.Tensor, min_chunk: int) -> None:
    g = torch.Generator().manual_seed(0)
    t, keys = len(ends), int(ends[-1])
    q = torch.randn(2, 3, t, 8, generator=g, requires_grad=True)
    k, v = (torch.randn(2, 3, keys, 8, generator=g, requires_grad=True) for _ in range(2))
    weights = torch.randn(2, 3, t, 8, generator=g)
    chunked = PrefixMask(ends, min_chunk).attention(q, k, v)
    grads = torch.autograd.grad((chunked * weights).sum(), (q, k, v))
    dense = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_of(ends))
    torch.testing.assert_close(chunked, dense, atol=1e-6, rtol=0)
    for got, want in zip(grads, torch.autograd.grad((dense * weights).sum(), (q, k, v))):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_prefix_mask_chunks_cover_the_queries_once_and_never_split_equal_key_counts() -> None:
    ends = torch.tensor([1, 3, 3, 3, 3, 6, 6, 9])
    chunks = PrefixMask(ends, min_chunk=2).chunks
    assert [c[:3] for c in chunks] == [(0, 5, 3), (5, 7, 6), (7, 8, 9)]
    assert chunks[1][3] is None and chunks[2][3] is None  # one key count: no mask needed
    assert torch.equal(chunks[0][3], dense_of(ends)[:5, :3])


@pytest.mark.parametrize("ends", [torch.tensor([2, 1]), torch.tensor([0, 1]), torch.tensor([], dtype=torch.long),
                                  torch.ones(2, 2)])
def test_prefix_mask_rejects_rows_that_are_not_growing_prefixes(ends: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="non-decreasing row of key counts"):
        PrefixMask(ends)


def test_prefix_mask_from_a_dense_mask_keeps_its_rows_or_refuses_it() -> None:
    ends = torch.tensor([1, 3, 3, 4])
    assert torch.equal(PrefixMask.from_dense(dense_of(ends)).ends, ends)
    holed = dense_of(ends).clone()
    holed[2, 1] = False
    with pytest.raises(ValueError, match="not growing prefixes"):
        PrefixMask.from_dense(holed)
    with pytest.raises(ValueError, match="not growing prefixes"):
        PrefixMask.from_dense(torch.tensor([[True, False, False], [True, True, False]]))  # a key nobody sees


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_prefix_mask_attention_on_cuda_equals_the_dense_mask(dtype: torch.dtype, tolerance: float) -> None:
    """CUDA's attention kernels take the chunks' masks (slices of one dense mask) as they take a whole mask."""
    ends = torch.cat([torch.arange(1, 40), torch.arange(1, 9).repeat_interleave(30) * 30 + 40]).cuda()
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 4, len(ends), 32, generator=g, device="cuda", dtype=dtype, requires_grad=True)
    k, v = (torch.randn(2, 4, int(ends[-1]), 32, generator=g, device="cuda", dtype=dtype, requires_grad=True)
            for _ in range(2))
    chunked = PrefixMask(ends).attention(q, k, v)
    dense = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_of(ends.cpu()).cuda())
    torch.testing.assert_close(chunked, dense, atol=tolerance, rtol=0)
    for got, want in zip(torch.autograd.grad(chunked.float().sum(), (q, k, v)),
                         torch.autograd.grad(dense.float().sum(), (q, k, v))):
        torch.testing.assert_close(got, want, atol=tolerance * 10, rtol=0)
