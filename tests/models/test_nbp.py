"""NBP backbone against hand-written layouts and NBP's published rules (reference notes, section 2): the
block-causal mask on small grids written out cell by cell, block sizes and step counts, no leakage of a block into
its own logits (perturbation), token j of a block reading the token j before it through the begin-of-video slots,
and cached block-by-block decoding against the full forward."""

from __future__ import annotations

import pytest
import torch

from vgen.hub import from_pretrained, save_pretrained
from vgen.models.layers import rope_grid_table
from vgen.models.nbp import NBPConfig, NBPTransformer, block_causal_mask


def rows_of(text: str) -> torch.Tensor:
    return torch.tensor([[c == "1" for c in line.split()] for line in text.strip().splitlines()])


# slots: class, then input blocks of 3 (begin-of-video, then block 0's tokens); row = query, column = key
MASK_2x3_ROWS = rows_of("""
1 0 0 0 0 0 0
1 1 1 1 0 0 0
1 1 1 1 0 0 0
1 1 1 1 0 0 0
1 1 1 1 1 1 1
1 1 1 1 1 1 1
1 1 1 1 1 1 1
""")

# a 3 x 1 x 2 video in frame blocks of 2: three input blocks
MASK_3x1x2_FRAMES = rows_of("""
1 0 0 0 0 0 0
1 1 1 0 0 0 0
1 1 1 0 0 0 0
1 1 1 1 1 0 0
1 1 1 1 1 0 0
1 1 1 1 1 1 1
1 1 1 1 1 1 1
""")


# hybrid: input block 0 [bov_0, z_0, z_1] is causal (next-token prediction of block 0), input block 1 is
# [z_2, bov_1, bov_2] with full attention, as before
MASK_2x3_ROWS_HYBRID = rows_of("""
1 0 0 0 0 0 0
1 1 0 0 0 0 0
1 1 1 0 0 0 0
1 1 1 1 0 0 0
1 1 1 1 1 1 1
1 1 1 1 1 1 1
1 1 1 1 1 1 1
""")


def test_block_causal_mask_cell_by_cell(tiny_nbp_factory) -> None:
    assert torch.equal(block_causal_mask(2, 3), MASK_2x3_ROWS)
    assert torch.equal(block_causal_mask(3, 2), MASK_3x1x2_FRAMES)
    assert torch.equal(tiny_nbp_factory((2, 3)).mask, MASK_2x3_ROWS)
    assert torch.equal(tiny_nbp_factory((3, 1, 2), "frame").mask, MASK_3x1x2_FRAMES)
    assert torch.equal(block_causal_mask(2, 3, hybrid=True), MASK_2x3_ROWS_HYBRID)
    assert torch.equal(tiny_nbp_factory((2, 3), hybrid=True).mask, MASK_2x3_ROWS_HYBRID)


@pytest.mark.parametrize("grid, block, block_size, steps", [
    ((16, 8, 8), "frame", 64, 16),  # the shapes-video layout: 1024 tokens in 16 passes
    ((16, 8, 8), "row", 8, 128),
    ((4, 5), "row", 5, 4),
    ((5, 16, 16), "row", 16, 80),  # NBP's UCF layout without the hybrid start: 1280 tokens, 16 per step
])
def test_block_size_and_step_count(grid, block, block_size, steps) -> None:
    config = NBPConfig(grid=grid, block=block, dim=32, n_head=2, n_layer=1)
    assert (config.block_size, config.num_blocks, config.num_steps) == (block_size, steps, steps)
    assert config.num_blocks * config.block_size == config.num_tokens
    # the hybrid start draws block 0 token by token: B - 1 more passes (NBP's UCF layout: 80 + 15 = 95)
    assert NBPConfig(grid=grid, block=block, hybrid=True, dim=32, n_head=2, n_layer=1).num_steps == \
        steps + block_size - 1
    if len(grid) == 3 and block == "row":  # all of frame 0 token by token, then rows: H W + (T - 1) H passes
        whole = NBPConfig(grid=grid, block=block, hybrid=True, hybrid_blocks=grid[1], dim=32, n_head=2, n_layer=1)
        assert whole.first_tokens == grid[1] * grid[2]
        assert whole.num_steps == grid[1] * grid[2] + (grid[0] - 1) * grid[1]


@pytest.mark.parametrize("grid, block", [((3, 4), "row"), ((3, 2, 2), "frame")])
def test_a_hybrid_model_predicts_block_0_token_by_token(tiny_nbp_factory, grid, block) -> None:
    """Perturbing token p changes no logit at positions <= p; inside block 0 it reaches token p + 1 (next-token
    prediction), the last token of block 0 reaches all of block 1, and block k >= 1 still reaches block k + 1."""
    model = tiny_nbp_factory(grid, block, hybrid=True)
    b, n = model.block_size, model.num_tokens
    tokens = torch.randint(0, 40, (2, n), generator=torch.Generator().manual_seed(1))
    cls = torch.tensor([1, 3])
    base = model(cls, tokens)
    for p in range(n - b):
        changed = tokens.clone()
        changed[:, p] = (changed[:, p] + 1) % 40
        diff = (model(cls, changed) - base).abs().amax(dim=(0, 2))
        assert diff[:p + 1].max() == 0, f"token {p} leaked into its own or earlier logits"
        reached = diff[p + 1:] > 1e-6
        if p < b - 1:
            assert reached[0], f"token {p} of block 0 does not reach token {p + 1}"
        else:
            nxt = (p // b + 1) * b  # the first token of the next block
            assert reached[nxt - p - 1:nxt - p - 1 + b].all(), f"token {p} does not reach every token of the next block"


def test_the_class_conditions_every_token_of_a_hybrid_model(tiny_nbp_factory) -> None:
    model = tiny_nbp_factory((3, 4), hybrid=True)
    tokens = torch.randint(0, 40, (1, 12), generator=torch.Generator().manual_seed(2))
    a, b = model(torch.tensor([0]), tokens), model(torch.tensor([4]), tokens)
    assert ((a - b).abs().amax(dim=(0, 2)) > 1e-6).all()


@pytest.fixture(params=[(grid, block, hybrid) for hybrid in (False, True, 2)
                        for grid, block in (((3, 4), "row"), ((3, 2, 2), "frame"), ((3, 2, 2), "row"))
                        if not (hybrid == 2 and block == "frame")],  # 3 frame blocks: 2 token by token leave 1
                ids=str)
def scored_grid(request, tiny_nbp_factory):
    """A model (plain, hybrid, or two token-by-token blocks), two classes, a random whole grid and its full
    teacher-forced logits."""
    grid, block, hybrid = request.param
    model = tiny_nbp_factory(grid, block, hybrid=bool(hybrid), hybrid_blocks=int(hybrid) or 1)
    tokens = torch.randint(0, 40, (2, model.num_tokens), generator=torch.Generator().manual_seed(3))
    cls = torch.tensor([0, 4])
    return model, cls, tokens, model(cls, tokens)


def test_a_prefix_of_whole_blocks_gives_the_full_forwards_first_rows(scored_grid) -> None:
    """Block 0 alone (a hybrid model's token-by-token start), or a first frame in row blocks, scores as it does
    inside the whole grid: a trainer scores other frames of a clip as frame 0 this way."""
    model, cls, tokens, full = scored_grid
    for m in range(model.block_size, model.num_tokens, model.block_size):
        assert torch.allclose(model(cls, tokens[:, :m]), full[:, :m], atol=1e-5), f"prefix of {m} tokens"


def test_given_blocks_prefill_in_one_pass_as_the_full_forward_scores_them(scored_grid) -> None:
    """``prefill_given`` with k given blocks returns the full forward's logits of block k and leaves a cache that
    decodes the next blocks as the full forward scores them."""
    model, cls, tokens, full = scored_grid
    b, n = model.block_size, model.num_tokens
    for given in range(max(b, model.first_tokens), n, b):
        cache = model.new_cache(2)
        logits = model.prefill_given(cls, tokens[:, :given], cache)
        assert torch.allclose(logits, full[:, given:given + b], atol=1e-5), f"{given} given tokens"
        for k in range(given, n - b, b):
            logits = model.decode(tokens[:, k:k + b], cache)
            assert torch.allclose(logits, full[:, k + b:k + 2 * b], atol=1e-5), f"block after {k + b} tokens"


def test_prefill_given_refuses_what_it_cannot_run(tiny_nbp_factory) -> None:
    model = tiny_nbp_factory((3, 2, 3), "row", hybrid=True, hybrid_blocks=2)  # token by token: the first 6
    for given in (3, 4, 18):
        with pytest.raises(ValueError, match=r"prefill_given takes whole blocks of 3 tokens covering the first 6"):
            model.prefill_given(torch.tensor([0]), torch.zeros(1, given, dtype=torch.long), model.new_cache(1))
    cache = model.new_cache(1)
    model.prefill(torch.tensor([0]), cache)
    with pytest.raises(ValueError, match="prefill_given needs an empty cache"):
        model.prefill_given(torch.tensor([0]), torch.zeros(1, 6, dtype=torch.long), cache)


def test_a_prefix_must_be_whole_blocks_of_the_grid(tiny_nbp_factory) -> None:
    model = tiny_nbp_factory((3, 4), hybrid=True)
    message = r"the whole 3 rows x 4 columns grid \(12\) or a prefix of whole row blocks of 4"
    for bad in ((1, 6), (1, 11), (1, 16), (1, 0), (12,)):
        with pytest.raises(ValueError, match=message):
            model(torch.tensor([0]), torch.zeros(bad, dtype=torch.long))


@pytest.mark.parametrize("grid, block", [((3, 4), "row"), ((3, 2, 2), "frame"), ((2, 2, 3), "row")])
def test_a_block_sees_only_earlier_blocks(tiny_nbp_factory, grid, block) -> None:
    """Perturbing the tokens of block k changes the logits of blocks k+1.. and nothing before them."""
    model = tiny_nbp_factory(grid, block)
    b, n = model.block_size, model.num_tokens
    tokens = torch.randint(0, 40, (2, n), generator=torch.Generator().manual_seed(1))
    cls = torch.tensor([1, 3])
    base = model(cls, tokens)
    for k in range(model.num_steps):
        changed = tokens.clone()
        changed[:, k * b:(k + 1) * b] = (changed[:, k * b:(k + 1) * b] + 1) % 40
        diff = (model(cls, changed) - base).abs().amax(dim=(0, 2))
        assert diff[:(k + 1) * b].max() == 0, f"block {k} leaked into its own or earlier logits"
        if k + 1 < model.num_steps:
            assert (diff[(k + 1) * b:(k + 2) * b] > 1e-6).all()
            # full attention inside a block: the last token of block k reaches every token of block k + 1 (under a
            # plain causal mask it would reach only the last one)
            last = tokens.clone()
            last[:, (k + 1) * b - 1] = (last[:, (k + 1) * b - 1] + 1) % 40
            diff = (model(cls, last) - base).abs().amax(dim=(0, 2))
            assert (diff[(k + 1) * b:(k + 2) * b] > 1e-6).all()


def test_the_class_conditions_every_block_and_the_first_block_reads_the_begin_of_video_slots(tiny_nbp_factory) -> None:
    model = tiny_nbp_factory((3, 4))
    tokens = torch.randint(0, 40, (1, 12), generator=torch.Generator().manual_seed(2))
    a, b = model(torch.tensor([0]), tokens), model(torch.tensor([4]), tokens)
    assert ((a - b).abs().amax(dim=(0, 2)) > 1e-6).all()
    with torch.no_grad():
        model.bov[1] += 1.0  # the begin-of-video slot of column 1 feeds every later block too, through attention
    assert not torch.allclose(model(torch.tensor([0]), tokens)[:, :4], a[:, :4])


@pytest.mark.parametrize("grid, block, kv, hybrid, rope", [
    ((3, 4), "row", None, False, "grid"), ((4, 2, 2), "frame", None, False, "grid"),
    ((2, 2, 3), "row", 2, False, "grid"), ((3, 4), "row", None, True, "grid"), ((4, 2, 2), "frame", 2, True, "grid"),
    ((4, 2, 2), "frame", None, True, "spatial"), ((2, 2, 3), "row", None, True, "spatial"),
    ((3, 2, 3), "row", None, 2, "spatial"),
    ((4, 6, 6), "row", None, 6, "spatial")])  # 145 slots: the full forward attends in 3 chunks (PrefixMask)
def test_cached_block_decoding_equals_the_full_forward(tiny_nbp_factory, grid, block, kv, hybrid, rope) -> None:
    """prefill, then (hybrid) the first blocks token by token, then one block per decode: the full forward's logits.
    ``hybrid`` 2: the first two blocks (all of frame 0 in rows) token by token."""
    model = tiny_nbp_factory(grid, block, n_kv_head=kv, hybrid=bool(hybrid), hybrid_blocks=int(hybrid) or 1, rope=rope)
    b, n, first = model.block_size, model.num_tokens, model.first_tokens
    cls = torch.tensor([0, 2, 4])
    tokens = torch.randint(0, 40, (3, n), generator=torch.Generator().manual_seed(3))
    full = model(cls, tokens)
    cache = model.new_cache(3)
    steps = [model.prefill(cls, cache)]
    if hybrid:
        steps += [model.decode_first_block(tokens[:, i:i + 1], cache) for i in range(first - 1)]
    steps += [model.decode(tokens[:, k * b:(k + 1) * b], cache) for k in range(max(first // b, 1) - 1, n // b - 1)]
    assert len(steps) == model.num_steps and cache.length == 1 + n
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_spatial_positions_rotate_each_frame_as_an_image_and_tell_frames_apart_by_a_learned_embedding() -> None:
    """rope="spatial": every frame gets the 2-D table of its rows and columns (LlamaGen's, as the image model of the
    frame grid has it), and a per-frame embedding, zero at initialisation, is added to the slots of each frame (by
    the token a slot predicts); the class slot gets neither."""
    config = NBPConfig(grid=(3, 4, 4), block="frame", hybrid=True, rope="spatial", dim=32, n_head=2, n_layer=1)
    model = NBPTransformer(config)
    image_table = rope_grid_table((4, 4), config.head_dim)
    assert torch.equal(model.rope[0], image_table[0])
    for frame in range(3):
        assert torch.equal(model.rope[1 + 16 * frame:17 + 16 * frame], image_table[1:])
    assert not model.frame_embedding.weight.any()
    with torch.no_grad():
        model.frame_embedding.weight.copy_(torch.arange(3.0)[:, None].expand(3, 32))
    offsets = model._frame_offsets(0, 1 + 48, torch.device("cpu"))
    assert offsets[0].eq(0).all()  # the class slot
    assert [int(offsets[s, 0]) for s in (1, 16, 17, 32, 33, 48)] == [0, 0, 1, 1, 2, 2]
    assert not hasattr(NBPTransformer(NBPConfig(grid=(3, 4, 4), block="frame", dim=32, n_head=2, n_layer=1)),
                       "frame_embedding")


def test_round_trips_through_save_and_from_pretrained(tiny_nbp_factory, tmp_path) -> None:
    model = tiny_nbp_factory((3, 2, 2), "frame")
    save_pretrained(model, tmp_path / "m")
    loaded = from_pretrained(tmp_path / "m").eval()
    assert isinstance(loaded, NBPTransformer) and loaded.config == model.config
    tokens = torch.randint(0, 40, (1, 12))
    torch.testing.assert_close(loaded(torch.tensor([1]), tokens), model(torch.tensor([1]), tokens))


@pytest.mark.parametrize("kwargs, message", [
    (dict(grid=(4,)), r"grid must hold 2 to 3 item\(s\)"),
    (dict(grid=(2, 0), block="row"), r"grid\[1\] must be an integer in \[1, 1024\], got 0"),
    (dict(grid=(3, 4), block="column"), "block must be one of"),
    (dict(grid=(3, 4), block="frame"), "frame blocks need a video grid"),
    (dict(grid=(1, 4, 4), block="frame"), "NBP needs >= 2"),
    (dict(grid=(3, 4), block="row", n_layer=0), r"n_layer must be an integer in \[1, 2\*\*24\], got 0"),
    (dict(grid=(2, 3, 4), block="row", rope="time"), "rope must be one of"),
    (dict(grid=(3, 4), block="row", rope="spatial"), "rope='spatial' encodes the frames of a video grid"),
    (dict(grid=(3, 4), block="row", hybrid_blocks=2), "hybrid_blocks must be 1, or with hybrid=True"),
    (dict(grid=(3, 4), block="row", hybrid=True, hybrid_blocks=3), "between 1 and 2"),
    (dict(grid=(3, 4), block="row", hybrid=True, hybrid_blocks=0), r"hybrid_blocks must be an integer in \[1, "),
    (dict(grid=(3, 4), block="row", dim=30, n_head=4), "divisible"),
])
def test_bad_config_raises_a_specific_error(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        NBPConfig(**kwargs)


def test_bad_tokens_and_cache_states_raise(tiny_nbp_factory) -> None:
    model = tiny_nbp_factory((3, 4))
    cls = torch.tensor([0])
    cache = model.new_cache(1)
    with pytest.raises(ValueError, match="call prefill first"):
        model.decode(torch.zeros(1, 4, dtype=torch.long), cache)
    model.prefill(cls, cache)
    with pytest.raises(ValueError, match="prefill needs an empty cache"):
        model.prefill(cls, cache)
    with pytest.raises(ValueError, match="has 4 tokens, got tokens of shape"):
        model.decode(torch.zeros(1, 3, dtype=torch.long), cache)
    for _ in range(2):
        model.decode(torch.zeros(1, 4, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="all 3 blocks are generated"):
        model.decode(torch.zeros(1, 4, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="generates block 0 in one pass"):
        model.decode_first_block(torch.zeros(1, 1, dtype=torch.long), model.new_cache(1))


def test_bad_hybrid_cache_states_raise(tiny_nbp_factory) -> None:
    model = tiny_nbp_factory((3, 4), hybrid=True)
    cls, cache = torch.tensor([0]), model.new_cache(1)
    with pytest.raises(ValueError, match="call prefill first"):
        model.decode_first_block(torch.zeros(1, 1, dtype=torch.long), cache)
    model.prefill(cls, cache)
    with pytest.raises(ValueError, match="call prefill and decode_first_block first"):
        model.decode(torch.zeros(1, 4, dtype=torch.long), cache)
    with pytest.raises(ValueError, match=r"one token per sample \[B, 1\]"):
        model.decode_first_block(torch.zeros(1, 2, dtype=torch.long), cache)
    for _ in range(3):
        model.decode_first_block(torch.zeros(1, 1, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="fewer than 3 tokens of the token-by-token start"):
        model.decode_first_block(torch.zeros(1, 1, dtype=torch.long), cache)
    assert model.decode(torch.zeros(1, 4, dtype=torch.long), cache).shape == (1, 4, 40)
