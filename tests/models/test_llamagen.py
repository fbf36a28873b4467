"""LlamaGen GPT against facts taken from LlamaGen's ``autoregressive/models/gpt.py`` (see the reference notes,
sections 1.1-1.3): the 2-D RoPE table and its zeroed class position, SwiGLU widths, parameter counts, and the
exact state-dict layout of its checkpoints. The expected values are written out here, not read from vgen.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from vgen.models import llamagen as llamagen_module
from vgen.models.layers import apply_rope, rope_2d_table, rope_grid_table, swiglu_hidden_dim
from vgen.models.llamagen import GPTConfig, LlamaGenGPT, gpt_config, llamagen_config_for, single_query_attention

TINY = GPTConfig(vocab_size=40, dim=64, n_layer=2, n_head=4, num_classes=5, block_size=16)




def meta_gpt(config: GPTConfig) -> LlamaGenGPT:
    """Shapes only: no memory, no init cost (GPT-3B included)."""
    with torch.device("meta"):
        return LlamaGenGPT(config)


# ---- 2-D RoPE ----------------------------------------------------------------------------------------------


def reference_angle(pos: int, pair: int, grid: int, head_dim: int, base: float = 10000.0) -> float:
    """Rotation angle of ``pair`` at image position ``pos``: the first head_dim/4 pairs turn with the row
    index at frequencies base^(-4j/head_dim), the last head_dim/4 pairs with the column index likewise."""
    row, col = divmod(pos, grid)
    quarter = head_dim // 4
    j = pair % quarter
    freq = base ** (-(4 * j) / head_dim)
    return (row if pair < quarter else col) * freq


@pytest.mark.parametrize(("grid", "head_dim"), [(4, 16), (16, 64), (24, 64), (5, 100)])
def test_rope_table_matches_the_row_then_column_formula(grid: int, head_dim: int) -> None:
    table = rope_2d_table(grid, head_dim).double()
    assert table.shape == (1 + grid * grid, head_dim // 2, 2)
    expected = torch.tensor([[reference_angle(p, i, grid, head_dim) for i in range(head_dim // 2)]
                             for p in range(grid * grid)], dtype=torch.float64)
    torch.testing.assert_close(table[1:, :, 0], expected.cos(), atol=1e-6, rtol=0)
    torch.testing.assert_close(table[1:, :, 1], expected.sin(), atol=1e-6, rtol=0)


def test_rope_prefix_positions_are_zero_not_identity() -> None:
    table = rope_2d_table(4, 16, num_prefix=3)
    assert table.shape == (3 + 16, 8, 2)
    assert torch.count_nonzero(table[:3]) == 0
    # the first image cell (row 0, column 0) is the identity rotation
    assert torch.equal(table[3, :, 0], torch.ones(8)) and torch.equal(table[3, :, 1], torch.zeros(8))


def test_apply_rope_rotates_interleaved_pairs() -> None:
    """Pair i is (x[2i], x[2i+1]) rotated by angle_i: that complex number times e^(i angle_i)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 17, 3, 16, generator=g)
    table = rope_2d_table(4, 16)
    as_complex = torch.view_as_complex(x.reshape(2, 17, 3, 8, 2).contiguous())
    rotation = torch.complex(table[:, :, 0], table[:, :, 1])[None, :, None, :]
    expected = torch.view_as_real(as_complex * rotation).flatten(-2)
    torch.testing.assert_close(apply_rope(x, table), expected, atol=1e-6, rtol=0)


def test_apply_rope_keeps_dtype_and_rotates_in_fp32() -> None:
    x = torch.randn(1, 5, 2, 8).bfloat16()
    table = rope_2d_table(2, 8)
    out = apply_rope(x, table)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, apply_rope(x.float(), table).bfloat16())


@torch.no_grad()
def test_class_position_queries_and_keys_are_exactly_zero(tiny_gpt_factory) -> None:
    model = tiny_gpt_factory(TINY)
    captured: list[torch.Tensor] = []
    model.layers[0].attention.wqkv.register_forward_hook(lambda m, i, out: captured.append(out))
    model(torch.tensor([2]), torch.randint(0, TINY.vocab_size, (1, 6)))
    q, k, v = captured[0].split([64, 64, 64], dim=-1)
    q_rot = apply_rope(q.view(1, 7, 4, 16), model.rope[:7])
    k_rot = apply_rope(k.view(1, 7, 4, 16), model.rope[:7])
    assert torch.count_nonzero(q_rot[:, 0]) == 0 and torch.count_nonzero(k_rot[:, 0]) == 0
    assert torch.count_nonzero(v[:, 0]) > 0  # the class value still reaches later tokens
    assert torch.count_nonzero(q_rot[:, 1:]) > 0


def test_rope_table_is_not_part_of_the_state_dict(tiny_gpt_factory) -> None:
    model = tiny_gpt_factory(TINY)
    assert not any("rope" in k or "freqs" in k for k in model.state_dict())
    assert model.rope.dtype == torch.float32
    assert model.to(torch.bfloat16).rope.dtype == torch.float32  # stays fp32 in a bf16 model, as in LlamaGen


# ---- sizes -------------------------------------------------------------------------------------------------

# LlamaGen's SwiGLU widths and its parameter-count comments (c2i: vocab 16384, 1000 classes + null row)
LLAMAGEN_SIZES = {
    "GPT-B": (2048, 111e6),
    "GPT-L": (2816, 343e6),
    "GPT-XL": (3584, 775e6),
    "GPT-XXL": (4096, 1.4e9),
    "GPT-3B": (8704, 3.1e9),
}


@pytest.mark.parametrize("name", list(LLAMAGEN_SIZES))
def test_swiglu_hidden_sizes_match_llamagen(name: str) -> None:
    hidden, _ = LLAMAGEN_SIZES[name]
    config = gpt_config(name)
    assert swiglu_hidden_dim(config.dim, config.multiple_of) == hidden
    model = meta_gpt(config)
    assert model.layers[0].feed_forward.w1.weight.shape == (hidden, config.dim)
    assert model.layers[0].feed_forward.w2.weight.shape == (config.dim, hidden)


@pytest.mark.parametrize("name", list(LLAMAGEN_SIZES))
def test_parameter_counts_match_the_formula_and_llamagen(name: str) -> None:
    hidden, advertised = LLAMAGEN_SIZES[name]
    config = gpt_config(name)
    d, n_layer, vocab = config.dim, config.n_layer, 16384
    per_layer = 3 * d * d + d * d + 3 * d * hidden + 2 * d  # wqkv, wo, w1/w2/w3, two RMSNorm gains
    formula = 1001 * d + vocab * d + n_layer * per_layer + d + vocab * d
    count = sum(p.numel() for p in meta_gpt(config).parameters())
    assert count == formula
    assert abs(count - advertised) / advertised < 0.04, f"{name}: {count / 1e6:.1f}M vs {advertised / 1e6}M"


def test_gpt_b_is_111m() -> None:
    assert round(sum(p.numel() for p in meta_gpt(gpt_config("GPT-B")).parameters()) / 1e6) == 111


@pytest.mark.parametrize(("image_size", "downsample", "block_size"), [(256, 16, 256), (384, 16, 576),
                                                                       (512, 16, 1024), (256, 8, 1024)])
def test_llamagen_config_for_image_size(image_size: int, downsample: int, block_size: int) -> None:
    config = llamagen_config_for("GPT-L", image_size, downsample)
    assert (config.block_size, config.grid_size) == (block_size, math.isqrt(block_size))
    assert (config.dim, config.n_layer, config.n_head, config.vocab_size, config.num_classes) == \
        (1024, 24, 16, 16384, 1000)


def test_config_errors_are_specific() -> None:
    with pytest.raises(ValueError, match="unknown GPT model 'GPT-Q'"):
        gpt_config("GPT-Q")
    with pytest.raises(ValueError, match="not divisible by the tokenizer's downsampling 16"):
        llamagen_config_for("GPT-B", 200)
    with pytest.raises(ValueError, match="square"):
        GPTConfig(block_size=200)
    with pytest.raises(ValueError, match="divisible by n_head"):
        GPTConfig(dim=100, n_head=12)
    with pytest.raises(ValueError, match="n_kv_head"):
        GPTConfig(n_kv_head=5)


def test_config_round_trips_through_a_dict() -> None:
    config = gpt_config("GPT-XL", block_size=576, n_kv_head=4)
    assert GPTConfig.from_dict(config.to_dict()) == config
    assert "frames" not in config.to_dict()  # an image model's config is LlamaGen's ModelArgs, nothing added
    video = replace(TINY, frames=4, block_size=64)
    assert video.to_dict()["frames"] == 4 and GPTConfig.from_dict(video.to_dict()) == video


@pytest.mark.parametrize(("frames", "block_size"), [(0, 16), (1.5, 16), (3, 16), (2, 20)])
def test_frames_must_split_the_tokens_into_square_frames(frames, block_size: int) -> None:
    with pytest.raises(ValueError, match=r"frames must be an integer in \[1, 1024\]|frame\(s\) of a square number"):
        GPTConfig(block_size=block_size, frames=frames)


def test_a_spatial_video_config_rotates_each_frame_as_an_image_and_embeds_its_frame() -> None:
    config = replace(TINY, frames=4, block_size=64, rope="spatial")
    assert config.to_dict()["rope"] == "spatial" and GPTConfig.from_dict(config.to_dict()) == config
    assert "rope" not in replace(TINY, frames=4, block_size=64).to_dict()
    model = LlamaGenGPT(config)
    torch.testing.assert_close(model.rope[17:33], model.rope[1:17])  # frame 1 turns as frame 0
    torch.testing.assert_close(model.rope[:17], rope_2d_table(4, TINY.head_dim))
    assert model.frame_embedding.weight.shape == (4, 64) and not model.frame_embedding.weight.any()
    with pytest.raises(ValueError, match="needs frames > 1"):
        replace(TINY, rope="spatial")
    with pytest.raises(ValueError, match="rope must be one of"):
        replace(TINY, frames=4, block_size=64, rope="time")


def test_a_video_config_lays_its_tokens_frame_by_frame_with_3d_rope() -> None:
    model = meta_gpt(replace(TINY, frames=4, block_size=64))
    assert (model.num_tokens, model.grid, model.config.grid_size) == (64, (4, 4, 4), 4)
    # token 1 + p turns with (frame, row, column) of raster position p; the class position not at all
    torch.testing.assert_close(model.rope, rope_grid_table((4, 4, 4), TINY.head_dim))
    assert model.rope.shape == (65, TINY.head_dim // 2, 2) and not model.rope[0].any()


# ---- checkpoint layout -------------------------------------------------------------------------------------

# LlamaGen's keys for a c2i model with dim 64, 2 layers, 4 heads (head_dim 16), vocab 40, 5 classes:
# class table has a null row, wqkv stacks q|k|v, SwiGLU width find_multiple(int(2 * 4 * 64 / 3), 256) = 256.
TINY_LLAMAGEN_KEYS = {
    "cls_embedding.embedding_table.weight": (6, 64),
    "tok_embeddings.weight": (40, 64),
    "layers.0.attention.wqkv.weight": (192, 64),
    "layers.0.attention.wo.weight": (64, 64),
    "layers.0.feed_forward.w1.weight": (256, 64),
    "layers.0.feed_forward.w3.weight": (256, 64),
    "layers.0.feed_forward.w2.weight": (64, 256),
    "layers.0.attention_norm.weight": (64,),
    "layers.0.ffn_norm.weight": (64,),
    "layers.1.attention.wqkv.weight": (192, 64),
    "layers.1.attention.wo.weight": (64, 64),
    "layers.1.feed_forward.w1.weight": (256, 64),
    "layers.1.feed_forward.w3.weight": (256, 64),
    "layers.1.feed_forward.w2.weight": (64, 256),
    "layers.1.attention_norm.weight": (64,),
    "layers.1.ffn_norm.weight": (64,),
    "norm.weight": (64,),
    "output.weight": (40, 64),
}


def test_state_dict_has_exactly_llamagens_keys_and_shapes(tiny_gpt_factory) -> None:
    got = {k: tuple(v.shape) for k, v in tiny_gpt_factory(TINY).state_dict().items()}
    assert got == TINY_LLAMAGEN_KEYS


def test_grouped_query_wqkv_stacks_q_then_kv_heads() -> None:
    config = GPTConfig(vocab_size=40, dim=64, n_layer=1, n_head=4, n_kv_head=1, num_classes=5, block_size=16)
    assert meta_gpt(config).layers[0].attention.wqkv.weight.shape == ((4 + 2 * 1) * 16, 64)


def test_no_biases_and_a_zero_output_layer_at_init() -> None:
    model = LlamaGenGPT(TINY)
    assert not any(k.endswith("bias") for k in model.state_dict())
    assert torch.count_nonzero(model.output.weight) == 0


# ---- forward semantics -------------------------------------------------------------------------------------


@torch.no_grad()
def test_position_p_depends_only_on_the_class_and_tokens_before_p(tiny_gpt_factory) -> None:
    model = tiny_gpt_factory(TINY)
    tokens = torch.randint(0, TINY.vocab_size, (1, 10))
    changed = tokens.clone()
    changed[0, 6] = (tokens[0, 6] + 1) % TINY.vocab_size
    a, b = model(torch.tensor([1]), tokens), model(torch.tensor([1]), changed)
    assert a.shape == (1, 11, TINY.vocab_size) and a.dtype == torch.float32
    assert torch.equal(a[:, :7], b[:, :7])  # positions 0..6 predict tokens 0..6 and never see token 6
    assert not torch.allclose(a[:, 7:], b[:, 7:])
    assert not torch.allclose(model(torch.tensor([2]), tokens)[:, 0], a[:, 0])


@torch.no_grad()
def test_class_dropout_in_training_uses_the_null_row(tiny_gpt_factory) -> None:
    config = GPTConfig(vocab_size=40, dim=64, n_layer=2, n_head=4, num_classes=5, block_size=16,
                       class_dropout_prob=1.0, token_dropout_p=0.0, resid_dropout_p=0.0, ffn_dropout_p=0.0)
    model = tiny_gpt_factory(config)
    tokens = torch.randint(0, 40, (2, 4))
    classes = torch.tensor([0, 3])
    dropped = model.train()(classes, tokens)
    null = model.eval()(model.null_condition(classes), tokens)
    assert torch.equal(model.null_condition(classes), torch.tensor([5, 5]))
    torch.testing.assert_close(dropped, null)


def test_forward_rejects_sequences_longer_than_the_grid(tiny_gpt_factory) -> None:
    model = tiny_gpt_factory(TINY)
    with pytest.raises(ValueError, match="exceeds 1 \\+ block_size = 17"):
        model(torch.tensor([0]), torch.zeros(1, 17, dtype=torch.long))


def test_token_layout_properties() -> None:
    model = meta_gpt(llamagen_config_for("GPT-B", 384))
    assert (model.num_tokens, model.grid, model.vocab_size, model.num_classes) == (576, (24, 24), 16384, 1000)


# ---- attention of one query (a decode step) -----------------------------------------------------------------


@pytest.mark.parametrize("masked", [False, True])
def test_single_query_attention_equals_the_kernel(masked: bool) -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, n, 16, generator=g) for n in (1, 9, 9))
    mask = torch.arange(9)[None] <= torch.tensor([[5]]) if masked else None
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(single_query_attention(q, k, v, mask), expected, atol=1e-6, rtol=1e-5)
    half = single_query_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), expected, atol=2e-2, rtol=2e-2)


@torch.no_grad()
def test_a_bf16_decode_step_on_a_cpu_multiplies_and_still_equals_the_full_pass(tiny_gpt_factory,
                                                                              monkeypatch) -> None:
    """In bf16 a one-token step takes :func:`single_query_attention` (an eager fp32 step keeps the kernel); the
    cached steps reproduce the full causal pass within bf16's precision."""
    calls = []
    monkeypatch.setattr(llamagen_module, "single_query_attention",
                        lambda *args: calls.append(args[0].dtype) or single_query_attention(*args))
    tokens = torch.randint(0, TINY.vocab_size, (2, 8), generator=torch.Generator().manual_seed(1))
    classes = torch.tensor([1, 3])
    for dtype in (torch.float32, torch.bfloat16):
        model = tiny_gpt_factory(TINY).to(dtype)
        full = model(classes, tokens)
        cache = model.new_cache(2)
        steps = [model.prefill(classes, cache)]
        steps += [model.decode(tokens[:, i:i + 1], cache)[:, -1] for i in range(tokens.shape[1] - 1)]
        torch.testing.assert_close(torch.stack(steps, 1).float(), full[:, :8].float(),
                                   **({} if dtype == torch.float32 else dict(atol=5e-2, rtol=5e-2)))
    assert calls and set(calls) == {torch.bfloat16}
