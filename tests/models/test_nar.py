"""NAR backbone against hand-written layouts and NAR's published rules (reference notes, section 1): the
proximity mask on a 3x3 image and a 2x2x2 video written out cell by cell, the steps and their counts (including
the paper's 31 passes for 16x16 and 34 for 4x16x16), the averaging of the dimension-oriented heads over the
available predecessors, the depth each head reads, no leakage of a target into its own logits, and cached
step-by-step decoding against the full forward under the proximity mask.
"""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from vgen.hub import from_pretrained, save_pretrained
from vgen.models.cache import KVCache
from vgen.models.layers import apply_rope, rope_grid_table
from vgen.models.nar import NARConfig, NARTransformer, NeighbourLayout


def rows_of(text: str) -> torch.Tensor:
    return torch.tensor([[c == "1" for c in line.split()] for line in text.strip().splitlines()])


# slots: class, then raster positions; row = query, column = key
MASK_3x3 = rows_of("""
1 0 0 0 0 0 0 0 0 0
1 1 0 0 0 0 0 0 0 0
1 1 1 0 1 0 0 0 0 0
1 1 1 1 1 1 0 1 0 0
1 1 1 0 1 0 0 0 0 0
1 1 1 1 1 1 0 1 0 0
1 1 1 1 1 1 1 1 1 0
1 1 1 1 1 1 0 1 0 0
1 1 1 1 1 1 1 1 1 0
1 1 1 1 1 1 1 1 1 1
""")

# raster p = 4t + 2h + w; distances 0 1 1 2 1 2 2 3
MASK_2x2x2 = rows_of("""
1 0 0 0 0 0 0 0 0
1 1 0 0 0 0 0 0 0
1 1 1 1 0 1 0 0 0
1 1 1 1 0 1 0 0 0
1 1 1 1 1 1 1 1 0
1 1 1 1 0 1 0 0 0
1 1 1 1 1 1 1 1 0
1 1 1 1 1 1 1 1 0
1 1 1 1 1 1 1 1 1
""")


def test_proximity_mask_of_a_3x3_image_cell_by_cell() -> None:
    assert torch.equal(NeighbourLayout((3, 3)).mask, MASK_3x3)


def test_proximity_mask_of_a_2x2x2_video_cell_by_cell() -> None:
    assert torch.equal(NeighbourLayout((2, 2, 2)).mask, MASK_2x2x2)


@pytest.mark.parametrize("grid", [(4, 6), (5, 2), (3, 2, 5)])
def test_proximity_mask_follows_the_distance_rule(grid: tuple[int, ...]) -> None:
    """Query i sees key j iff sum(coords j) <= sum(coords i); everyone sees the class, the class only itself."""
    coords = list(itertools.product(*(range(n) for n in grid)))
    n = len(coords)
    expected = torch.zeros(1 + n, 1 + n, dtype=torch.bool)
    expected[:, 0] = True
    for i, j in itertools.product(range(n), repeat=2):
        expected[1 + i, 1 + j] = sum(coords[j]) <= sum(coords[i])
    assert torch.equal(NeighbourLayout(grid).mask, expected)


def test_steps_of_small_grids_by_hand() -> None:
    assert [s.tolist() for s in NeighbourLayout((3, 3)).steps] == [[0], [1, 3], [2, 4, 6], [5, 7], [8]]
    assert [s.tolist() for s in NeighbourLayout((2, 2, 2)).steps] == [[0], [1, 2, 4], [3, 5, 6], [7]]
    assert [s.tolist() for s in NeighbourLayout((2, 3)).steps] == [[0], [1, 3], [2, 4], [5]]


@pytest.mark.parametrize(("grid", "steps"), [((3, 3), 5), ((2, 5), 6), ((1, 1), 1), ((1, 7), 7), ((16, 16), 31),
                                             ((24, 24), 47), ((2, 2, 2), 4), ((4, 16, 16), 34), ((16, 8, 8), 30),
                                             ((1, 1, 1), 1)])
def test_step_count_is_h_plus_w_minus_1_or_t_plus_h_plus_w_minus_2(grid: tuple[int, ...], steps: int) -> None:
    """16x16 -> 31 and 24x24 -> 47 passes, and 4x16x16 -> 34 for video, as in NAR's samplers."""
    layout = NeighbourLayout(grid)
    assert layout.num_steps == steps == len(layout.steps)


@pytest.mark.parametrize("grid", [(3, 3), (4, 7), (7, 4), (1, 5), (3, 4, 5), (5, 1, 2)])
def test_order_visits_every_position_exactly_once_by_distance(grid: tuple[int, ...]) -> None:
    layout = NeighbourLayout(grid)
    order = torch.cat(layout.steps)
    assert sorted(order.tolist()) == list(range(len(order)))
    coords = list(itertools.product(*(range(n) for n in grid)))
    for s, positions in enumerate(layout.steps):
        assert positions.tolist() == sorted(positions.tolist())  # raster order within a step
        assert all(sum(coords[p]) == s for p in positions.tolist())


# frame 0 first: frame 0 at distances 0 1 1 2, frame 1 raised by H + W - 2 = 2 to 3 4 4 5
MASK_2x2x2_IMAGE_FIRST = rows_of("""
1 0 0 0 0 0 0 0 0
1 1 0 0 0 0 0 0 0
1 1 1 1 0 0 0 0 0
1 1 1 1 0 0 0 0 0
1 1 1 1 1 0 0 0 0
1 1 1 1 1 1 0 0 0
1 1 1 1 1 1 1 1 0
1 1 1 1 1 1 1 1 0
1 1 1 1 1 1 1 1 1
""")


def test_image_first_mask_of_a_2x2x2_video_cell_by_cell() -> None:
    assert torch.equal(NeighbourLayout((2, 2, 2), image_first=True).mask, MASK_2x2x2_IMAGE_FIRST)


@pytest.mark.parametrize(("grid", "steps"), [((2, 2, 2), 6), ((3, 2, 4), 11), ((8, 16, 16), 68), ((1, 3, 3), 5)])
def test_image_first_takes_h_plus_w_minus_1_steps_for_frame_0_and_t_plus_h_plus_w_minus_3_for_the_rest(
        grid: tuple[int, ...], steps: int) -> None:
    """T + 2 (H + W) - 4 passes: 31 for a 16 x 16 frame 0, as the image model, and 37 for the other 7 frames."""
    layout = NeighbourLayout(grid, image_first=True)
    assert layout.num_steps == steps == len(layout.steps)


@pytest.mark.parametrize("grid", [(2, 2, 2), (3, 2, 4), (4, 3, 1)])
def test_image_first_draws_all_of_frame_0_as_an_image_then_the_other_frames_in_the_3d_order(
        grid: tuple[int, ...]) -> None:
    layout = NeighbourLayout(grid, image_first=True)
    frame = grid[1] * grid[2]
    order = torch.cat(layout.steps).tolist()
    assert sorted(order) == list(range(len(order)))
    assert sorted(order[:frame]) == list(range(frame))  # frame 0 is done before any other frame starts
    coords = list(itertools.product(*(range(n) for n in grid)))
    image_steps = grid[1] + grid[2] - 1
    assert [s.tolist() for s in layout.steps[:image_steps]] == [s.tolist() for s in NeighbourLayout(grid[1:]).steps]
    for s, positions in enumerate(layout.steps[image_steps:]):
        assert all(sum(coords[p]) == s + 1 for p in positions.tolist())
    assert [s.tolist() for s in NeighbourLayout((2, 2, 2), image_first=True).steps] == [[0], [1, 2], [3], [4],
                                                                                           [5, 6], [7]]


@pytest.mark.parametrize("grid", [(2, 2, 2), (3, 9, 9)])
@torch.no_grad()
def test_with_frame_0_first_a_pass_over_frame_0_alone_gives_frame_0s_logits_of_the_whole_grid(
        tiny_nar_factory, grid: tuple[int, ...]) -> None:
    """Frame 0's cells see only frame 0, so a frame alone [B, H * W] is scored as the clip's frame 0 is (the
    first-frames loss feeds other frames of a clip this way); without image_first a frame alone is refused."""
    model = tiny_nar_factory(grid, rope="spatial", image_first=True)
    frame = grid[1] * grid[2]
    tokens = torch.randint(0, model.vocab_size, (2, model.num_tokens), generator=torch.Generator().manual_seed(8))
    classes = torch.tensor([1, 4])
    alone = model(classes, tokens[:, :frame])
    assert alone.shape == (2, frame, model.vocab_size)
    torch.testing.assert_close(alone, model(classes, tokens)[:, :frame], atol=2e-5, rtol=0)
    with pytest.raises(ValueError, match=rf"or \[batch, {frame}\] \(frame 0 alone, which comes first\)"):
        model(classes, tokens[:, :frame + 1])
    with pytest.raises(ValueError, match=rf"tokens must be \[batch, {model.num_tokens}\] \(the whole"):
        tiny_nar_factory(grid, rope="spatial")(classes, tokens[:, :frame])


def test_image_first_needs_a_video_grid() -> None:
    with pytest.raises(ValueError, match="image_first draws frame 0 of a video grid"):
        NARConfig(grid=(4, 4), dim=32, n_head=4, image_first=True)


def expected_combination(heads: list[torch.Tensor], grid: tuple[int, ...]) -> torch.Tensor:
    """NAR's rule with explicit coordinates: target c takes the mean over axes a with c[a] > 0 of the head for
    axis a (head index rank - 1 - a) at slot 1 + raster(c - e_a); the first token takes the mean of all heads
    at the class slot."""
    rank = len(grid)
    coords = list(itertools.product(*(range(n) for n in grid)))
    out = []
    for c in coords:
        if sum(c) == 0:
            out.append(sum(h[:, 0] for h in heads) / rank)
            continue
        terms = []
        for axis in range(rank):
            if c[axis] > 0:
                prev = list(c)
                prev[axis] -= 1
                terms.append(heads[rank - 1 - axis][:, 1 + coords.index(tuple(prev))])
        out.append(sum(terms) / len(terms))
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("grid", [(3, 3), (2, 4), (2, 2, 2), (2, 3, 2)])
@torch.no_grad()
def test_logits_average_the_heads_over_available_predecessors(tiny_nar_factory, grid: tuple[int, ...]) -> None:
    model = tiny_nar_factory(grid)
    tokens = torch.randint(0, model.vocab_size, (2, model.num_tokens), generator=torch.Generator().manual_seed(1))
    classes = torch.tensor([1, 3])
    heads = model.head_logits(classes, tokens)
    assert len(heads) == len(grid)
    logits = model(classes, tokens)
    torch.testing.assert_close(logits, expected_combination(heads, grid), atol=1e-6, rtol=0)
    if grid == (3, 3):  # a few cells spelled out: R = heads[0] (right), B = heads[1] (below)
        r, b = heads
        torch.testing.assert_close(logits[:, 0], (r[:, 0] + b[:, 0]) / 2)
        torch.testing.assert_close(logits[:, 2], r[:, 2])  # (0,2) from (0,1)
        torch.testing.assert_close(logits[:, 6], b[:, 4])  # (2,0) from (1,0)
        torch.testing.assert_close(logits[:, 4], (r[:, 4] + b[:, 2]) / 2)  # (1,1) from (1,0) and (0,1)


def expected_image_first_combination(heads: list[torch.Tensor], grid: tuple[int, ...]) -> torch.Tensor:
    """The image-first rule with explicit coordinates: the first token takes the mean of the right and below
    heads at the class slot; every other cell NAR's rule, so frame 1's cells take the next-frame head at the same
    cell of frame 0 (drawn many steps earlier)."""
    coords = list(itertools.product(*(range(n) for n in grid)))
    out = []
    for c in coords:
        if c == (0, 0, 0):
            out.append((heads[0][:, 0] + heads[1][:, 0]) / 2)
            continue
        terms = []
        for axis in (0, 1, 2):
            if c[axis] > 0:
                prev = list(c)
                prev[axis] -= 1
                terms.append(heads[2 - axis][:, 1 + coords.index(tuple(prev))])
        out.append(sum(terms) / len(terms))
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("grid", [(2, 2, 2), (3, 2, 3)])
@torch.no_grad()
def test_image_first_logits_take_the_heads_by_the_image_first_rule(tiny_nar_factory, grid: tuple[int, ...]) -> None:
    model = tiny_nar_factory(grid, image_first=True)
    tokens = torch.randint(0, model.vocab_size, (2, model.num_tokens), generator=torch.Generator().manual_seed(1))
    classes = torch.tensor([1, 3])
    heads = model.head_logits(classes, tokens)
    torch.testing.assert_close(model(classes, tokens), expected_image_first_combination(heads, grid),
                               atol=1e-6, rtol=0)


@torch.no_grad()
def test_head_a_reads_the_hidden_state_after_n_layer_plus_a_blocks(tiny_nar_factory) -> None:
    """Video: 2 + 2 blocks. Perturbing the last block moves only the time head; the one before it moves the
    row head too; the right head depends on neither."""
    model = tiny_nar_factory((2, 2, 3))
    assert len(model.layers) == model.config.n_layer + 2
    tokens = torch.randint(0, model.vocab_size, (2, model.num_tokens), generator=torch.Generator().manual_seed(2))
    classes = torch.tensor([0, 4])
    before = model.head_logits(classes, tokens)
    changed = []
    for block in (3, 2):
        with torch.no_grad():
            model.layers[block].feed_forward.w2.weight.add_(0.5)
        after = model.head_logits(classes, tokens)
        changed.append([not torch.allclose(x, y) for x, y in zip(before, after)])
    assert changed == [[False, False, True], [False, True, True]]


@pytest.mark.parametrize(("grid", "image_first"), [((3, 3), False), ((2, 2, 2), False), ((2, 2, 3), True)])
@torch.no_grad()
def test_no_target_reaches_its_own_logits(tiny_nar_factory, grid: tuple[int, ...], image_first: bool) -> None:
    """The logits of step s do not change when every token at distance >= s changes; they do change with
    the tokens of step s - 1 (frame 1's first cell, drawn alone when frame 0 comes first, with the first token:
    it takes the next-frame head there)."""
    model = tiny_nar_factory(grid, **({"image_first": True} if image_first else {}))
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, model.vocab_size, (2, model.num_tokens), generator=g)
    classes = torch.tensor([2, 2])
    base = model(classes, tokens)
    distance = model.layout.distance
    for s in range(1, model.num_steps):
        later = tokens.clone()
        later[:, distance >= s] = torch.randint(0, model.vocab_size, (2, int((distance >= s).sum())), generator=g)
        torch.testing.assert_close(model(classes, later)[:, distance == s], base[:, distance == s],
                                   atol=1e-5, rtol=0)
        earlier, fed = tokens.clone(), distance == s - 1
        if image_first and s == grid[1] + grid[2] - 1:
            fed = distance == 0
        earlier[:, fed] = (earlier[:, fed] + 1) % model.vocab_size
        assert not torch.allclose(model(classes, earlier)[:, distance == s], base[:, distance == s], atol=1e-4)


@pytest.mark.parametrize(("grid", "image_first"), [((3, 3), False), ((2, 2, 2), False), ((4, 16, 16), False),
                                                   ((4, 16, 16), True)])
def test_slots_in_step_order_turn_the_proximity_mask_into_growing_key_prefixes(grid: tuple[int, ...],
                                                                               image_first: bool) -> None:
    """The teacher-forced pass attends over the slots in step order, where every query sees a prefix of the keys
    (``PrefixMask``): that prefix mask is the proximity mask, reordered."""
    layout = NeighbourLayout(grid, image_first=image_first)
    full = layout.passes[layout.coords.shape[0]]
    ends = full.mask.ends
    prefixes = torch.arange(len(ends))[None, :] < ends[:, None]
    assert torch.equal(prefixes, layout.mask[layout.order][:, layout.order])
    assert torch.equal(layout.order[full.restore], torch.arange(len(ends)))
    assert layout.order[0] == 0 and torch.equal(layout.distance[layout.order[1:] - 1].diff().clamp(max=0),
                                                torch.zeros(len(ends) - 2, dtype=torch.long))


def decode_all(model: NARTransformer, classes: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Logits [B, N, V] from the prefill and one cached decode step per step, fed the given tokens."""
    cache = model.new_cache(len(classes))
    out = torch.full((len(classes), model.num_tokens, model.vocab_size), torch.nan)
    steps = model.steps
    out[:, steps[0]] = model.prefill(classes, cache)
    for s in range(model.num_steps - 1):
        out[:, steps[s + 1]] = model.decode(tokens[:, steps[s]], s, cache)
    assert cache.length == 1 + model.num_tokens - len(steps[-1])
    return out


@pytest.mark.parametrize(("grid", "overrides"), [((3, 3), {}), ((2, 5), {}), ((4, 4), {"n_kv_head": 2}),
                                                 ((2, 2, 2), {}), ((2, 3, 4), {"n_kv_head": 1}), ((1, 1), {}),
                                                 ((3, 2, 3), {"rope": "spatial"}),
                                                 ((3, 9, 9), {"rope": "spatial"}),  # 2 attention chunks
                                                 ((2, 2, 2), {"image_first": True}),
                                                 ((3, 9, 9), {"rope": "spatial", "image_first": True})])
@torch.no_grad()
def test_cached_decoding_equals_the_full_forward(tiny_nar_factory, grid: tuple[int, ...], overrides: dict) -> None:
    model = tiny_nar_factory(grid, **overrides)
    tokens = torch.randint(0, model.vocab_size, (3, model.num_tokens), generator=torch.Generator().manual_seed(4))
    classes = torch.tensor([0, 3, 5])  # 5 is the null class (CFG's unconditional row)
    full = model(classes, tokens)
    assert full.std() > 0.5  # informative logits, so that agreement means something
    torch.testing.assert_close(decode_all(model, classes, tokens), full, atol=2e-5, rtol=0)


@torch.no_grad()
def test_cache_holds_each_token_at_its_raster_slot_with_its_raster_rotation(tiny_nar_factory) -> None:
    """Layer 0's cached key at slot 1 + p is the key of token p rotated for raster position p."""
    grid = (3, 4)
    model = tiny_nar_factory(grid)
    tokens = torch.randint(0, model.vocab_size, (1, 12), generator=torch.Generator().manual_seed(5))
    cache = model.new_cache(1)
    model.prefill(torch.tensor([1]), cache)
    for s in range(model.num_steps - 1):
        model.decode(tokens[:, model.steps[s]], s, cache)
    layer = model.layers[0].attention
    cfg = model.config
    x = model.layers[0].attention_norm(model.tok_embeddings(tokens))
    k = layer.wqkv(x)[..., cfg.dim:cfg.dim + cfg.kv_heads * cfg.head_dim].view(1, 12, cfg.kv_heads, cfg.head_dim)
    k = apply_rope(k, rope_grid_table(grid, cfg.head_dim)[1:]).transpose(1, 2)
    fed = torch.cat(model.steps[:-1])  # the last step is never fed back
    torch.testing.assert_close(cache.keys[0][:, :, 1 + fed], k[:, :, fed], atol=1e-6, rtol=0)


@torch.no_grad()
def test_save_and_load_round_trip(tiny_nar_factory, tmp_path) -> None:
    model = tiny_nar_factory((2, 3, 2))
    save_pretrained(model, tmp_path / "nar")
    meta = json.loads((tmp_path / "nar" / "config.json").read_text())
    assert meta["class"] == "NARTransformer" and meta["config"]["grid"] == [2, 3, 2]
    loaded = from_pretrained(tmp_path / "nar")
    assert isinstance(loaded, NARTransformer) and loaded.config == model.config
    tokens = torch.randint(0, model.vocab_size, (2, 12), generator=torch.Generator().manual_seed(6))
    classes = torch.tensor([0, 1])
    assert torch.equal(loaded(classes, tokens), model(classes, tokens))


@pytest.mark.parametrize(("grid", "match"), [
    ((16,), r"grid must hold 2 to 3 item\(s\), got \(16,\)"),
    ((2, 2, 2, 2), r"grid must hold 2 to 3 item\(s\)"),
    ((0, 4), r"grid\[0\] must be an integer in \[1, 1024\], got 0"),
    ((4, -1), r"grid\[1\] must be an integer in \[1, 1024\], got -1"),
    ((4.0, 4), r"grid\[0\] must be an integer in \[1, 1024\], got 4.0"),
    ("16", "grid must be a list, got '16'"),
])
def test_config_rejects_grids_it_cannot_lay_out(grid, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        NARConfig(grid=grid, dim=32, n_head=4)


def test_spatial_positions_rotate_each_frame_as_an_image_and_embed_the_frame(tiny_nar_factory) -> None:
    """rope="spatial": every frame's slots get the image grid's 2-D table and the frame's learned embedding (zero
    at initialisation); with the embedding moved, frame 1's logits change and frame 0's do not."""
    image_table = rope_grid_table((3, 3), 8)
    fresh = NARTransformer(NARConfig(grid=(2, 3, 3), rope="spatial", dim=32, n_head=4, n_layer=1))
    assert torch.equal(fresh.rope, torch.cat([image_table, image_table[1:]]))
    assert not fresh.frame_embedding.weight.any()
    model = tiny_nar_factory((2, 3, 3), rope="spatial")
    tokens = torch.randint(0, model.vocab_size, (1, 18), generator=torch.Generator().manual_seed(0))
    before = model(torch.tensor([1]), tokens)
    with torch.no_grad():
        model.frame_embedding.weight[1] += 1.0
    after = model(torch.tensor([1]), tokens)
    assert torch.equal(before[:, :1], after[:, :1])  # token 0 reads only the class slot
    assert not torch.allclose(before[:, 9:], after[:, 9:])


def test_config_rejects_a_bad_head_split() -> None:
    with pytest.raises(ValueError, match="head_dim 6 .* must be divisible by 4"):
        NARConfig(grid=(4, 4), dim=48, n_head=8)
    with pytest.raises(ValueError, match="rope must be one of"):
        NARConfig(grid=(2, 4, 4), dim=32, n_head=4, rope="time")
    with pytest.raises(ValueError, match="rope='spatial' encodes the frames of a video grid"):
        NARConfig(grid=(4, 4), dim=32, n_head=4, rope="spatial")
    with pytest.raises(ValueError, match=r"n_layer must be an integer in \[1, 2\*\*24\], got 0"):
        NARConfig(grid=(4, 4), dim=32, n_head=4, n_layer=0)


@torch.no_grad()
def test_bad_tokens_steps_and_caches_are_refused(tiny_nar_factory) -> None:
    model = tiny_nar_factory((3, 3))
    classes = torch.tensor([0])
    with pytest.raises(ValueError, match=r"tokens must be \[batch, 9\] \(the whole 3 rows x 3 columns grid"):
        model(classes, torch.zeros(1, 16, dtype=torch.long))
    cache = model.new_cache(1)
    model.prefill(classes, cache)
    with pytest.raises(ValueError, match="prefill needs an empty cache"):
        model.prefill(classes, cache)
    with pytest.raises(ValueError, match="step 0 of the 3 rows x 3 columns grid has 1 tokens"):
        model.decode(torch.zeros(1, 2, dtype=torch.long), 0, cache)
    with pytest.raises(ValueError, match=r"step must be in 0\.\.3"):
        model.decode(torch.zeros(1, 1, dtype=torch.long), 4, cache)
    with pytest.raises(ValueError, match=r"decoding step 1 needs a cache holding the class and steps 0\.\.0 \(2 "):
        model.decode(torch.zeros(1, 2, dtype=torch.long), 1, cache)
    video = tiny_nar_factory((2, 2, 2))
    with pytest.raises(ValueError, match="the whole 2 frames x 2 rows x 2 columns grid"):
        video(classes, torch.zeros(1, 4, dtype=torch.long))
    first = tiny_nar_factory((2, 2, 2), image_first=True)  # frame 1 reads frame 0's hidden states from the cache
    for cache in (KVCache(len(first.layers), 1, first.config.kv_heads, 9, first.config.head_dim),
                  model.new_cache(1)):
        with pytest.raises(ValueError, match="keeps its 4 cells' hidden states for frame 1: decode with a cache from"):
            first.prefill(classes, cache)
