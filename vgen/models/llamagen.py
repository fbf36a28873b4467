"""Class-conditional LlamaGen GPT with a croppable KV cache and multi-token decoding.

Parameter names, shapes and numerics match LlamaGen's ``autoregressive/models/gpt.py`` (c2i), so its released
checkpoints load strictly: SwiGLU MLPs, RMSNorm in fp32 (eps 1e-5), 2-D RoPE with interleaved pairs and zero
rotation at the class position, and a class table with one extra (null) row for classifier-free guidance.

Sequence layout: position 0 holds the class embedding, position 1 + i holds image token i (raster order), and the
output at position p predicts image token p. :meth:`prefill` runs the class position; :meth:`decode` appends any
number of image tokens at once and returns one distribution per token, which is what speculative verification
needs; ``cache.crop(n)`` rolls back.

``GPTConfig.frames > 1`` (vgen's addition, not in LlamaGen) makes the same model a next-token video AR: image token
i becomes token i of a clip's frames in raster order (frame by frame, each frame row by row), laid on a
(frames, rows, columns) grid with 3-D RoPE. Everything else, sampling and speculative decoding included, is
unchanged; LlamaGen's own configs have one frame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from vgen.models.backbone import BackboneConfig
from vgen.models.cache import KVCache, RowSlots
from vgen.models.conditioning import TokenGridModel, init_llamagen_weights
from vgen.models.layers import (
    FeedForward,
    PrefixMask,
    RMSNorm,
    apply_rope,
    rope_2d_table,
    rope_grid_table,
    swiglu_hidden_dim,
)


@dataclass(frozen=True)
class GPTConfig(BackboneConfig):
    """LlamaGen ``ModelArgs`` for class-conditional generation (defaults: GPT-B on 256x256 images): the shared
    backbone settings and ``block_size`` image tokens. ``frames`` (vgen's): a clip of that many square frames of
    ``block_size // frames`` tokens each instead of one image."""

    block_size: int = 256
    frames: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.frames, bool) or not isinstance(self.frames, int) or self.frames < 1:
            raise ValueError(f"frames must be an integer >= 1, got {self.frames!r}")
        per_frame, rest = divmod(self.block_size, self.frames)
        if rest or math.isqrt(per_frame) ** 2 != per_frame:
            raise ValueError(f"block_size {self.block_size} must be {self.frames} frame(s) of a square number of "
                             f"tokens (a grid)")

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

    def to_dict(self) -> dict:
        d = super().to_dict()
        if self.frames == 1:  # an image model's config stays LlamaGen's ModelArgs
            del d["frames"]
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


class Attention(nn.Module):
    def __init__(self, cfg: BackboneConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.kv_heads, cfg.head_dim
        self.wqkv = nn.Linear(cfg.dim, (cfg.n_head + 2 * cfg.kv_heads) * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)
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
        qk = apply_rope(qkv[..., :(nq + nkv) * hd].view(b, t, nq + nkv, hd), rope).transpose(1, 2)
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
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, dropout_p=dropout_p)
        out = self.wo(out.transpose(1, 2).reshape(b, t, -1))
        return self.resid_dropout(out) if self.training else out


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


class LlamaGenGPT(TokenGridModel, nn.Module):
    """LlamaGen class-conditional transformer over a raster grid of ``block_size`` tokens."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.cls_embedding = LabelEmbedder(config.num_classes, config.dim, config.class_dropout_prob)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.tok_dropout = nn.Dropout(config.token_dropout_p)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        # a plain attribute, not a buffer: it must stay fp32 when the model is cast to bf16 (as in LlamaGen)
        self.rope = (rope_2d_table(config.grid_size, config.head_dim, config.rope_base) if config.frames == 1
                     else rope_grid_table(config.grid, config.head_dim, config.rope_base))
        self.apply(init_llamagen_weights)
        nn.init.zeros_(self.output.weight)

    # -- forward passes ----------------------------------------------------------------------------------------
    def _run(self, h: torch.Tensor, start: int, cache: KVCache | None,
             return_hidden: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if self.rope.device != h.device:
            self.rope = self.rope.to(h.device)
        rope = self.rope[start:start + h.shape[1]]
        if self.training:
            h = self.tok_dropout(h)
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, cache, i)
        if cache is not None:
            cache.advance(h.shape[1])
        h = self.norm(h)
        logits = self.output(h).float()
        return (logits, h) if return_hidden else logits

    def forward(self, class_ids: torch.Tensor, tokens: torch.Tensor | None = None,
                return_hidden: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Full causal pass (training / reference): logits [B, 1 + n, V]; position p predicts image token p.
        With ``return_hidden`` also the final normed hidden states [B, 1 + n, dim] (a draft head's features)."""
        h = self.cls_embedding(class_ids)
        if tokens is not None and tokens.shape[1]:
            h = torch.cat([h, self.tok_embeddings(tokens)], dim=1)
        if h.shape[1] > self.rope.shape[0]:
            raise ValueError(f"sequence of {h.shape[1]} positions exceeds 1 + block_size = {self.rope.shape[0]}")
        return self._run(h, 0, None, return_hidden)

    def new_cache(self, batch_size: int, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None, extra: int = 0) -> KVCache:
        """An empty cache with room for the class position, every image token and ``extra`` more slots (a
        speculative window running past the last token)."""
        p = self.output.weight
        return KVCache(self.config.n_layer, batch_size, self.config.kv_heads, 1 + self.config.block_size + extra,
                       self.config.head_dim, dtype or p.dtype, device or p.device)

    def prefill(self, class_ids: torch.Tensor, cache: KVCache,
                return_hidden: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Run the class position into an empty cache; returns logits [B, V] for image token 0 (and, with
        ``return_hidden``, the class position's final normed hidden state [B, 1, dim])."""
        if cache.length != 0:
            raise ValueError(f"prefill needs an empty cache, this one holds {cache.length} positions")
        cache.reserve(1)
        out = self._run(self.cls_embedding(class_ids), 0, cache, return_hidden)
        return (out[0][:, -1], out[1]) if return_hidden else out[:, -1]

    def decode(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Append image tokens [B, k] after the cached ones; logits [B, k, V], row i predicting the next token."""
        start = cache.reserve(tokens.shape[1])
        return self._run(self.tok_embeddings(tokens), start, cache)

    def decode_rows(self, tokens: torch.Tensor, starts: torch.Tensor, cache: KVCache,
                    return_hidden: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Image tokens [B, k] written at cache slots ``starts[b] ... starts[b] + k - 1`` of each row b; logits
        [B, k, V] (and, with ``return_hidden``, the final normed hidden states [B, k, dim]).

        Rows advance independently, which is what batched speculative decoding needs: row b's cache is valid up
        to slot ``starts[b]`` and the caller, not ``cache.length``, keeps track of it (slot s holds image token
        s - 1; slot 0 the class). Slots past the last image token (a window running off the end) reuse the last
        rotary position; their outputs are meaningless and only need room in the cache (``new_cache(extra=)``).
        """
        rows = cache.row_slots(starts, tokens.shape[1])
        if self.rope.device != tokens.device:
            self.rope = self.rope.to(tokens.device)
        rope = self.rope[rows.slots.clamp(max=self.rope.shape[0] - 1)]
        h = self.tok_embeddings(tokens)
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, cache, i, rows=rows)
        h = self.norm(h)
        logits = self.output(h).float()
        return (logits, h) if return_hidden else logits

    def decode_step(self, tokens: torch.Tensor, slot: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One image token per row [B, 1] written at cache position ``slot`` (LongTensor [1]); logits [B, V].

        The static-shape twin of ``decode(tokens, cache)[:, -1]`` for ``torch.compile`` with CUDA graphs: the
        position is a tensor and attention spans the whole preallocated cache under a mask, so one graph serves
        every position. It neither reads nor moves ``cache.length``: the caller keeps ``slot == cache.length``
        and calls ``cache.advance(1)`` afterwards. Equal to :meth:`decode` up to float rounding (the reductions
        also run over masked slots); the rope table must already be on the device (:meth:`prefill` moves it).
        """
        h = self.tok_embeddings(tokens)
        rope = self.rope.index_select(0, slot)
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, cache, i, slot)
        return self.output(self.norm(h[:, -1])).float()


def llamagen_config_for(gpt_model: str, image_size: int, downsample: int = 16, vocab_size: int = 16384,
                        num_classes: int = 1000) -> GPTConfig:
    """The config LlamaGen's sample script builds for ``--gpt-model --image-size`` (e.g. GPT-B at 256 -> 16x16)."""
    if image_size % downsample:
        raise ValueError(f"image size {image_size} is not divisible by the tokenizer's downsampling {downsample}")
    return replace(gpt_config(gpt_model), block_size=(image_size // downsample) ** 2, vocab_size=vocab_size,
                   num_classes=num_classes)
