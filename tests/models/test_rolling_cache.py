"""The rolling cache: sinks kept for good, a window that evicts its oldest block, a bank of evicted blocks, and
retrieval of the most similar ones; its memory is fixed when it is built."""

from __future__ import annotations

import pytest
import torch

from vgen.models.rolling_cache import CachePolicy, RollingKVCache

TOKENS, HEADS, DIM = 3, 2, 4


def block(i: int, layers: int = 2, direction: torch.Tensor | None = None):
    """Keys/values of block ``i``: every entry ``i`` (values ``-i``), or keys along ``direction``."""
    k = torch.full((1, HEADS, TOKENS, DIM), float(i)) if direction is None else direction.expand(1, HEADS, TOKENS, DIM)
    return [(k.clone() + layer, -torch.full((1, HEADS, TOKENS, DIM), float(i)) - layer) for layer in range(layers)]


def ids_in(keys: torch.Tensor, layer: int = 0) -> list[int]:
    """The block ids a [1, H, blocks*TOKENS, D] key tensor holds, read back from its constant entries."""
    return [int(keys[0, 0, j * TOKENS, 0].item()) - layer for j in range(keys.shape[2] // TOKENS)]


def test_sinks_stay_and_the_window_rolls() -> None:
    cache = RollingKVCache(2, 1, HEADS, DIM, TOKENS, CachePolicy(sink_blocks=1, window_blocks=3))
    evicted = [cache.push(block(i)) for i in range(10)]
    assert evicted == [None] * 4 + [1, 2, 3, 4, 5, 6]
    assert cache.block_ids == [0, 7, 8, 9]
    context, blocks, picked = cache.context()
    assert blocks == 4 and picked is None
    for layer, (k, v) in enumerate(context):
        assert ids_in(k, layer) == [0, 7, 8, 9]
        assert torch.equal(v, -k)


def test_before_the_window_fills_the_context_is_every_block() -> None:
    cache = RollingKVCache(2, 1, HEADS, DIM, TOKENS, CachePolicy(sink_blocks=2, window_blocks=3))
    assert cache.context() == (None, 0, None)
    for i in range(3):
        cache.push(block(i))
    context, blocks, _ = cache.context()
    assert blocks == 3 and ids_in(context[0][0]) == [0, 1, 2]


def test_evicted_blocks_go_to_a_bounded_bank_and_the_most_similar_come_back() -> None:
    policy = CachePolicy(sink_blocks=1, window_blocks=2, retrieved_blocks=1, bank_blocks=3)
    cache = RollingKVCache(1, 1, HEADS, DIM, TOKENS, policy)
    torch.manual_seed(0)
    dirs = torch.randn(8, DIM)
    dirs[7] = dirs[4] + 0.05 * torch.randn(DIM)  # the newest block resembles block 4
    for i in range(8):
        cache.push(block(i, layers=1, direction=dirs[i]))
    assert cache.block_ids == [0, 6, 7]
    assert cache.bank_ids == [3, 4, 5]  # 1 and 2 were dropped from the full bank
    context, blocks, picked = cache.context()
    assert blocks == 4
    assert cache.bank_ids[int(picked[0, 0])] == 4
    torch.testing.assert_close(context[0][0][0, 0, TOKENS, :], dirs[4])  # retrieved after the sink


def test_retrieved_blocks_sit_between_sinks_and_window_in_time_order() -> None:
    policy = CachePolicy(sink_blocks=1, window_blocks=1, retrieved_blocks=2, bank_blocks=4)
    cache = RollingKVCache(1, 1, HEADS, DIM, TOKENS, policy)
    for i in range(5):
        cache.push(block(i, layers=1))
    assert cache.block_ids == [0, 4] and cache.bank_ids == [1, 2, 3]
    context, blocks, picked = cache.context()
    held = ids_in(context[0][0])
    assert blocks == 4 and held[0] == 0 and held[-1] == 4
    assert held[1:3] == sorted(held[1:3]) and set(held[1:3]) <= {1, 2, 3}


def test_memory_is_fixed_at_construction() -> None:
    cache = RollingKVCache(2, 1, HEADS, DIM, TOKENS, CachePolicy(1, 2, 1, 2))
    size = cache.nbytes()
    for i in range(20):
        cache.push(block(i))
        cache.context()
    assert cache.nbytes() == size


def test_replace_overwrites_the_resident_blocks() -> None:
    cache = RollingKVCache(1, 1, HEADS, DIM, TOKENS, CachePolicy(1, 2))
    for i in range(3):
        cache.push(block(i, layers=1))
    fresh = torch.randn(1, HEADS, 3 * TOKENS, DIM)
    cache.replace([(fresh, -fresh)])
    context, _, _ = cache.context()
    assert torch.equal(context[0][0], fresh) and torch.equal(context[0][1], -fresh)



def test_replace_from_a_slot_keeps_the_blocks_before_it() -> None:
    cache = RollingKVCache(1, 1, HEADS, DIM, TOKENS, CachePolicy(1, 2))
    for i in range(3):
        cache.push(block(i, layers=1))
    fresh = torch.full((1, HEADS, 2 * TOKENS, DIM), 9.0)
    cache.replace([(fresh, -fresh)], first_block=1)
    context, _, _ = cache.context()
    assert ids_in(context[0][0]) == [0, 9, 9] and torch.equal(context[0][1], -context[0][0])
    with pytest.raises(ValueError, match="over the 1 resident blocks from slot 2"):
        cache.replace([(fresh, -fresh)], first_block=2)
    with pytest.raises(ValueError, match="first_block 4 is outside the 3 resident blocks"):
        cache.replace([(fresh, -fresh)], first_block=4)


def test_clear_empties_the_cache_and_the_next_block_is_a_sink_again() -> None:
    cache = RollingKVCache(2, 1, HEADS, DIM, TOKENS, CachePolicy(1, 2, 1, 2))
    size = cache.nbytes()
    for i in range(6):
        cache.push(block(i))
    cache.clear()
    assert cache.context() == (None, 0, None) and cache.bank_ids == [] and cache.nbytes() == size
    for i in range(6, 10):
        cache.push(block(i))
    assert cache.block_ids == [6, 8, 9] and cache.bank_ids == [7]  # 6 is the sink; block ids keep counting

@pytest.mark.parametrize("kwargs, message", [
    ({"window_blocks": 0}, "at least one block"),
    ({"sink_blocks": -1}, ">= 0"),
    ({"retrieved_blocks": 2, "bank_blocks": 1}, "cannot retrieve"),
])
def test_bad_policies_are_rejected(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        CachePolicy(**kwargs)
