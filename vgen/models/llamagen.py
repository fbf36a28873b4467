"""LlamaGen GPT, class-conditional (c2i) or text-conditional (t2i), with a croppable KV cache and multi-token
decoding.

Parameter names, shapes and numerics match LlamaGen's ``autoregressive/models/gpt.py``, so its released
checkpoints load strictly: SwiGLU MLPs, RMSNorm in fp32 (eps 1e-5), 2-D RoPE with interleaved pairs and zero
rotation at the condition positions, and a class table with one extra (null) row for classifier-free guidance.

``GPTConfig.model_type == "t2i"`` (LlamaGen-T2I) replaces the class position by ``cls_token_num`` caption
positions: T5 features [B, cls_token_num, caption_dim], left-padded, projected by a two-layer GELU MLP, with a
learned ``uncond_embedding`` as the unconditional caption for CFG. The caption's padding is masked out of
attention for every later query (the padded position itself still sees itself, as in LlamaGen's ``generate``);
the mask is per row and is kept in the KV cache from the prefill on (:meth:`~vgen.models.cache.KVCache.mask_keys`),
so every decode path masks the padding alike.

Sequence layout: position 0 holds the class embedding, position 1 + i holds image token i (raster order), and the
output at position p predicts image token p. :meth:`prefill` runs the class position; :meth:`decode` appends any
number of image tokens at once and returns one distribution per token, which is what speculative verification
needs; ``cache.crop(n)`` rolls back. A t2i model's prefix is ``cls_token_num`` positions long and its image token i
sits at position ``cls_token_num + i``.

``GPTConfig.frames > 1`` (vgen's addition, not in LlamaGen) makes the same model a next-token video AR: image token
i becomes token i of a clip's frames in raster order (frame by frame, each frame row by row), laid on a
(frames, rows, columns) grid with 3-D RoPE, or (``rope="spatial"``) each frame rotated as an image with a learned
per-frame embedding added to its tokens, so that an image model's or an NBP video model's weights start it.
Everything else, sampling and speculative decoding included, is unchanged; LlamaGen's own configs have one frame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from vgen.models.backbone import GRID_LIMIT, ROPE_KINDS, BackboneConfig, check_rotary_pairs
from vgen.models.cache import DraftTree, KVCache, RowSlots
from vgen.models.conditioning import (
    Condition,
    PrefixCondition,
    TokenGridModel,
    check_caption_features,
    init_llamagen_weights,
)
from vgen.models.config_fields import declare, size
from vgen.models.layers import (
    PREFIX_ROPES,
    FeedForward,
    PrefixMask,
    RMSNorm,
    apply_rope,
    frame_offsets,
    rope_2d_table,
    rope_frames_table,
    rope_grid_table,
    swiglu_hidden_dim,
)
from vgen.models.linear import Linear

MODEL_TYPES = ("c2i", "t2i")
CAPTION_TOKENS = 120
"""LlamaGen-T2I's caption length: T5 features padded to 120 positions (its ``cls_token_num``)."""


@dataclass(frozen=True)
class GPTConfig(BackboneConfig):
    """LlamaGen ``ModelArgs`` (defaults: class-conditional GPT-B on 256x256 images): the shared backbone settings
    and ``block_size`` image tokens. ``frames`` (vgen's): a clip of that many square frames of
    ``block_size // frames`` tokens each instead of one image; ``rope`` (vgen's, clips only;
    :class:`~vgen.models.backbone.GridConfig`): ``"grid"`` rotates frames, rows and columns, ``"spatial"`` each
    frame's rows and columns, frames told apart by a learned per-frame embedding.

    ``model_type`` ``"c2i"`` conditions on a class (one prefix position); ``"t2i"`` on ``cls_token_num`` caption
    positions of ``caption_dim`` features (LlamaGen-T2I: 120 T5 positions of 2048). ``cls_token_num`` defaults to
    the model type's (1 or 120).

    ``prefix_rope`` (vgen's; :data:`~vgen.models.layers.PREFIX_ROPES`): how the condition positions turn in the
    rotary table. LlamaGen's ``"zero"`` scores every caption key 0 for every image query, and relative rotations
    among image tokens tell a token its row (how far back the image starts) but not its column, so a caption can
    say which row a thing goes in but hardly which column; ``"identity"`` puts the caption at the grid's origin,
    and a query's score against each caption word then depends on where the query is. LlamaGen's checkpoints
    take ``"zero"``."""

    block_size: int = size(256, at_most=GRID_LIMIT ** 2)
    frames: int = size(1, at_most=GRID_LIMIT)
    model_type: str = declare("c2i", choices=MODEL_TYPES)
    caption_dim: int = size(2048)
    cls_token_num: int | None = size(None, at_most=GRID_LIMIT)
    prefix_rope: str = declare("zero", choices=PREFIX_ROPES)
    rope: str = declare("grid", choices=ROPE_KINDS)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rope == "spatial" and self.frames == 1:
            raise ValueError("rope='spatial' encodes the frames of a clip: it needs frames > 1")
        if self.cls_token_num is None:
            object.__setattr__(self, "cls_token_num", 1 if self.model_type == "c2i" else CAPTION_TOKENS)
        if self.model_type == "c2i" and self.cls_token_num != 1:
            raise ValueError(f"a class-conditional (c2i) model has one class position: cls_token_num must be 1, "
                             f"got {self.cls_token_num!r}")
        if self.model_type == "t2i" and self.frames != 1:
            raise ValueError(f"a text-to-image (t2i) model generates one image: frames must be 1, got {self.frames}")
        per_frame, rest = divmod(self.block_size, self.frames)
        if rest or math.isqrt(per_frame) ** 2 != per_frame:
            raise ValueError(f"block_size {self.block_size} must be {self.frames} frame(s) of a square number of "
                             f"tokens (a grid)")
        check_rotary_pairs(self.grid, self.rope, self.head_dim)

    @property
    def grid_size(self) -> int:
        """Tokens per side of a frame (of the image)."""
        return math.isqrt(self.block_size // self.frames)

    @property
    def num_tokens(self) -> int:
        """Image tokens per sample (``grid_size ** 2``; times ``frames`` for a clip)."""
        return self.block_size

    @property
    def grid(self) -> tuple[int, ...]:
        """(rows, columns) of an image, (frames, rows, columns) of a clip."""
        side = (self.grid_size,) * 2
        return side if self.frames == 1 else (self.frames, *side)

    @property
    def text_conditional(self) -> bool:
        """Whether the model is conditioned on a caption (t2i) rather than a class."""
        return self.model_type == "t2i"

    def to_dict(self) -> dict:
        d = super().to_dict()
        if self.frames == 1:  # an image model's config stays LlamaGen's ModelArgs
            del d["frames"]
        if self.rope == "grid":
            del d["rope"]
        if self.model_type == "c2i":  # a class model's config holds the c2i fields only
            for key in ("model_type", "caption_dim", "cls_token_num"):
                del d[key]
        return d


GPT_SIZES: dict[str, dict] = {
    "GPT-B": dict(n_layer=12, n_head=12, dim=768),
    "GPT-L": dict(n_layer=24, n_head=16, dim=1024),
    "GPT-XL": dict(n_layer=36, n_head=20, dim=1280),
    "GPT-XXL": dict(n_layer=48, n_head=24, dim=1536),
    "GPT-XXXL": dict(n_layer=48, n_head=40, dim=2560),
    "GPT-1B": dict(n_layer=22, n_head=32, dim=2048),
    "GPT-3B": dict(n_layer=24, n_head=32, dim=3200),
    "GPT-7B": dict(n_layer=32, n_head=32, dim=4096),
}


def gpt_config(name: str, **overrides) -> GPTConfig:
    """A named LlamaGen size (``GPT-B`` ... ``GPT-3B``) with overrides such as ``block_size`` or ``vocab_size``."""
    if name not in GPT_SIZES:
        raise ValueError(f"unknown GPT model {name!r}; expected one of {list(GPT_SIZES)}")
    return GPTConfig(**{**GPT_SIZES[name], **overrides})


def single_query_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           mask: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of one query a row (q [B, H, 1, d]; ``mask``: bool, True = attend) as two fp32 products and a
    softmax: where :func:`single_query_products_pay`, a decode step's attention."""
    scores = (q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1) @ v.float()).to(q.dtype)


def single_query_products_pay(q: torch.Tensor) -> bool:
    """Whether one query's attention runs as :func:`single_query_attention` rather than through
    ``scaled_dot_product_attention``: on a CPU in bf16 or fp16, where the flash kernel costs about 3x for a single
    query (``benchmarks/decode_attention.py``: 167 against 54 us for 2 x 8 heads of 32 over 272 keys in bf16 on a
    2-core AMD EPYC), and in fp32 inside a compiled graph, which fuses the products with the step's other work; an
    eager fp32 step, and a window of 16 queries, is faster through the kernel."""
    return q.device.type == "cpu" and (q.dtype != torch.float32 or torch.compiler.is_compiling())


class Attention(nn.Module):
    def __init__(self, cfg: BackboneConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.kv_heads, cfg.head_dim
        self.wqkv = Linear(cfg.dim, (cfg.n_head + 2 * cfg.kv_heads) * cfg.head_dim, bias=False)
        self.wo = Linear(cfg.dim, cfg.dim, bias=False)
        self.attn_dropout_p = cfg.attn_dropout_p
        self.resid_dropout = nn.Dropout(cfg.resid_dropout_p)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, cache: KVCache | None, layer: int,
                slot: torch.Tensor | None = None, rows: RowSlots | None = None,
                mask: torch.Tensor | PrefixMask | None = None) -> torch.Tensor:
        """Without ``slot`` or ``rows``: causal attention over the cached keys (``cache.length`` of them) and the
        new ones. With ``slot`` (LongTensor [1], one new token): static shapes, see
        :meth:`LlamaGenGPT.decode_step`. With ``rows`` (:class:`~vgen.models.cache.RowSlots`): each row
        writes at its own positions, see :meth:`LlamaGenGPT.decode_rows`. ``mask`` (bool, True = attend,
        broadcasting to [B, heads, t, keys]) replaces the causal pattern of any of these modes, for backbones
        whose tokens do not see exactly their raster prefix (NAR's proximity mask); a
        :class:`~vgen.models.layers.PrefixMask` does so in query chunks that skip the keys no query of a chunk sees."""
        b, t, _ = x.shape
        nq, nkv, hd = self.n_head, self.n_kv_head, self.head_dim
        qkv = self.wqkv(x)
        # q and k are adjacent in wqkv's output: one elementwise rotation serves both (fewer ops per step)
        qk = apply_rope(self.normalize_qk(qkv[..., :(nq + nkv) * hd].view(b, t, nq + nkv, hd)), rope).transpose(1, 2)
        q, k = qk.split([nq, nkv], dim=1)
        v = qkv[..., (nq + nkv) * hd:].view(b, t, nkv, hd).transpose(1, 2)
        if cache is None:
            default, causal = None, True
        elif rows is not None:
            k, v = cache.write_rows(layer, k, v, rows)
            default, causal = rows.attend, False  # stale keys past a row's own slots are masked
        elif slot is not None:
            k, v = cache.write(layer, k, v, slot)
            default = (torch.arange(cache.max_len, device=x.device) <= slot)[None]  # [1, max_len]: slots 0..slot
            causal = False
        else:
            start = cache.length
            k, v = cache.append(layer, k, v)
            # query i sits at position start + i and sees every key up to it; one query sees the whole cache
            default = None if t == 1 else (torch.arange(start + t, device=x.device)[None, :]
                                           <= torch.arange(start, start + t, device=x.device)[:, None])
            causal = False
        if mask is None:
            mask = default
        else:
            causal = False
        if nkv != nq:
            k = k.repeat_interleave(nq // nkv, dim=1)
            v = v.repeat_interleave(nq // nkv, dim=1)
        if k.dtype != q.dtype:
            k, v = k.to(q.dtype), v.to(q.dtype)
        dropout_p = self.attn_dropout_p if self.training else 0.0
        if isinstance(mask, PrefixMask):
            out = mask.attention(q, k, v, dropout_p)
        elif t == 1 and dropout_p == 0.0 and single_query_products_pay(q):
            out = single_query_attention(q, k, v, mask)  # one query sees every key, so ``causal`` changes nothing
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, dropout_p=dropout_p)
        out = self.wo(out.transpose(1, 2).reshape(b, t, -1))
        return self.resid_dropout(out) if self.training else out


    def normalize_qk(self, qk: torch.Tensor) -> torch.Tensor:
        """The queries and keys [B, t, n_head + n_kv_head, head_dim] before rotation: unchanged (LlamaGen, Llama);
        :class:`QKNormAttention` normalises them."""
        return qk


QK_NORM_EPS = 1e-5
"""Chameleon's epsilon of its query and key norms (``ChameleonLayerNorm``, fixed whatever the config says)."""


class HeadNorm(nn.Module):
    """A LayerNorm over each head's ``head_dim`` channels with its own weight and bias per head ([heads, head_dim]):
    Chameleon's query and key norm (statistics over a head, affine per head)."""

    def __init__(self, heads: int, head_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(heads, head_dim))
        self.bias = nn.Parameter(torch.zeros(heads, head_dim))


class QKNormAttention(Attention):
    """:class:`Attention` with Chameleon's query-key norm: each query and key head layer-normalised over its
    channels (:class:`HeadNorm`, ``q_norm`` and ``k_norm``) before the rotation."""

    def __init__(self, cfg: BackboneConfig) -> None:
        super().__init__(cfg)
        self.q_norm = HeadNorm(cfg.n_head, cfg.head_dim)
        self.k_norm = HeadNorm(cfg.kv_heads, cfg.head_dim)

    def normalize_qk(self, qk: torch.Tensor) -> torch.Tensor:
        weight = torch.cat([self.q_norm.weight, self.k_norm.weight])
        bias = torch.cat([self.q_norm.bias, self.k_norm.bias])
        return F.layer_norm(qk, (self.head_dim,), eps=QK_NORM_EPS) * weight + bias


class TransformerBlock(nn.Module):
    def __init__(self, cfg: BackboneConfig) -> None:
        super().__init__()
        self.attention = Attention(cfg)
        self.feed_forward = FeedForward(cfg.dim, swiglu_hidden_dim(cfg.dim, cfg.multiple_of, cfg.ffn_dim_multiplier),
                                        cfg.ffn_dropout_p)
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, cache: KVCache | None, layer: int,
                slot: torch.Tensor | None = None, rows: RowSlots | None = None,
                mask: torch.Tensor | PrefixMask | None = None) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope, cache, layer, slot, rows, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class LabelEmbedder(nn.Module):
    """Class table with a null row (index ``num_classes``) used for unconditional / CFG branches."""

    def __init__(self, num_classes: int, dim: int, dropout_prob: float) -> None:
        super().__init__()
        self.num_classes, self.dropout_prob = num_classes, dropout_prob
        self.embedding_table = nn.Embedding(num_classes + 1, dim)

    def forward(self, class_ids: torch.Tensor) -> torch.Tensor:
        if self.training and self.dropout_prob > 0:
            drop = torch.rand(class_ids.shape, device=class_ids.device) < self.dropout_prob
            class_ids = torch.where(drop, torch.full_like(class_ids, self.num_classes), class_ids)
        return self.embedding_table(class_ids).unsqueeze(1)


class CaptionMLP(nn.Module):
    """LlamaGen's caption projection ``fc2(gelu_tanh(fc1 x))``, without biases."""

    def __init__(self, in_features: int, dim: int) -> None:
        super().__init__()
        self.fc1 = Linear(in_features, dim, bias=False)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class CaptionEmbedder(nn.Module):
    """Caption features [B, L, caption_dim] -> [B, L, dim], with LlamaGen-T2I's unconditional caption: the buffer
    ``uncond_embedding`` [L, caption_dim] stands in for the caption of the unconditional (CFG) rows and of the
    rows dropped in training."""

    def __init__(self, caption_dim: int, dim: int, num_tokens: int, dropout_prob: float) -> None:
        super().__init__()
        self.dropout_prob = dropout_prob
        self.cap_proj = CaptionMLP(caption_dim, dim)
        self.register_buffer("uncond_embedding", torch.randn(num_tokens, caption_dim) / caption_dim ** 0.5)

    def forward(self, caption: torch.Tensor) -> torch.Tensor:
        if self.training and self.dropout_prob > 0:
            drop = torch.rand(caption.shape[0], device=caption.device) < self.dropout_prob
            caption = torch.where(drop[:, None, None], self.uncond_embedding.to(caption.dtype), caption)
        return self.cap_proj(caption)


def prefix_attention(mask: torch.Tensor) -> torch.Tensor:
    """The attention mask [B, 1, L, L] (True = attend) of a left-padded prefix with key mask ``mask`` [B, L]:
    causal, the padded keys masked for every query but themselves (LlamaGen-T2I's ``generate``: the causal mask
    times the caption mask, the diagonal kept, so a padded query is not left without keys)."""
    n = mask.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool, device=mask.device).tril()
    eye = torch.eye(n, dtype=torch.bool, device=mask.device)
    return ((causal & mask[:, None, :]) | eye)[:, None]


class LlamaGenGPT(TokenGridModel, nn.Module):
    """LlamaGen transformer over a raster grid of ``block_size`` tokens, conditioned on a class (``c2i``: class
    ids [B]) or a caption (``t2i``: a :class:`~vgen.models.conditioning.PrefixCondition` of caption features
    [B, cls_token_num, caption_dim], left-padded)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        if config.text_conditional:
            self.cls_embedding = CaptionEmbedder(config.caption_dim, config.dim, config.cls_token_num,
                                                 config.class_dropout_prob)
        else:
            self.cls_embedding = LabelEmbedder(config.num_classes, config.dim, config.class_dropout_prob)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.tok_dropout = nn.Dropout(config.token_dropout_p)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = Linear(config.dim, config.vocab_size, bias=False)
        # a plain attribute, not a buffer: it must stay fp32 when the model is cast to bf16 (as in LlamaGen)
        if config.frames == 1:
            self.rope = rope_2d_table(config.grid_size, config.head_dim, config.rope_base, config.cls_token_num,
                                      config.prefix_rope)
        elif config.rope == "grid":
            self.rope = rope_grid_table(config.grid, config.head_dim, config.rope_base, prefix=config.prefix_rope)
        else:
            self.rope = rope_frames_table(config.grid, config.head_dim, config.rope_base)
            self.frame_embedding = nn.Embedding(config.frames, config.dim)
        self.apply(init_llamagen_weights)
        nn.init.zeros_(self.output.weight)
        if config.rope == "spatial":
            nn.init.zeros_(self.frame_embedding.weight)

    # -- the condition -----------------------------------------------------------------------------------------
    @property
    def text_conditional(self) -> bool:
        """Whether the model takes a caption (t2i) rather than class ids."""
        return self.config.text_conditional

    @property
    def prefix_len(self) -> int:
        """Positions before image token 0: 1 (the class) or ``cls_token_num`` (the caption)."""
        return self.config.cls_token_num

    def check_condition(self, cond: Condition) -> None:
        """Class ids for a c2i model (:class:`~vgen.models.conditioning.ClassConditional`); for a t2i model a
        :class:`~vgen.models.conditioning.PrefixCondition` of caption features [B, cls_token_num, caption_dim]."""
        c = self.config
        if not c.text_conditional:
            super().check_condition(cond)
            return
        if not isinstance(cond, PrefixCondition):
            raise ValueError("this LlamaGen model is text-to-image (t2i): give a prompt (caption embeddings with "
                             "their mask), not class ids")
        check_caption_features(cond, c.cls_token_num, c.caption_dim, ("cls_token_num", "caption_dim"), exact=True)

    def null_condition(self, cond: Condition) -> Condition:
        """The unconditional counterpart of ``cond`` for CFG: the null class, or (t2i) the ``uncond_embedding``
        caption in every row under the same mask (LlamaGen-T2I's ``generate``)."""
        if not self.config.text_conditional:
            return super().null_condition(cond)
        uncond = self.cls_embedding.uncond_embedding.to(cond.values.device, cond.values.dtype)
        return PrefixCondition(uncond.expand_as(cond.values), cond.mask)

    # -- forward passes ----------------------------------------------------------------------------------------
    def _embed(self, tokens: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Embeddings of image tokens [B, k] at sequence slots ``slots`` ([k], or [B, k] a row each), plus the
        per-frame embedding of a ``rope="spatial"`` clip model (slots past the last token count as its frame)."""
        h = self.tok_embeddings(tokens)
        if self.config.rope != "spatial":
            return h
        slots = slots.clamp(max=self.config.block_size)
        return h + frame_offsets(self.frame_embedding, slots, self.config.block_size // self.config.frames).to(h.dtype)

    def _run(self, h: torch.Tensor, start: int, cache: KVCache | None, return_hidden: bool = False,
             mask: torch.Tensor | None = None,
             last: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The blocks over ``h`` at positions ``start ...``; ``mask`` replaces the causal one (a caption's
        padding); ``last``: the output of the last position only."""
        if self.rope.device != h.device:
            self.rope = self.rope.to(h.device)
        rope = self.rope[start:start + h.shape[1]]
        if self.training:
            h = self.tok_dropout(h)
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, cache, i, mask=mask)
        if cache is not None:
            cache.advance(h.shape[1])
        h = self.norm(h[:, -1:] if last else h)
        logits = self.output(h).float()
        return (logits, h) if return_hidden else logits

    def _prefix(self, cond: Condition) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The condition's embeddings [B, prefix_len, dim] and (t2i) its key mask [B, prefix_len]."""
        if self.config.text_conditional:
            return self.cls_embedding(cond.values.to(self.output.weight.dtype)), cond.mask
        return self.cls_embedding(cond), None

    def forward(self, cond: Condition, tokens: torch.Tensor | None = None,
                return_hidden: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Full causal pass (training / reference): logits [B, 1 + n, V] for the condition's last position and
        the n image tokens; entry p predicts image token p. With ``return_hidden`` also the final normed hidden
        states [B, 1 + n, dim] (a draft head's features)."""
        h, key_mask = self._prefix(cond)
        if tokens is not None and tokens.shape[1]:
            slots = torch.arange(1, tokens.shape[1] + 1, device=tokens.device)
            h = torch.cat([h, self._embed(tokens, slots)], dim=1)
        if h.shape[1] > self.rope.shape[0]:
            raise ValueError(f"sequence of {h.shape[1]} positions exceeds {self.prefix_len} + block_size = "
                             f"{self.rope.shape[0]}")
        mask = None
        if key_mask is not None:
            mask = prefix_attention(torch.cat([key_mask, key_mask.new_ones(len(h), h.shape[1] - key_mask.shape[1])],
                                              dim=1))
        out = self._run(h, 0, None, return_hidden, mask)
        skip = self.prefix_len - 1
        if not skip:
            return out
        return (out[0][:, skip:], out[1][:, skip:]) if return_hidden else out[:, skip:]

    def new_cache(self, batch_size: int, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None, extra: int = 0) -> KVCache:
        """An empty cache with room for the condition's positions, every image token and ``extra`` more slots (a
        speculative window running past the last token)."""
        p = self.output.weight
        return KVCache(self.config.n_layer, batch_size, self.config.kv_heads,
                       self.prefix_len + self.config.block_size + extra, self.config.head_dim, dtype or p.dtype,
                       device or p.device)

    def prefill(self, cond: Condition, cache: KVCache,
                return_hidden: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Run the condition (the class position, or the caption with its padding masked and the mask kept in
        the cache for every later pass) into an empty cache; returns logits [B, V] for image token 0 (and, with
        ``return_hidden``, the condition's last final normed hidden state [B, 1, dim])."""
        if cache.length != 0:
            raise ValueError(f"prefill needs an empty cache, this one holds {cache.length} positions")
        cache.reserve(self.prefix_len)
        h, key_mask = self._prefix(cond)
        mask = None
        if key_mask is not None:
            cache.mask_keys(key_mask)
            mask = prefix_attention(key_mask)
        out = self._run(h, 0, cache, return_hidden, mask, last=True)
        return (out[0][:, -1], out[1]) if return_hidden else out[:, -1]

    def decode(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Append image tokens [B, k] after the cached ones; logits [B, k, V], row i predicting the next token."""
        start = cache.reserve(tokens.shape[1])
        mask = None
        if cache.key_mask is not None:
            t = tokens.shape[1]
            causal = None if t == 1 else (torch.arange(start + t, device=tokens.device)[None, :]
                                          <= torch.arange(start, start + t, device=tokens.device)[:, None])
            mask = cache.attendable(causal, start + t)
        slots = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        return self._run(self._embed(tokens, slots), start, cache, mask=mask)

    def decode_rows(self, tokens: torch.Tensor, starts: torch.Tensor, cache: KVCache, return_hidden: bool = False,
                    static: bool = False, image_end: int | None = None,
                    tree: DraftTree | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Image tokens [B, k], row b's the image tokens ``starts[b] - 1 ...``; logits [B, k, V] (and, with
        ``return_hidden``, the final normed hidden states [B, k, dim]). ``static``: attention over the whole cache
        under a mask and no device sync (:meth:`KVCache.row_slots`), one shape for a compiled verify pass; with
        ``image_end`` (at least ``max(starts) + k``), only over the slots up to that image token.

        Rows advance independently, which is what batched speculative decoding needs: row b's cache is valid up
        to its slot of image token ``starts[b] - 1`` and the caller, not ``cache.length``, keeps track of it.
        Image token i sits at slot ``prefix_len + i`` (slot s holds image token s - 1 after a class), so
        ``starts`` is that slot for a class model and the model shifts it past a caption. Slots past the last
        image token (a window running off the end) reuse the last rotary position; their outputs are meaningless
        and only need room in the cache (``new_cache(extra=)``).

        ``tree`` (a :class:`~vgen.models.cache.DraftTree` of k nodes, node 0 the token ``starts - 1``):
        ``tokens[:, i]`` is node i, written at slot ``starts + i`` as ever but rotated and embedded as image token
        ``starts - 1 + depth[i]``, seeing the row's keys before ``starts`` and its ancestors'; its logits are those
        of its root path decoded alone. ``image_end`` still bounds the slots (``max(starts) + k``), not the depths;
        :meth:`tree_root_slots` and :meth:`KVCache.move_slots` then move the accepted path into place.
        """
        shift = self.prefix_len - 1
        span = None if image_end is None else image_end + shift
        rows = cache.row_slots(starts + shift if shift else starts, tokens.shape[1], static, span, tree)
        if self.rope.device != tokens.device:
            self.rope = self.rope.to(tokens.device)
        positions = rows.position_ids
        rope = self.rope[positions.clamp(max=self.rope.shape[0] - 1)]
        mask = cache.attendable(rows.attend, rows.end)
        h = self._embed(tokens, positions)
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, cache, i, rows=rows, mask=mask)
        h = self.norm(h)
        logits = self.output(h).float()
        return (logits, h) if return_hidden else logits

    def tree_root_slots(self, starts: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """The cache slots [B] where :meth:`decode_rows` writes the first token of a window from ``starts`` [B]
        (past a caption, ``starts`` shifted): where a tree pass's node i sits at ``+ i``, and its path belongs at
        ``+ depth`` (:meth:`KVCache.move_slots`)."""
        return starts + (self.prefix_len - 1)

    def decode_step(self, tokens: torch.Tensor, slot: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One image token per row [B, 1], image token ``slot - 1`` (LongTensor [1], counted as in
        :meth:`decode_rows`); logits [B, V].

        The static-shape twin of ``decode(tokens, cache)[:, -1]`` for ``torch.compile`` with CUDA graphs: the
        position is a tensor and attention spans the whole preallocated cache under a mask, so one graph serves
        every position. It neither reads nor moves ``cache.length``: the caller keeps ``slot`` at the next image
        token (``slot == cache.length`` after a class) and calls ``cache.advance(1)`` afterwards. Equal to
        :meth:`decode` up to float rounding (the reductions also run over masked slots); the rope table must
        already be on the device (:meth:`prefill` moves it).
        """
        if self.prefix_len > 1:
            slot = slot + (self.prefix_len - 1)
        h = self._embed(tokens, slot)
        mask = None
        if cache.key_mask is not None:
            mask = cache.attendable((torch.arange(cache.max_len, device=tokens.device) <= slot)[None],
                                    cache.max_len)
        rope = self.rope.index_select(0, slot)
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, cache, i, slot, mask=mask)
        return self.output(self.norm(h[:, -1])).float()


@torch.no_grad()
def teacher_forced_logits(model: nn.Module, cond: Condition, tokens: torch.Tensor) -> torch.Tensor:
    """Logits [B, n, V] of a next-token backbone (LlamaGen, Janus: ``new_cache``, ``prefill``, ``decode``) for the
    tokens [B, n] under ``cond``: entry ``[b, i]`` is the distribution of token ``i`` given ``tokens[b, :i]``, what
    a one-token-per-pass sampler computes at step ``i`` (the prefill gives token 0's, one decode of the first
    ``n - 1`` tokens the others')."""
    cache = model.new_cache(len(tokens))
    first = model.prefill(cond, cache)[:, None]
    if tokens.shape[1] == 1:
        return first
    return torch.cat([first, model.decode(tokens[:, :-1], cache)], dim=1)


def llamagen_checkpoint_kind(state: dict[str, torch.Tensor]) -> str | None:
    """Which LlamaGen GPT a state dict holds, by its condition embedder: ``"t2i"`` (a caption projection,
    ``cls_embedding.cap_proj``), ``"c2i"`` (a class table, ``cls_embedding.embedding_table``), or None (neither)."""
    if any(k.startswith("cls_embedding.cap_proj.") for k in state):
        return "t2i"
    return "c2i" if "cls_embedding.embedding_table.weight" in state else None


def llamagen_config_for(gpt_model: str, image_size: int, downsample: int = 16, vocab_size: int = 16384,
                        num_classes: int = 1000) -> GPTConfig:
    """The config LlamaGen's sample script builds for ``--gpt-model --image-size`` (e.g. GPT-B at 256 -> 16x16)."""
    return replace(gpt_config(gpt_model), block_size=_block_size(image_size, downsample), vocab_size=vocab_size,
                   num_classes=num_classes)


def llamagen_t2i_config_for(image_size: int, gpt_model: str = "GPT-XL", downsample: int = 16,
                            vocab_size: int = 16384, caption_dim: int = 2048,
                            cls_token_num: int = CAPTION_TOKENS) -> GPTConfig:
    """The config LlamaGen's ``sample_t2i.py`` builds (``--gpt-type t2i``, defaults GPT-XL, 120 caption positions
    of FLAN-T5-XL's 2048 features, VQ-16): 256 -> 16x16 tokens (``t2i_XL_stage1_256.pt``), 512 -> 32x32
    (``t2i_XL_stage2_512.pt``)."""
    return replace(gpt_config(gpt_model), block_size=_block_size(image_size, downsample), vocab_size=vocab_size,
                   model_type="t2i", caption_dim=caption_dim, cls_token_num=cls_token_num)


LLAMAGEN_T2I_CHECKPOINTS: dict[str, int] = {"t2i_XL_stage1_256.pt": 256, "t2i_XL_stage2_512.pt": 512}
"""LlamaGen's released text-to-image GPT-XL checkpoints and the image size each generates
(:func:`llamagen_t2i_config_for`); both decode with ``vq_ds16_t2i.pt``."""


def _block_size(image_size: int, downsample: int) -> int:
    if image_size % downsample:
        raise ValueError(f"image size {image_size} is not divisible by the tokenizer's downsampling {downsample}")
    return (image_size // downsample) ** 2
