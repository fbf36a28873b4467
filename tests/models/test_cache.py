"""KV cache: decoding in chunks of any size equals the full causal forward; ``crop`` rolls back exactly.

The oracle is ``LlamaGenGPT.forward``, which runs the whole sequence with a causal mask and no cache: every
cached path (prefill, multi-token decode, crop then re-decode, grouped-query heads) must reproduce its logits.
"""

from __future__ import annotations

import pytest
import torch

from vgen.models.cache import KVCache
from vgen.models.llamagen import GPTConfig, LlamaGenGPT
from vgen.samplers.speculative.tree import TreeShape

CONFIG = GPTConfig(vocab_size=48, dim=64, n_layer=2, n_head=4, num_classes=7, block_size=16)
CLASSES = torch.tensor([3, 7])  # class 7 is the null (CFG) row
ATOL = 1e-4  # logits reach ~10; fp32 reordering between the paths stays below 3e-5




def random_tokens(n: int, config: GPTConfig = CONFIG, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.vocab_size, (len(CLASSES), n), generator=g)


def cached_logits(model: LlamaGenGPT, tokens: torch.Tensor, chunks: list[int],
                  cache: KVCache | None = None) -> torch.Tensor:
    """Prefill, then decode ``tokens`` in chunks of the given sizes; logits [B, 1 + sum(chunks), V]."""
    cache = cache or model.new_cache(len(CLASSES))
    out = [model.prefill(CLASSES, cache)[:, None]]
    pos = 0
    for n in chunks:
        out.append(model.decode(tokens[:, pos:pos + n], cache))
        pos += n
    assert cache.length == 1 + pos
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("chunks", [[1] * 15, [3, 1, 5, 2, 4], [15], [7, 8], [1, 1, 6, 1, 6]])
@torch.no_grad()
def test_prefill_then_decode_chunks_equals_full_forward(chunks: list[int], tiny_gpt_factory) -> None:
    model = tiny_gpt_factory(CONFIG)
    tokens = random_tokens(sum(chunks))
    full = model(CLASSES, tokens)
    assert full.shape == (2, 1 + sum(chunks), CONFIG.vocab_size)
    torch.testing.assert_close(cached_logits(model, tokens, chunks), full, atol=ATOL, rtol=0)


@torch.no_grad()
def test_grouped_query_attention_cache_equals_full_forward(tiny_gpt_factory) -> None:
    config = GPTConfig(vocab_size=48, dim=64, n_layer=2, n_head=4, n_kv_head=2, num_classes=7, block_size=16)
    model = tiny_gpt_factory(config)
    cache = model.new_cache(len(CLASSES))
    assert cache.keys[0].shape == (2, 2, 17, 16)  # the cache stores the kv heads only
    tokens = random_tokens(12, config)
    got = cached_logits(model, tokens, [4, 1, 7])
    torch.testing.assert_close(got, model(CLASSES, tokens), atol=ATOL, rtol=0)


@pytest.mark.parametrize("keep", [1, 4, 9])
@torch.no_grad()
def test_crop_then_redecode_equals_a_fresh_forward(keep: int, tiny_gpt_factory) -> None:
    """Decode drafts, roll back to ``keep`` cached positions, decode other tokens: no trace of the drafts."""
    model = tiny_gpt_factory(CONFIG)
    prefix, drafts = random_tokens(keep - 1, seed=1), random_tokens(6, seed=2)
    replacement = random_tokens(5, seed=3)
    cache = model.new_cache(len(CLASSES))
    model.prefill(CLASSES, cache)
    if keep > 1:
        model.decode(prefix, cache)
    model.decode(drafts, cache)
    cache.crop(keep)
    assert cache.length == keep
    got = model.decode(replacement, cache)
    fresh = model(CLASSES, torch.cat([prefix, replacement], dim=1))[:, keep:]
    torch.testing.assert_close(got, fresh, atol=ATOL, rtol=0)


@torch.no_grad()
def test_crop_to_zero_allows_a_new_prefill(tiny_gpt_factory) -> None:
    model = tiny_gpt_factory(CONFIG)
    cache = model.new_cache(len(CLASSES))
    model.prefill(torch.tensor([1, 2]), cache)
    model.decode(random_tokens(3), cache)
    cache.crop(0)
    tokens = random_tokens(4, seed=5)
    got = cached_logits(model, tokens, [4], cache)
    torch.testing.assert_close(got, model(CLASSES, tokens), atol=ATOL, rtol=0)


@torch.no_grad()
def test_decoding_past_the_end_of_the_cache_raises_and_leaves_it_intact(tiny_gpt_factory) -> None:
    model = tiny_gpt_factory(CONFIG)
    cache = model.new_cache(len(CLASSES))
    assert cache.max_len == 1 + CONFIG.block_size
    model.prefill(CLASSES, cache)
    model.decode(random_tokens(14), cache)
    with pytest.raises(ValueError, match=r"overflow: 15 cached \+ 3 new > max_len 17"):
        model.decode(random_tokens(3), cache)
    assert cache.length == 15
    model.decode(random_tokens(2), cache)  # exactly full is fine
    assert cache.length == 17
    with pytest.raises(ValueError, match="overflow"):
        model.decode(random_tokens(1), cache)


@torch.no_grad()
def test_prefill_needs_an_empty_cache(tiny_gpt_factory) -> None:
    model = tiny_gpt_factory(CONFIG)
    cache = model.new_cache(len(CLASSES))
    model.prefill(CLASSES, cache)
    with pytest.raises(ValueError, match="empty cache"):
        model.prefill(CLASSES, cache)


@pytest.mark.parametrize("length", [-1, 4])
def test_crop_out_of_range_raises(length: int) -> None:
    cache = KVCache(num_layers=1, batch_size=1, num_heads=1, max_len=8, head_dim=2)
    cache.advance(3)
    with pytest.raises(ValueError, match=f"cannot crop a cache of length 3 to {length}"):
        cache.crop(length)
    assert cache.length == 3


def test_append_writes_after_the_cached_positions_and_advance_commits_them() -> None:
    cache = KVCache(num_layers=2, batch_size=1, num_heads=1, max_len=6, head_dim=2)
    k1, v1 = torch.ones(1, 1, 2, 2), 2 * torch.ones(1, 1, 2, 2)
    keys, values = cache.append(0, k1, v1)
    assert keys.shape == (1, 1, 2, 2) and torch.equal(keys, k1) and torch.equal(values, v1)
    assert cache.length == 0  # every layer of the same pass writes the same slots
    cache.append(1, k1, v1)
    cache.advance(2)
    k2 = 3 * torch.ones(1, 1, 3, 2)
    keys, values = cache.append(0, k2, k2)
    assert torch.equal(keys, torch.cat([k1, k2], dim=2)) and torch.equal(values, torch.cat([v1, k2], dim=2))
    assert cache.reserve(3) == 2
    assert cache.batch_size == 1


@pytest.mark.parametrize("starts", [[2, 2], [1, 3]])
def test_write_rows_puts_each_rows_keys_at_its_own_slots(starts: list[int]) -> None:
    """A common start takes the slice write, different starts the scatter: both land every key at its row's
    slots, and ``attend`` lets query i of a row see its keys up to its own slot i only."""
    cache = KVCache(num_layers=1, batch_size=2, num_heads=1, max_len=8, head_dim=1)
    rows = cache.row_slots(torch.tensor(starts), 3)
    assert rows.common_start == (2 if starts == [2, 2] else None) and rows.end == max(starts) + 3
    k = torch.arange(1.0, 7.0).reshape(2, 1, 3, 1)
    keys, values = cache.write_rows(0, k, -k, rows)
    assert keys.shape == (2, 1, rows.end, 1) and torch.equal(values, -keys)
    for row, start in enumerate(starts):
        expected = torch.zeros(rows.end)
        expected[start:start + 3] = k[row, 0, :, 0]
        assert torch.equal(keys[row, 0, :, 0], expected)
        assert torch.equal(rows.attend[row, 0], torch.arange(rows.end)[None, :] <= rows.slots[row][:, None])


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_a_tree_node_sits_at_its_depth_and_sees_its_rows_prefix_and_its_ancestors_only(static: bool) -> None:
    """Nodes 1 and 2 are the root's children, node 3 is node 1's; written from slots 2 and 4, node i takes slot
    start + i (as a window would) but position start + depth[i]."""
    cache = KVCache(num_layers=1, batch_size=2, num_heads=1, max_len=10, head_dim=1)
    tree = TreeShape.from_parents([-1, 0, 0, 1])
    rows = cache.row_slots(torch.tensor([2, 4]), 4, static=static, tree=tree)
    assert rows.slots.tolist() == [[2, 3, 4, 5], [4, 5, 6, 7]] and rows.end == (10 if static else 8)
    assert rows.positions.tolist() == [[2, 3, 3, 4], [4, 5, 5, 6]]
    seen = [[torch.nonzero(rows.attend[row, 0, node])[:, 0].tolist() for node in range(4)] for row in range(2)]
    assert seen == [[[0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 4], [0, 1, 2, 3, 5]],
                    [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 6], [0, 1, 2, 3, 4, 5, 7]]]
    assert torch.equal(cache.row_slots(torch.tensor([2, 4]), 4).position_ids, rows.slots)  # no tree: the slots
    with pytest.raises(ValueError, match="a tree of 4 nodes cannot fill a window of 3 slots"):
        cache.row_slots(torch.tensor([2, 4]), 3, tree=tree)


def test_move_slots_copies_where_masked_in_every_layer_reading_before_writing() -> None:
    """Row 0 shifts slots 2..4 down by one (slots 2 and 3 are read and written: a shift, not a smear), row 1 moves
    slot 5 to slot 1 and leaves the slots of its masked entries as they were."""
    cache = KVCache(num_layers=2, batch_size=2, num_heads=1, max_len=6, head_dim=2)
    for i, buffer in enumerate(cache.buffers()):
        buffer.copy_(torch.arange(buffer.numel(), dtype=torch.float32).reshape(buffer.shape) + 100 * i)
    before = [buffer.clone() for buffer in cache.buffers()]
    mask = torch.tensor([[True, True, True], [True, False, False]])
    cache.move_slots(torch.tensor([[2, 3, 4], [5, 2, 0]]), torch.tensor([[1, 2, 3], [1, 3, 4]]), mask)
    for old, new in zip(before, cache.buffers()):
        expected = old.clone()
        expected[0, :, 1:4] = old[0, :, 2:5]
        expected[1, :, 1] = old[1, :, 5]
        assert torch.equal(new, expected)


def test_row_slots_past_the_cache_raise() -> None:
    cache = KVCache(num_layers=1, batch_size=2, num_heads=1, max_len=8, head_dim=1)
    with pytest.raises(ValueError, match="KV cache overflow: slot 8 requested, max_len 8"):
        cache.row_slots(torch.tensor([1, 6]), 3)


@torch.no_grad()
def test_a_video_layout_cache_equals_full_forward(tiny_gpt_factory) -> None:
    """Three frames of 2 x 2 tokens (vgen's next-token video AR): the same cache contract over the 3-D rotary table."""
    config = GPTConfig(vocab_size=48, dim=64, n_layer=2, n_head=4, num_classes=7, block_size=12, frames=3)
    model = tiny_gpt_factory(config)
    tokens = random_tokens(12, config)
    got = cached_logits(model, tokens[:, :11], [1, 4, 6])
    torch.testing.assert_close(got, model(CLASSES, tokens[:, :11]), atol=ATOL, rtol=0)


def test_rows_advancing_independently_equal_the_full_forward(tiny_gpt_factory) -> None:
    """``decode_rows``: each row writes a window at its own start, stale draft keys past a row's length are
    ignored, and every row's logits equal the full causal forward of its own sequence."""
    model = tiny_gpt_factory(CONFIG)
    tokens = random_tokens(15)
    cache = model.new_cache(len(CLASSES), extra=4)
    model.prefill(CLASSES, cache)
    starts = torch.tensor([1, 1])
    first = model.decode_rows(tokens[:, :6], starts, cache)  # both rows decode 6 tokens (some are "drafts")
    full = model(CLASSES, tokens)
    torch.testing.assert_close(first, full[:, 1:7], atol=ATOL, rtol=0)
    # row 0 keeps 2 of them, row 1 keeps 5: their next windows start at different slots, over stale keys
    starts = torch.tensor([3, 6])
    window = torch.stack([tokens[0, 2:9], tokens[1, 5:12]])
    got = model.decode_rows(window, starts, cache)
    torch.testing.assert_close(got[0], full[0, 3:10], atol=ATOL, rtol=0)
    torch.testing.assert_close(got[1], full[1, 6:13], atol=ATOL, rtol=0)


@torch.no_grad()
def test_static_rows_equal_the_full_forward_over_the_whole_cache_or_up_to_image_end(tiny_gpt_factory) -> None:
    """The compiled verify pass's form (``static``: attention over every slot under the mask) gives the full
    forward's logits, and so does attending only up to ``image_end``, the end of the rows' last window."""
    model = tiny_gpt_factory(CONFIG)
    tokens = random_tokens(15)
    full = model(CLASSES, tokens)
    starts = torch.tensor([3, 6])
    window = torch.stack([tokens[0, 2:9], tokens[1, 5:12]])
    for image_end in (None, 13):  # rows 0 and 1 end at image tokens 10 and 13
        cache = model.new_cache(len(CLASSES), extra=4)
        model.prefill(CLASSES, cache)
        model.decode_rows(tokens[:, :6], torch.tensor([1, 1]), cache, static=True, image_end=image_end and 7)
        got = model.decode_rows(window, starts, cache, static=True, image_end=image_end)
        torch.testing.assert_close(got[0], full[0, 3:10], atol=ATOL, rtol=0)
        torch.testing.assert_close(got[1], full[1, 6:13], atol=ATOL, rtol=0)


@torch.no_grad()
def test_rows_window_may_run_past_the_last_token_into_extra_slots(tiny_gpt_factory) -> None:
    model = tiny_gpt_factory(CONFIG)
    tokens = random_tokens(15)
    cache = model.new_cache(len(CLASSES), extra=3)
    model.prefill(CLASSES, cache)
    model.decode_rows(tokens[:, :12], torch.tensor([1, 1]), cache)
    padded = torch.cat([tokens[:, 12:], tokens[:, :3]], dim=1)  # 3 real tokens, then 3 past the end
    got = model.decode_rows(padded, torch.tensor([13, 13]), cache)
    torch.testing.assert_close(got[:, :3], model(CLASSES, tokens)[:, 13:16], atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="overflow"):
        model.decode_rows(padded, torch.tensor([15, 13]), cache)


@torch.no_grad()
def test_rows_return_the_normed_hidden_states(tiny_gpt_factory) -> None:
    model = tiny_gpt_factory(CONFIG)
    cache = model.new_cache(len(CLASSES))
    model.prefill(CLASSES, cache)
    logits, hidden = model.decode_rows(random_tokens(4), torch.tensor([1, 1]), cache, return_hidden=True)
    assert hidden.shape == (2, 4, CONFIG.dim)
    torch.testing.assert_close(model.output(hidden), logits, atol=1e-5, rtol=0)


@torch.no_grad()
def test_a_spatial_video_layout_decodes_alike_on_every_path(tiny_gpt_factory) -> None:
    """``rope="spatial"`` (each frame rotated as an image, a per-frame embedding added): chunked decode, per-row
    windows and the static one-token step all equal the full forward, across frame boundaries."""
    config = GPTConfig(vocab_size=48, dim=64, n_layer=2, n_head=4, num_classes=7, block_size=12, frames=3,
                       rope="spatial")
    model = tiny_gpt_factory(config)
    assert model.frame_embedding.weight.abs().sum() > 0
    tokens = random_tokens(12, config)
    full = model(CLASSES, tokens[:, :11])
    torch.testing.assert_close(cached_logits(model, tokens[:, :11], [1, 4, 6]), full, atol=ATOL, rtol=0)
    cache = model.new_cache(len(CLASSES), extra=2)
    model.prefill(CLASSES, cache)
    model.decode_rows(tokens[:, :6], torch.tensor([1, 1]), cache)
    got = model.decode_rows(torch.stack([tokens[0, 2:7], tokens[1, 5:10]]), torch.tensor([3, 6]), cache)
    torch.testing.assert_close(got[0], full[0, 3:8], atol=ATOL, rtol=0)
    torch.testing.assert_close(got[1], full[1, 6:11], atol=ATOL, rtol=0)
    cache = model.new_cache(len(CLASSES))
    model.prefill(CLASSES, cache)
    for t in range(11):
        step = model.decode_step(tokens[:, t:t + 1], torch.tensor([1 + t]), cache)
        cache.advance(1)
        torch.testing.assert_close(step, full[:, 1 + t], atol=ATOL, rtol=0)
