"""A token layout places fixed tokens among a grid's codes: the full sequence and its codes round-trip, a window of
codes from any code is exactly that stretch of the full sequence, and each code's output position is the one just
before the next code; without fixed tokens a window is its codes."""

from __future__ import annotations

import pytest
import torch

from vgen.models.layout import TokenLayout

LAYOUT = TokenLayout((3, 3), row_end=(90, 91), head=(80, 81), tail=(70,))  # W = 3, E = 2


def test_the_sequence_holds_head_rows_with_their_ends_and_tail() -> None:
    codes = torch.arange(9)[None]
    seq = LAYOUT.sequence(codes)
    assert seq.tolist() == [[80, 81, 0, 1, 2, 90, 91, 3, 4, 5, 90, 91, 6, 7, 8, 90, 91, 70]]
    assert torch.equal(LAYOUT.codes_of(seq), codes)
    assert seq[0, 2 + LAYOUT.code_slots()].tolist() == list(range(9))


def test_offsets_and_widths() -> None:
    layout = TokenLayout((4, 3), row_end=(9,))
    assert [layout.offset(c) for c in (0, 2, 3, 4, 12)] == [0, 2, 4, 5, 16]
    assert [layout.max_width(k) for k in (1, 3, 4, 6, 7)] == [2, 4, 6, 8, 10]
    assert layout.period == 4 and layout.fixed_per_row == 1


@pytest.mark.parametrize("k", [1, 2, 3, 4, 7])
def test_a_window_is_its_stretch_of_the_sequence_from_any_first_code(k) -> None:
    codes = torch.arange(9) + 10
    body = LAYOUT.sequence(codes[None])[0, 2:]
    first = torch.arange(9 - k + 1)
    window = codes[first[:, None] + torch.arange(k)]
    widths = LAYOUT.offset(first + k) - LAYOUT.offset(first)
    ids, out = LAYOUT.window(first, window, LAYOUT.max_width(k))
    assert int(widths.max()) <= LAYOUT.max_width(k)
    for r, f in enumerate(first.tolist()):
        start = LAYOUT.offset(f)
        assert ids[r, :widths[r]].tolist() == body[start:start + widths[r]].tolist()
        # the output at out[j] predicts code f + j + 1: the position just before it in the sequence
        assert (start + out[r]).tolist() == [LAYOUT.offset(f + j + 1) - 1 for j in range(k)]
        assert int(out[r, -1]) == int(widths[r]) - 1
    assert set(ids.flatten().tolist()) <= set(codes.tolist()) | {90, 91}  # padding holds the row's own codes


def test_without_fixed_tokens_a_window_is_its_codes() -> None:
    layout = TokenLayout((2, 4))
    window = torch.tensor([[5, 6, 7], [1, 2, 3]])
    ids, out = layout.window(torch.tensor([0, 3]), window, 3)
    assert torch.equal(ids, window) and out.tolist() == [[0, 1, 2]] * 2
    assert layout.offset(5) == 5 and layout.max_width(3) == 3
    assert torch.equal(layout.sequence(window[:, :2].repeat(1, 4)), window[:, :2].repeat(1, 4))


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(grid=(0, 3)), "positive integers"),
    (dict(grid=(2, 3, 4)), "positive integers"),
    (dict(grid=(2, 3), row_end=(-1,)), "row_end must be non-negative token ids"),
])
def test_a_bad_layout_is_refused(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        TokenLayout(**kwargs)


def test_a_model_without_fixed_tokens_has_the_plain_layout(tiny_gpt) -> None:
    assert tiny_gpt.token_layout == TokenLayout((4, 4))
    assert tiny_gpt.code_embeddings() is tiny_gpt.tok_embeddings.weight
