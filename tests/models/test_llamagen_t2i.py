"""LlamaGen-T2I against facts taken from LlamaGen's ``autoregressive/models/gpt.py`` and ``generate.py``: the caption
embedder's state-dict layout, and a reference forward written here from those files (not from vgen's model code):
caption MLP, 2-D RoPE with ``cls_token_num`` zero rows (identity rows under vgen's ``prefix_rope="identity"``),
causal attention with the caption's padded keys masked and the diagonal kept, SwiGLU, RMSNorm, output head. vgen's
masked prefill, every cached decode path and greedy generation must equal it for a batch of two prompts of
different lengths."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from vgen.hub import ASSETS, load_weights, read_torch_checkpoint
from vgen.models.conditioning import PrefixCondition, cat_conditions
from vgen.models.llamagen import (
    CAPTION_TOKENS,
    LLAMAGEN_T2I_CHECKPOINTS,
    GPTConfig,
    LlamaGenGPT,
    llamagen_t2i_config_for,
)
from vgen.samplers import ARSampler, SamplingParams

# dim 64, 2 layers, 4 heads (head_dim 16), vocab 40, caption features of 24, 10 caption positions, 4x4 tokens
T2I = GPTConfig(vocab_size=40, dim=64, n_layer=2, n_head=4, block_size=16, model_type="t2i", caption_dim=24,
                cls_token_num=10)
T2I_IDENTITY = replace(T2I, prefix_rope="identity")  # vgen's own text models: the caption at the grid's origin
LENGTHS = (3, 7)  # real caption positions of the two prompts of the batch


def caption_batch(config: GPTConfig = T2I, lengths: tuple[int, ...] = LENGTHS, seed: int = 0,
                  padding: str = "zeros") -> PrefixCondition:
    """Left-padded random caption features, the padding zeros (as LlamaGen's sampler leaves it) or noise."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(len(lengths), config.cls_token_num, config.caption_dim, generator=g)
    mask = torch.arange(config.cls_token_num)[None, :] >= config.cls_token_num - torch.tensor(lengths)[:, None]
    if padding == "zeros":
        values = values * mask[..., None]
    else:
        values = torch.where(mask[..., None], values, 100 * torch.randn(values.shape, generator=g))
    return PrefixCondition(values, mask)


# ---- the reference: LlamaGen-T2I's forward, from its source ------------------------------------------------------


def reference_rope(config: GPTConfig) -> torch.Tensor:
    """``precompute_freqs_cis_2d``: [cls_token_num + grid**2, head_dim // 2, 2]; the first half of the pairs turns
    with the row at base^(-2j / (head_dim / 2)), the second half with the column; the caption rows are zero
    (vgen's ``prefix_rope="identity"``: cos 1, sin 0)."""
    grid, half = math.isqrt(config.block_size), config.head_dim // 2
    freqs = 1.0 / (config.rope_base ** (torch.arange(0, half, 2).double()[: half // 2] / half))
    rows = []
    for r in range(grid):
        for c in range(grid):
            rows.append(torch.cat([r * freqs, c * freqs]))
    angles = torch.stack(rows)
    table = torch.stack([angles.cos(), angles.sin()], dim=-1)
    caption = torch.zeros(config.cls_token_num, half, 2, dtype=torch.float64)
    if config.prefix_rope == "identity":
        caption[..., 0] = 1.0
    return torch.cat([caption, table])


def reference_rotate(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``apply_rotary_emb`` on x [B, T, H, D] with table [T, D/2, 2]."""
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    cos, sin = table[None, :, None, :, 0], table[None, :, None, :, 1]
    return torch.stack([pairs[..., 0] * cos - pairs[..., 1] * sin,
                        pairs[..., 1] * cos + pairs[..., 0] * sin], dim=-1).flatten(3)


def reference_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


@torch.no_grad()
def reference_logits(state: dict[str, torch.Tensor], config: GPTConfig, cond: PrefixCondition,
                     tokens: torch.Tensor) -> torch.Tensor:
    """Logits [B, L + n, V] of the full sequence (caption, then image ``tokens`` [B, n]), in float64."""
    w = {k: v.double() for k, v in state.items()}
    caption = cond.values.double()
    h = F.linear(F.gelu(F.linear(caption, w["cls_embedding.cap_proj.fc1.weight"]), approximate="tanh"),
                 w["cls_embedding.cap_proj.fc2.weight"])
    h = torch.cat([h, w["tok_embeddings.weight"][tokens]], dim=1)
    b, t, dim = h.shape
    heads, hd = config.n_head, config.head_dim
    table = reference_rope(config)[:t]
    # generate.py: causal mask times the caption mask (ones for the image tokens), then the diagonal set to 1
    keys = torch.cat([cond.mask, torch.ones(b, t - cond.length, dtype=torch.bool)], dim=1)
    allowed = torch.ones(t, t).tril().bool()[None] & keys[:, None, :]
    allowed = allowed | torch.eye(t, dtype=torch.bool)[None]
    for i in range(config.n_layer):
        p = f"layers.{i}."
        x = reference_norm(h, w[p + "attention_norm.weight"], config.norm_eps)
        q, k, v = F.linear(x, w[p + "attention.wqkv.weight"]).split([dim, dim, dim], dim=-1)
        q = reference_rotate(q.view(b, t, heads, hd), table).transpose(1, 2)
        k = reference_rotate(k.view(b, t, heads, hd), table).transpose(1, 2)
        v = v.view(b, t, heads, hd).transpose(1, 2)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, dim)
        h = h + F.linear(out, w[p + "attention.wo.weight"])
        x = reference_norm(h, w[p + "ffn_norm.weight"], config.norm_eps)
        ff = F.silu(F.linear(x, w[p + "feed_forward.w1.weight"])) * F.linear(x, w[p + "feed_forward.w3.weight"])
        h = h + F.linear(ff, w[p + "feed_forward.w2.weight"])
    return F.linear(reference_norm(h, w["norm.weight"], config.norm_eps), w["output.weight"])


def reference_null(state: dict[str, torch.Tensor], cond: PrefixCondition) -> PrefixCondition:
    """generate.py's CFG rows: ``zeros_like(cond) + uncond_embedding``, the prompt's mask repeated."""
    return PrefixCondition(torch.zeros_like(cond.values) + state["cls_embedding.uncond_embedding"], cond.mask)


def reference_greedy(state: dict[str, torch.Tensor], config: GPTConfig, cond: PrefixCondition,
                     cfg_scale: float) -> torch.Tensor:
    """Greedy tokens [B, block_size], one full reference forward per token, CFG as ``uncond + (c - u) * s``."""
    both = cat_conditions([cond, reference_null(state, cond)])
    tokens = torch.zeros(len(cond), 0, dtype=torch.long)
    for _ in range(config.block_size):
        logits = reference_logits(state, config, both, torch.cat([tokens, tokens]))[:, -1]
        c, u = logits.chunk(2)
        tokens = torch.cat([tokens, (u + (c - u) * cfg_scale).argmax(-1, keepdim=True)], dim=1)
    return tokens


# ---- config ---------------------------------------------------------------------------------------------------


def test_t2i_config_defaults_validation_and_round_trip() -> None:
    config = GPTConfig(model_type="t2i")
    assert (config.cls_token_num, config.caption_dim, config.text_conditional) == (CAPTION_TOKENS, 2048, True)
    assert GPTConfig().cls_token_num == 1 and not GPTConfig().text_conditional
    assert GPTConfig.from_dict(json.loads(json.dumps(T2I_IDENTITY.to_dict()))) == T2I_IDENTITY
    without_key = {k: v for k, v in T2I_IDENTITY.to_dict().items() if k != "prefix_rope"}
    assert T2I.prefix_rope == GPTConfig.from_dict(without_key).prefix_rope == "zero"  # LlamaGen's
    with pytest.raises(ValueError, match=r"prefix_rope must be one of \['zero', 'identity'\], got 'one'"):
        GPTConfig(prefix_rope="one")
    assert T2I.to_dict()["model_type"] == "t2i" and T2I.to_dict()["cls_token_num"] == 10
    with pytest.raises(ValueError, match=r"model_type must be one of \['c2i', 't2i'\], got 'x2i'"):
        GPTConfig(model_type="x2i")
    with pytest.raises(ValueError, match="c2i\\) model has one class position: cls_token_num must be 1, got 120"):
        GPTConfig(cls_token_num=120)
    with pytest.raises(ValueError, match=r"cls_token_num must be an integer in \[1, 1024\], got 0"):
        GPTConfig(model_type="t2i", cls_token_num=0)
    with pytest.raises(ValueError, match=r"caption_dim must be an integer in \[1, 2\*\*24\], got 0"):
        GPTConfig(model_type="t2i", caption_dim=0)
    with pytest.raises(ValueError, match="generates one image: frames must be 1, got 2"):
        GPTConfig(model_type="t2i", block_size=32, frames=2)


SHIPPED_GPTS = sorted(p.parent.parent.name for p in ASSETS.glob("*/gpt/config.json")
                      if json.loads(p.read_text())["class"] == "LlamaGenGPT"
                      and json.loads(p.read_text())["config"].get("model_type", "c2i") == "c2i")


def test_some_shipped_models_are_llamagen_gpts() -> None:
    assert "shapes-c2i" in SHIPPED_GPTS


@pytest.mark.parametrize("folder", SHIPPED_GPTS)
def test_the_shipped_class_configs_load_and_write_back_every_value_unchanged(folder: str) -> None:
    meta = json.loads((ASSETS / folder / "gpt" / "config.json").read_text())
    config = GPTConfig.from_dict(meta["config"])
    written = config.to_dict()
    assert config.model_type == "c2i" and {k: written[k] for k in meta["config"]} == meta["config"]
    assert GPTConfig.from_dict(written) == config


@pytest.mark.parametrize(("image_size", "block_size"), [(256, 256), (512, 1024)])
def test_llamagen_t2i_configs_are_gpt_xl_with_120_caption_positions(image_size: int, block_size: int) -> None:
    config = llamagen_t2i_config_for(image_size)
    assert (config.dim, config.n_layer, config.n_head, config.vocab_size, config.block_size) == \
        (1280, 36, 20, 16384, block_size)
    assert (config.model_type, config.cls_token_num, config.caption_dim) == ("t2i", 120, 2048)
    assert LLAMAGEN_T2I_CHECKPOINTS == {"t2i_XL_stage1_256.pt": 256, "t2i_XL_stage2_512.pt": 512}
    with pytest.raises(ValueError, match="not divisible by the tokenizer's downsampling 16"):
        llamagen_t2i_config_for(200)


# ---- checkpoint layout ----------------------------------------------------------------------------------------

# LlamaGen's keys for a t2i model with dim 64, 2 layers, 4 heads, vocab 40, caption_dim 24: CaptionEmbedder holds
# cap_proj = MLP(fc1: caption_dim -> dim, fc2: dim -> dim, no biases) and the buffer uncond_embedding
# [token_num = 120, caption_dim]; no class table; the blocks as in c2i (SwiGLU width 256).
T2I_LLAMAGEN_KEYS = {
    "cls_embedding.cap_proj.fc1.weight": (64, 24),
    "cls_embedding.cap_proj.fc2.weight": (64, 64),
    "cls_embedding.uncond_embedding": (120, 24),
    "tok_embeddings.weight": (40, 64),
    **{f"layers.{i}.{name}": shape for i in range(2) for name, shape in [
        ("attention.wqkv.weight", (192, 64)), ("attention.wo.weight", (64, 64)),
        ("feed_forward.w1.weight", (256, 64)), ("feed_forward.w3.weight", (256, 64)),
        ("feed_forward.w2.weight", (64, 256)), ("attention_norm.weight", (64,)), ("ffn_norm.weight", (64,))]},
    "norm.weight": (64,),
    "output.weight": (40, 64),
}


def test_state_dict_has_exactly_llamagens_t2i_keys_and_shapes() -> None:
    model = LlamaGenGPT(replace(T2I, cls_token_num=120))
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == T2I_LLAMAGEN_KEYS
    assert model.rope.shape == (120 + 16, 8, 2) and not model.rope[:120].any()  # caption rows do not rotate
    assert torch.count_nonzero(model.output.weight) == 0


def test_a_llamagen_t2i_checkpoint_loads_strictly(tmp_path, tiny_gpt_factory) -> None:
    source = tiny_gpt_factory(T2I)
    for key in ("model", "module", "state_dict"):
        torch.save({key: source.state_dict(), "steps": 1}, tmp_path / "t2i.pt")
        with torch.device("meta"):
            model = LlamaGenGPT(T2I)
        model = model.to_empty(device="cpu")
        load_weights(model, read_torch_checkpoint(tmp_path / "t2i.pt", "GPT"))
        cond = caption_batch()
        assert torch.equal(model.eval()(cond), source(cond))


# ---- the condition ----------------------------------------------------------------------------------------------


def test_check_condition_says_what_is_wrong(tiny_gpt_factory) -> None:
    model = tiny_gpt_factory(T2I)
    model.check_condition(caption_batch())
    with pytest.raises(ValueError, match="text-to-image \\(t2i\\): give a prompt"):
        model.check_condition(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="dimension 32 do not fit this model's caption_dim 24"):
        model.check_condition(PrefixCondition(torch.zeros(2, 10, 32), torch.ones(2, 10, dtype=torch.bool)))
    with pytest.raises(ValueError, match="of 12 positions does not fit this model's cls_token_num 10"):
        model.check_condition(PrefixCondition(torch.zeros(2, 12, 24), torch.ones(2, 12, dtype=torch.bool)))
    with pytest.raises(ValueError, match="^a caption is features \\[B, 10, 24\\], got torch.int64"):
        model.check_condition(PrefixCondition(torch.zeros(2, 10, dtype=torch.long), torch.ones(2, 10).bool()))
    with pytest.raises(ValueError, match="class-conditional: give class ids, not a text prompt"):
        tiny_gpt_factory(GPTConfig(vocab_size=40, dim=64, n_layer=1, n_head=4, num_classes=5, block_size=16)
                         ).check_condition(caption_batch())


def test_the_null_condition_is_the_uncond_embedding_under_the_prompts_mask(tiny_gpt_factory) -> None:
    model = tiny_gpt_factory(T2I)
    cond = caption_batch()
    null = model.null_condition(cond)
    expected = reference_null(model.state_dict(), cond)
    assert torch.equal(null.values, expected.values) and torch.equal(null.mask, cond.mask)


# ---- numerics against the reference -----------------------------------------------------------------------------


@pytest.mark.parametrize("config", [T2I, T2I_IDENTITY], ids=["zero-prefix", "identity-prefix"])
@torch.no_grad()
def test_forward_and_masked_prefill_equal_the_reference(tiny_gpt_factory, config: GPTConfig) -> None:
    model = tiny_gpt_factory(config)
    cond = caption_batch()
    tokens = torch.randint(0, T2I.vocab_size, (2, T2I.block_size - 1), generator=torch.Generator().manual_seed(1))
    expected = reference_logits(model.state_dict(), config, cond, tokens).float()
    full = model(cond, tokens)
    assert full.shape == (2, T2I.block_size, T2I.vocab_size)  # entry p predicts image token p
    assert (full - expected[:, T2I.cls_token_num - 1:]).abs().max() <= 1e-4
    cache = model.new_cache(2)
    assert cache.max_len == T2I.cls_token_num + T2I.block_size
    logits, hidden = model.prefill(cond, cache, return_hidden=True)
    assert hidden.shape == (2, 1, T2I.dim) and cache.length == T2I.cls_token_num
    assert (logits - expected[:, T2I.cls_token_num - 1]).abs().max() <= 1e-4


@pytest.mark.parametrize("config", [T2I, T2I_IDENTITY], ids=["zero-prefix", "identity-prefix"])
@torch.no_grad()
def test_every_cached_decode_path_equals_the_reference(tiny_gpt_factory, config: GPTConfig) -> None:
    model = tiny_gpt_factory(config)
    cond, L = caption_batch(), T2I.cls_token_num
    tokens = torch.randint(0, T2I.vocab_size, (2, T2I.block_size - 1), generator=torch.Generator().manual_seed(2))
    expected = reference_logits(model.state_dict(), config, cond, tokens).float()[:, L:]  # predicting tokens 1 ..

    def prefilled(extra: int = 0):
        cache = model.new_cache(2, extra=extra)
        model.prefill(cond, cache)
        return cache

    cache = prefilled()  # one token per step
    steps = torch.stack([model.decode(tokens[:, i:i + 1], cache)[:, -1] for i in range(tokens.shape[1])], dim=1)
    assert (steps - expected).abs().max() <= 1e-4
    cache = prefilled()  # several tokens per pass, then a crop and a redo (speculative rollback)
    assert (model.decode(tokens[:, :6], cache) - expected[:, :6]).abs().max() <= 1e-4
    cache.crop(L + 3)
    assert (model.decode(tokens[:, 3:9], cache) - expected[:, 3:9]).abs().max() <= 1e-4
    cache, slot = prefilled(), torch.tensor([1])  # static shapes (CUDA graphs), counted as after a class
    for i in range(tokens.shape[1]):
        logits = model.decode_step(tokens[:, i:i + 1], slot, cache)
        assert (logits - expected[:, i]).abs().max() <= 1e-4
        cache.advance(1)
        slot += 1
    cache = prefilled(extra=4)  # per-row starts, rows at different places, stale slots rewritten
    starts = torch.tensor([1, 1])
    model.decode_rows(tokens[:, :5], starts, cache)
    starts = torch.tensor([3, 5])  # row 0 kept 2 of its tokens, row 1 all 4: windows from token 2 and token 4
    window = torch.stack([tokens[0, 2:7], tokens[1, 4:9]])
    logits, hidden = model.decode_rows(window, starts, cache, return_hidden=True)
    assert hidden.shape == (2, 5, T2I.dim)
    assert (logits[0] - expected[0, 2:7]).abs().max() <= 1e-4
    assert (logits[1] - expected[1, 4:9]).abs().max() <= 1e-4


@pytest.mark.parametrize("config", [T2I, T2I_IDENTITY], ids=["zero-prefix", "identity-prefix"])
@torch.no_grad()
def test_greedy_generation_equals_the_reference_loop(tiny_gpt_factory, config: GPTConfig) -> None:
    model = tiny_gpt_factory(config)
    cond = caption_batch()
    expected = reference_greedy(model.state_dict(), config, cond, cfg_scale=4.0)
    out = ARSampler().sample(model, cond, SamplingParams(temperature=0.0, cfg_scale=4.0))
    assert torch.equal(out.tokens, expected)
    assert len(set(expected.flatten().tolist())) > 4  # the tokens are informative, not one repeated code


@torch.no_grad()
def test_a_rows_tokens_do_not_see_the_padding_or_the_other_rows_prompt(tiny_gpt_factory) -> None:
    model = tiny_gpt_factory(T2I)
    params = SamplingParams(temperature=0.0, cfg_scale=3.0)
    pair = ARSampler().sample(model, caption_batch(), params).tokens
    noisy = ARSampler().sample(model, caption_batch(padding="noise"), params).tokens
    assert torch.equal(pair, noisy)  # padding values of any size change nothing
    other = caption_batch(lengths=(3, 1), seed=0)
    assert torch.equal(other.values[0], caption_batch().values[0])
    assert torch.equal(ARSampler().sample(model, other, params).tokens[0], pair[0])
    alone = PrefixCondition(caption_batch().values[1:], caption_batch().mask[1:])
    assert torch.equal(ARSampler().sample(model, alone, params).tokens[0], pair[1])
    unmasked = PrefixCondition(caption_batch(padding="noise").values, torch.ones(2, T2I.cls_token_num).bool())
    assert not torch.equal(model(unmasked)[:, 0], model(caption_batch())[:, 0])  # the mask is what hides them
