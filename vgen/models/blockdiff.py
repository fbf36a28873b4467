"""A class-conditional block-diffusion video transformer: diffusion inside a block of frames, autoregression across
blocks through a key/value cache (the model family that Inferix serves: CausVid, Self-Forcing, MAGI-1).

Tokens. Frames (pixels in [-1, 1], [B, T, S, S, 3]) are cut into ``patch_size`` patches: ``(S / p)**2`` tokens per
frame, ``frames_per_block`` frames per block. Every token carries its block's noise level and the class through
adaptive layer norm (DiT's adaLN-Zero), so each block can sit at its own noise level (diffusion forcing).

Attention is block-causal: a token sees every token of its own block and of the blocks before it. Rotary
positions run over (frame, row, column). The frame coordinate is the frame's place in the *attended sequence*, not
its absolute index: keys are cached before rotation and rotated when they are read (:meth:`prepare_context`,
once per block), so a rolling cache that drops old frames keeps its positions inside ``[0, train_frames)``, the
range the model was trained on (StreamingLLM assigns positions inside the cache the same way).

Flow matching (the Wan / Self-Forcing parameterisation): ``x_s = (1 - s) x_0 + s e`` for noise level ``s`` in
[0, 1], and the network predicts the velocity ``v = e - x_0``, so ``x_0 = x_s - s v``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from vgen.models.backbone import GRID_LIMIT
from vgen.models.conditioning import ClassConditional
from vgen.models.config_fields import ModelConfig, declare, probability, size
from vgen.models.layers import FeedForward, RMSNorm, apply_rope, rope_grid_table, swiglu_hidden_dim
from vgen.models.linear import Linear

KV = tuple[torch.Tensor, torch.Tensor]  # keys and values of one layer, [B, heads, tokens, head_dim]


@dataclass
class BlockContext:
    """What a block attends to before itself: per layer, keys rotated at frame positions ``0 .. frames - 1`` and
    values, over ``frames`` frames (see :meth:`BlockDiffusionTransformer.prepare_context`). Each layer's tensors
    are one block longer than the context: a block's forward writes its own keys/values into that tail and
    attends to the whole buffer, so the denoising steps of a block never concatenate the context afresh."""

    kvs: list[KV]
    frames: int

    def rows(self, n: int) -> BlockContext:
        """The context of the first ``n`` batch rows (views: a forward on them writes into these buffers)."""
        return BlockContext([(k[:n], v[:n]) for k, v in self.kvs], self.frames)


@dataclass(frozen=True)
class BlockDiffConfig(ModelConfig):
    """Frame geometry, block length, the number of frames trained on (the longest attended sequence) and the
    transformer's size."""

    frame_size: int = size(32, at_most=GRID_LIMIT)
    channels: int = size(3)
    patch_size: int = size(4, at_most=GRID_LIMIT)
    frames_per_block: int = size(2, at_most=GRID_LIMIT)
    train_frames: int = size(16, at_most=GRID_LIMIT)
    dim: int = size(192)
    n_layer: int = size(4)
    n_head: int = size(6)
    multiple_of: int = size(64)
    num_classes: int = size(8)
    class_dropout_prob: float = probability(0.1)
    rope_base: float = declare(10000.0, above=0)
    norm_eps: float = declare(1e-5, above=0, below=1)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.frame_size % self.patch_size:
            raise ValueError(f"frame_size {self.frame_size} is not a multiple of patch_size {self.patch_size}")
        if self.train_frames % self.frames_per_block:
            raise ValueError(f"train_frames {self.train_frames} must be a multiple of frames_per_block "
                             f"{self.frames_per_block}")
        if self.dim % self.n_head or (self.dim // self.n_head) % 2 or self.dim // self.n_head < 6:
            raise ValueError(f"dim {self.dim} / n_head {self.n_head} must give an even head_dim >= 6 "
                             f"(three rotary axes)")

    @property
    def grid_side(self) -> int:
        return self.frame_size // self.patch_size

    @property
    def tokens_per_frame(self) -> int:
        return self.grid_side ** 2

    @property
    def tokens_per_block(self) -> int:
        return self.frames_per_block * self.tokens_per_frame

    @property
    def patch_dim(self) -> int:
        return self.patch_size ** 2 * self.channels

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head


def block_causal_frame_mask(num_frames: int, frames_per_block: int, tokens_per_frame: int,
                            device: torch.device | str = "cpu") -> torch.Tensor:
    """Bool [N, N] (True = attend) over ``num_frames`` frames of tokens: token i sees token j iff j's block is not
    after i's."""
    block = torch.arange(num_frames * tokens_per_frame, device=device) // (frames_per_block * tokens_per_frame)
    return block[None, :] <= block[:, None]


def timestep_embedding(sigma: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal features of ``1000 * sigma`` (any shape) -> [..., dim], as DiT embeds diffusion timesteps."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=sigma.device, dtype=torch.float32) / half)
    args = 1000.0 * sigma.float()[..., None] * freqs
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class Attention(nn.Module):
    """Multi-head attention whose new keys/values are returned unrotated (for the cache), after an optional
    context of already rotated keys."""

    def __init__(self, cfg: BlockDiffConfig) -> None:
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.wqkv = Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.wo = Linear(cfg.dim, cfg.dim, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, context: KV | None,
                mask: torch.Tensor | None) -> tuple[torch.Tensor, KV]:
        """``x`` [B, t, dim] attends to ``context`` and to itself under ``mask`` ([t, c + t] or None for full
        attention); ``rope`` [t, D/2, 2] rotates its queries and keys. ``context`` is [B, H, c + t, D] keys
        (rotated) and values whose last ``t`` rows this call overwrites with its own. Returns the output and this
        layer's new (k, v), keys unrotated."""
        q, k, v = rearrange(self.wqkv(x), "b t (three h d) -> three b h t d", three=3, h=self.n_head)
        q, k = self.q_norm(q), self.k_norm(k)  # QK-norm keeps the logits of a tiny model in range
        new_kv = (k, v)
        q, k = (apply_rope(y.transpose(1, 2), rope).transpose(1, 2) for y in (q, k))
        if context is not None:
            t = x.shape[1]
            context[0][:, :, -t:], context[1][:, :, -t:] = k, v
            k, v = context
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(rearrange(out, "b h t d -> b t (h d)")), new_kv


def per_token(rows: torch.Tensor, tokens_per_block: int) -> torch.Tensor:
    """Per-block rows [B, blocks, D] -> per-token [B, blocks * tokens_per_block, D]; one block stays [B, 1, D],
    which broadcasts over its tokens without a copy."""
    return rows if rows.shape[1] == 1 else rows.repeat_interleave(tokens_per_block, dim=1)


class DiTBlock(nn.Module):
    """Pre-norm attention + SwiGLU with adaLN-Zero modulation (shift, scale, gate for each half). The modulation
    is computed once per block, whose tokens share their noise level and class, and then spread over the tokens:
    per token it cost a third of the layer's multiply-adds."""

    def __init__(self, cfg: BlockDiffConfig) -> None:
        super().__init__()
        self.tokens_per_block = cfg.tokens_per_block
        self.norm1 = nn.LayerNorm(cfg.dim, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(cfg)
        self.norm2 = nn.LayerNorm(cfg.dim, elementwise_affine=False, eps=1e-6)
        self.mlp = FeedForward(cfg.dim, swiglu_hidden_dim(cfg.dim, cfg.multiple_of))
        self.modulation = Linear(cfg.dim, 6 * cfg.dim)

    def forward(self, x: torch.Tensor, cond: torch.Tensor, rope: torch.Tensor, context: KV | None,
                mask: torch.Tensor | None) -> tuple[torch.Tensor, KV]:
        """``cond`` is per block, [B, blocks, dim]."""
        modulation = per_token(self.modulation(F.silu(cond)), self.tokens_per_block)
        shift1, scale1, gate1, shift2, scale2, gate2 = modulation.chunk(6, dim=-1)
        h, kv = self.attn(torch.addcmul(shift1, self.norm1(x), 1 + scale1), rope, context, mask)
        x = torch.addcmul(x, gate1, h)
        x = torch.addcmul(x, gate2, self.mlp(torch.addcmul(shift2, self.norm2(x), 1 + scale2)))
        return x, kv


class BlockDiffusionTransformer(ClassConditional, nn.Module):
    """Velocity prediction for video blocks at per-block noise levels, block-causal across blocks."""

    def __init__(self, config: BlockDiffConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.patch_embed = Linear(c.patch_dim, c.dim)
        self.class_embedding = nn.Embedding(c.num_classes + 1, c.dim)  # the last row is the null class (CFG)
        self.time_mlp = nn.Sequential(Linear(c.dim, c.dim), nn.SiLU(), Linear(c.dim, c.dim))
        self.layers = nn.ModuleList(DiTBlock(c) for _ in range(c.n_layer))
        self.final_norm = nn.LayerNorm(c.dim, elementwise_affine=False, eps=1e-6)
        self.final_modulation = Linear(c.dim, 2 * c.dim)
        self.output = Linear(c.dim, c.patch_dim)
        # a plain attribute, not a buffer: the rotary table stays fp32 when the model is cast
        self.rope = rope_grid_table((c.train_frames, c.grid_side, c.grid_side), c.head_dim, c.rope_base,
                                    num_prefix=0)
        self.apply(self._init_weights)
        for layer in self.layers:  # adaLN-Zero: every residual branch starts closed
            nn.init.zeros_(layer.modulation.weight)
            nn.init.zeros_(layer.modulation.bias)
        for m in (self.final_modulation, self.output):
            nn.init.zeros_(m.weight)
            nn.init.zeros_(m.bias)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            # unit scale, like the timestep embedding it is added to: at DiT's 0.02 the class was drowned by the
            # noise level (norm ~0.3 against ~14), and a 4,000-step run learned to ignore it
            nn.init.normal_(m.weight, std=1.0)

    @property
    def frames_per_block(self) -> int:
        return self.config.frames_per_block

    # -- patches -----------------------------------------------------------------------------------------------
    def patchify(self, frames: torch.Tensor) -> torch.Tensor:
        """[B, T, S, S, C] -> [B, T * tokens_per_frame, patch_dim] in (frame, row, column) raster order."""
        p = self.config.patch_size
        return rearrange(frames, "b t (h p) (w q) c -> b (t h w) (p q c)", p=p, q=p)

    def unpatchify(self, tokens: torch.Tensor, num_frames: int) -> torch.Tensor:
        g, p = self.config.grid_side, self.config.patch_size
        return rearrange(tokens, "b (t h w) (p q c) -> b t (h p) (w q) c", t=num_frames, h=g, w=g, p=p, q=p)

    # -- forward -----------------------------------------------------------------------------------------------
    def _condition(self, sigma: torch.Tensor, class_ids: torch.Tensor) -> torch.Tensor:
        """Per-block conditioning [B, blocks, dim]: the block's noise level (``sigma`` [B, blocks]) plus the class
        (``class_ids`` [B], or [B, blocks] for a class per block)."""
        c = self.config
        t_emb = self.time_mlp(timestep_embedding(sigma, c.dim).to(self.patch_embed.weight.dtype))
        cls = self.class_embedding(class_ids)
        return t_emb + (cls[:, None] if cls.ndim == 2 else cls)

    def _check(self, frames: torch.Tensor, class_ids: torch.Tensor) -> None:
        c = self.config
        shape = (c.frame_size, c.frame_size, c.channels)
        if frames.ndim != 5 or tuple(frames.shape[2:]) != shape:
            raise ValueError(f"frames must be [batch, frames, {c.frame_size}, {c.frame_size}, {c.channels}], "
                             f"got {tuple(frames.shape)}")
        if class_ids.shape[:1] != frames.shape[:1] or class_ids.ndim > 2:
            raise ValueError(f"class_ids must be [batch] or [batch, blocks], got {tuple(class_ids.shape)}")
        if int(class_ids.min()) < 0 or int(class_ids.max()) > c.num_classes:
            raise ValueError(f"class ids must be in [0, {c.num_classes}] ({c.num_classes} = null), "
                             f"got {class_ids.tolist()}")

    def forward(self, frames: torch.Tensor, sigma: torch.Tensor, class_ids: torch.Tensor) -> torch.Tensor:
        """Whole-clip pass (training, and the reference for cached generation): noisy ``frames`` [B, T, S, S, C]
        with one noise level per block (``sigma`` [B, T / frames_per_block]) -> velocity, same shape as frames.
        Class ids equal to ``num_classes`` are the null class; in training mode ``class_dropout_prob`` of the
        rows are replaced by it."""
        c = self.config
        self._check(frames, class_ids)
        t = frames.shape[1]
        if sigma.shape != (frames.shape[0], t // c.frames_per_block):
            raise ValueError(f"sigma must be [batch, blocks] = {(frames.shape[0], t // c.frames_per_block)}, "
                             f"got {tuple(sigma.shape)}")
        if self.training and c.class_dropout_prob > 0:
            drop = torch.rand(class_ids.shape, device=class_ids.device) < c.class_dropout_prob
            class_ids = torch.where(drop, self.null_condition(class_ids), class_ids)
        out, _ = self._whole_clip(frames, sigma, class_ids)
        return self.unpatchify(out, t)

    def _whole_clip(self, frames: torch.Tensor, sigma: torch.Tensor,
                    class_ids: torch.Tensor) -> tuple[torch.Tensor, list[KV]]:
        """Every block of ``frames`` at once under the block-causal mask, from frame position 0."""
        c, t = self.config, frames.shape[1]
        if t % c.frames_per_block or not 0 < t <= c.train_frames:
            raise ValueError(f"a whole-clip pass takes a multiple of {c.frames_per_block} frames up to "
                             f"{c.train_frames}, got {t}")
        mask = block_causal_frame_mask(t, c.frames_per_block, c.tokens_per_frame, frames.device)
        return self._run(self.patchify(frames), self._condition(sigma, class_ids), self._rope(0, t), None, mask)

    def _rope(self, first_frame: int, num_frames: int) -> torch.Tensor:
        """Rotary rows of frames ``first_frame .. first_frame + num_frames - 1``."""
        per = self.config.tokens_per_frame
        device = self.patch_embed.weight.device
        return self.rope[first_frame * per:(first_frame + num_frames) * per].to(device)

    def prepare_context(self, kvs: list[KV] | None, frames: int) -> BlockContext | None:
        """Cached (unrotated) keys/values of ``frames`` frames -> a :class:`BlockContext` with the keys rotated at
        frame positions ``0 .. frames - 1``, in buffers with room for one block after them (None when there is
        nothing to attend to)."""
        if kvs is None or frames == 0:
            if kvs is not None or frames:
                raise ValueError("context keys/values and a frame count must be given together")
            return None
        c = self.config
        if frames + c.frames_per_block > c.train_frames:
            raise ValueError(f"{frames} context frames + a block of {c.frames_per_block} exceed the "
                             f"{c.train_frames} frames the model was trained on")
        rope = self._rope(0, frames)
        buffers = []
        for k, v in kvs:
            b, h, n, d = k.shape
            keys, values = k.new_empty(b, h, n + c.tokens_per_block, d), v.new_empty(b, h, n + c.tokens_per_block, d)
            keys[:, :, :n] = apply_rope(k.transpose(1, 2), rope).transpose(1, 2)
            values[:, :, :n] = v
            buffers.append((keys, values))
        return BlockContext(buffers, frames)

    def clean_context(self, frames: torch.Tensor, class_ids: torch.Tensor) -> list[KV]:
        """Unrotated (k, v) per layer of clean ``frames`` [B, T, S, S, C] (whole blocks, frame positions from 0)
        under the block-causal mask: what a cache holds after generating them, computed afresh."""
        self._check(frames, class_ids)
        sigma = torch.zeros(len(frames), max(1, frames.shape[1] // self.config.frames_per_block),
                            device=frames.device)
        return self._whole_clip(frames, sigma, class_ids)[1]

    def forward_block(self, frames: torch.Tensor, sigma: torch.Tensor, class_ids: torch.Tensor,
                      context: BlockContext | None) -> tuple[torch.Tensor, list[KV]]:
        """One block (``frames`` [B, frames_per_block, S, S, C] at noise level ``sigma`` [B]) after ``context``
        (from :meth:`prepare_context`; None at the start).

        Returns the velocity and the block's unrotated (k, v) per layer, which a cache stores after the clean
        (``sigma = 0``) pass. The block takes the frame positions right after its context."""
        c = self.config
        self._check(frames, class_ids)
        if frames.shape[1] != c.frames_per_block:
            raise ValueError(f"a block has {c.frames_per_block} frames, got {frames.shape[1]}")
        start = 0 if context is None else context.frames
        cond = self._condition(sigma[:, None], class_ids)
        out, kvs = self._run(self.patchify(frames), cond, self._rope(start, c.frames_per_block),
                             None if context is None else context.kvs, None)
        return self.unpatchify(out, c.frames_per_block), kvs

    def _run(self, tokens: torch.Tensor, cond: torch.Tensor, rope: torch.Tensor, context: list[KV] | None,
             mask: torch.Tensor | None) -> tuple[torch.Tensor, list[KV]]:
        h = self.patch_embed(tokens.to(self.patch_embed.weight.dtype))
        kvs = []
        for i, layer in enumerate(self.layers):
            h, kv = layer(h, cond, rope, context[i] if context is not None else None, mask)
            kvs.append(kv)
        shift, scale = per_token(self.final_modulation(F.silu(cond)), self.config.tokens_per_block).chunk(2, dim=-1)
        return self.output(torch.addcmul(shift, self.final_norm(h), 1 + scale)).float(), kvs
