"""A block-diffusion video transformer conditioned on a class or on a caption: diffusion inside a block of frames,
autoregression across blocks through a key/value cache (the model family that Inferix serves: CausVid,
Self-Forcing, MAGI-1).

Tokens. Frames (pixels in [-1, 1], [B, T, S, S, 3]) are cut into ``patch_size`` patches: ``(S / p)**2`` tokens per
frame, ``frames_per_block`` frames per block. Every token carries its block's noise level and the condition through
adaptive layer norm (DiT's adaLN-Zero), so each block can sit at its own noise level (diffusion forcing).

Conditions. A class model (``text_dim = 0``) takes class ids. A text model (``text_dim > 0``) takes a caption, a
:class:`~vgen.models.conditioning.PrefixCondition` of features [B, L <= text_tokens, text_dim] (a
:class:`~vgen.models.word_encoder.WordTextEncoder`'s): its masked mean, projected, goes where the class row goes
(the adaLN condition), and every layer's frame tokens cross-attend to its positions (PixArt-alpha's and Wan's
cross-attention), for the words a pooled vector blurs, such as where the object is and how it moves.

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
from vgen.models.checkpoint_io import copy_shared_tensors
from vgen.models.conditioning import ClassConditional, Condition, PrefixCondition, check_caption_features
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
    """Frame geometry, block length, the number of frames trained on (the longest attended sequence), the
    transformer's size and the condition: ``num_classes`` classes, or (``text_dim > 0``) captions of at most
    ``text_tokens`` positions of ``text_dim`` features (the text encoder's ``max_length`` and width), in which case
    ``num_classes`` is unused. ``class_dropout_prob`` drops the class or the caption in training (CFG)."""

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
    text_dim: int = size(0, at_least=0)
    text_tokens: int = size(24)

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


class CrossAttention(nn.Module):
    """Pre-norm attention from frame tokens to the caption's positions, padding masked out. The output projection
    starts at zero, so the branch starts closed (a text model started from a class model is that class model)."""

    def __init__(self, cfg: BlockDiffConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.norm = nn.LayerNorm(cfg.dim, eps=1e-6)
        self.wq = Linear(cfg.dim, cfg.dim, bias=False)
        self.wkv = Linear(cfg.text_dim, 2 * cfg.dim, bias=False)
        self.wo = Linear(cfg.dim, cfg.dim, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)

    def forward(self, x: torch.Tensor, caption: PrefixCondition) -> torch.Tensor:
        """``x`` [B, t, dim] attends to ``caption`` (values [B, L, text_dim], padding zeroed) -> [B, t, dim]."""
        q = self.q_norm(rearrange(self.wq(self.norm(x)), "b t (h d) -> b h t d", h=self.n_head))
        k, v = rearrange(self.wkv(caption.values), "b l (two h d) -> two b h l d", two=2, h=self.n_head)
        out = F.scaled_dot_product_attention(q, self.k_norm(k), v, attn_mask=caption.mask[:, None, None, :])
        return self.wo(rearrange(out, "b h t d -> b t (h d)"))


def per_token(rows: torch.Tensor, tokens_per_block: int) -> torch.Tensor:
    """Per-block rows [B, blocks, D] -> per-token [B, blocks * tokens_per_block, D]; one block stays [B, 1, D],
    which broadcasts over its tokens without a copy."""
    return rows if rows.shape[1] == 1 else rows.repeat_interleave(tokens_per_block, dim=1)


class DiTBlock(nn.Module):
    """Pre-norm attention + SwiGLU with adaLN-Zero modulation (shift, scale, gate for each half), and in a text
    model cross-attention to the caption between them. The modulation is computed once per block, whose tokens
    share their noise level and condition, and then spread over the tokens: per token it cost a third of the
    layer's multiply-adds."""

    def __init__(self, cfg: BlockDiffConfig) -> None:
        super().__init__()
        self.tokens_per_block = cfg.tokens_per_block
        self.norm1 = nn.LayerNorm(cfg.dim, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(cfg)
        self.norm2 = nn.LayerNorm(cfg.dim, elementwise_affine=False, eps=1e-6)
        self.mlp = FeedForward(cfg.dim, swiglu_hidden_dim(cfg.dim, cfg.multiple_of))
        self.modulation = Linear(cfg.dim, 6 * cfg.dim)
        self.cross = CrossAttention(cfg) if cfg.text_dim else None

    def forward(self, x: torch.Tensor, cond: torch.Tensor, rope: torch.Tensor, context: KV | None,
                mask: torch.Tensor | None, caption: PrefixCondition | None) -> tuple[torch.Tensor, KV]:
        """``cond`` is per block, [B, blocks, dim]; ``caption`` the text model's caption (None for a class model)."""
        modulation = per_token(self.modulation(F.silu(cond)), self.tokens_per_block)
        shift1, scale1, gate1, shift2, scale2, gate2 = modulation.chunk(6, dim=-1)
        h, kv = self.attn(torch.addcmul(shift1, self.norm1(x), 1 + scale1), rope, context, mask)
        x = torch.addcmul(x, gate1, h)
        if self.cross is not None:
            x = x + self.cross(x, caption)
        x = torch.addcmul(x, gate2, self.mlp(torch.addcmul(shift2, self.norm2(x), 1 + scale2)))
        return x, kv


class BlockDiffusionTransformer(ClassConditional, nn.Module):
    """Velocity prediction for video blocks at per-block noise levels, block-causal across blocks, conditioned on
    class ids or (``config.text_dim > 0``) a caption."""

    def __init__(self, config: BlockDiffConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.patch_embed = Linear(c.patch_dim, c.dim)
        if c.text_dim:
            self.text_pool = Linear(c.text_dim, c.dim)  # the caption's masked mean, where the class row goes
            # the unconditional caption (CFG, caption dropout), at the scale of a layer-normed encoder's features
            self.null_caption = nn.Parameter(torch.randn(c.text_tokens, c.text_dim))
        else:
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
            if layer.cross is not None:
                nn.init.zeros_(layer.cross.wo.weight)
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

    # -- the condition -----------------------------------------------------------------------------------------
    @property
    def is_text(self) -> bool:
        """Whether the model takes a caption (``config.text_dim > 0``) rather than class ids."""
        return self.config.text_dim > 0

    @property
    def num_classes(self) -> int:
        """The classes of a class model; a text model has none (0)."""
        return 0 if self.is_text else self.config.num_classes

    def _check_kind(self, cond: Condition) -> None:
        c = self.config
        if self.is_text and not isinstance(cond, PrefixCondition):
            raise ValueError(f"this block-diffusion model is text-conditional: give a prompt (a PrefixCondition of "
                             f"caption features [batch, <= {c.text_tokens}, {c.text_dim}]), not class ids")
        if not self.is_text and isinstance(cond, PrefixCondition):
            raise ValueError("this block-diffusion model is class-conditional: give class ids, not a text prompt")

    def _check_caption(self, cond: PrefixCondition) -> None:
        check_caption_features(cond, self.config.text_tokens, self.config.text_dim, ("text_tokens", "text_dim"))

    def check_condition(self, cond: Condition) -> None:
        """Raise a ValueError unless ``cond`` fits the model: 1-D valid class ids for a class model, a caption
        (:class:`~vgen.models.conditioning.PrefixCondition` [B, <= text_tokens, text_dim]) for a text model."""
        self._check_kind(cond)
        if self.is_text:
            self._check_caption(cond)
        else:
            super().check_condition(cond)

    def null_condition(self, cond: Condition) -> Condition:
        """The unconditional counterpart of ``cond`` for CFG: the null class, or (text model) the last
        ``cond.length`` positions of ``null_caption`` in every row, all real (with a text encoder's full-length
        captions, the whole null caption)."""
        if not self.is_text:
            return super().null_condition(cond)
        null = self.null_caption[-cond.length:].to(cond.values.device, cond.values.dtype)
        return PrefixCondition(null.expand(len(cond), -1, -1),
                               torch.ones(len(cond), cond.length, dtype=torch.bool, device=cond.device))

    def _dropped(self, cond: Condition) -> Condition:
        """``cond`` with ``class_dropout_prob`` of its rows replaced by their null condition (training)."""
        p = self.config.class_dropout_prob
        null = self.null_condition(cond)
        if not self.is_text:
            return torch.where(torch.rand(cond.shape, device=cond.device) < p, null, cond)
        drop = torch.rand(len(cond), device=cond.device) < p
        return PrefixCondition(torch.where(drop[:, None, None], null.values, cond.values),
                               torch.where(drop[:, None], null.mask, cond.mask))

    def _caption(self, cond: Condition) -> PrefixCondition | None:
        """A text model's caption in the weights' dtype with its padding zeroed (so padded values are inert)."""
        if not self.is_text:
            return None
        values = cond.values.to(self.patch_embed.weight.dtype)
        return PrefixCondition(torch.where(cond.mask[..., None], values, 0), cond.mask)

    # -- patches -----------------------------------------------------------------------------------------------
    def patchify(self, frames: torch.Tensor) -> torch.Tensor:
        """[B, T, S, S, C] -> [B, T * tokens_per_frame, patch_dim] in (frame, row, column) raster order."""
        p = self.config.patch_size
        return rearrange(frames, "b t (h p) (w q) c -> b (t h w) (p q c)", p=p, q=p)

    def unpatchify(self, tokens: torch.Tensor, num_frames: int) -> torch.Tensor:
        g, p = self.config.grid_side, self.config.patch_size
        return rearrange(tokens, "b (t h w) (p q c) -> b t (h p) (w q) c", t=num_frames, h=g, w=g, p=p, q=p)

    # -- forward -----------------------------------------------------------------------------------------------
    def _condition(self, sigma: torch.Tensor, cond: Condition, caption: PrefixCondition | None) -> torch.Tensor:
        """Per-block conditioning [B, blocks, dim]: the block's noise level (``sigma`` [B, blocks]) plus the class
        (``cond`` [B], or [B, blocks] for a class per block) or the projected masked mean of ``caption`` (from
        :meth:`_caption`)."""
        c = self.config
        t_emb = self.time_mlp(timestep_embedding(sigma, c.dim).to(self.patch_embed.weight.dtype))
        cls = self.class_embedding(cond) if caption is None else self.text_pool(self.pooled_caption(caption))
        return t_emb + (cls[:, None] if cls.ndim == 2 else cls)

    @staticmethod
    def pooled_caption(caption: PrefixCondition) -> torch.Tensor:
        """The masked mean of a caption's features [B, text_dim]: what ``text_pool`` projects into the class
        row's place."""
        return caption.values.sum(1) / caption.mask.sum(1, keepdim=True).to(caption.values.dtype)

    def _check(self, frames: torch.Tensor, cond: Condition) -> None:
        c = self.config
        shape = (c.frame_size, c.frame_size, c.channels)
        if frames.ndim != 5 or tuple(frames.shape[2:]) != shape:
            raise ValueError(f"frames must be [batch, frames, {c.frame_size}, {c.frame_size}, {c.channels}], "
                             f"got {tuple(frames.shape)}")
        self._check_kind(cond)
        if self.is_text:
            self._check_caption(cond)
            if len(cond) != len(frames):
                raise ValueError(f"{len(cond)} captions for a batch of {len(frames)} clips")
            return
        class_ids = cond
        if class_ids.shape[:1] != frames.shape[:1] or class_ids.ndim > 2:
            raise ValueError(f"class_ids must be [batch] or [batch, blocks], got {tuple(class_ids.shape)}")
        if int(class_ids.min()) < 0 or int(class_ids.max()) > c.num_classes:
            raise ValueError(f"class ids must be in [0, {c.num_classes}] ({c.num_classes} = null), "
                             f"got {class_ids.tolist()}")

    def forward(self, frames: torch.Tensor, sigma: torch.Tensor, cond: Condition) -> torch.Tensor:
        """Whole-clip pass (training, and the reference for cached generation): noisy ``frames`` [B, T, S, S, C]
        with one noise level per block (``sigma`` [B, T / frames_per_block]) under ``cond`` (class ids, or a
        text model's caption) -> velocity, same shape as frames. Class ids equal to ``num_classes`` are the null
        class; in training mode ``class_dropout_prob`` of the rows get their null condition."""
        c = self.config
        self._check(frames, cond)
        t = frames.shape[1]
        if sigma.shape != (frames.shape[0], t // c.frames_per_block):
            raise ValueError(f"sigma must be [batch, blocks] = {(frames.shape[0], t // c.frames_per_block)}, "
                             f"got {tuple(sigma.shape)}")
        if self.training and c.class_dropout_prob > 0:
            cond = self._dropped(cond)
        out, _ = self._whole_clip(frames, sigma, cond)
        return self.unpatchify(out, t)

    def _whole_clip(self, frames: torch.Tensor, sigma: torch.Tensor,
                    cond: Condition) -> tuple[torch.Tensor, list[KV]]:
        """Every block of ``frames`` at once under the block-causal mask, from frame position 0."""
        c, t = self.config, frames.shape[1]
        if t % c.frames_per_block or not 0 < t <= c.train_frames:
            raise ValueError(f"a whole-clip pass takes a multiple of {c.frames_per_block} frames up to "
                             f"{c.train_frames}, got {t}")
        mask = block_causal_frame_mask(t, c.frames_per_block, c.tokens_per_frame, frames.device)
        caption = self._caption(cond)
        return self._run(self.patchify(frames), self._condition(sigma, cond, caption), self._rope(0, t), None, mask,
                         caption)

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

    def clean_context(self, frames: torch.Tensor, cond: Condition) -> list[KV]:
        """Unrotated (k, v) per layer of clean ``frames`` [B, T, S, S, C] (whole blocks, frame positions from 0)
        under the block-causal mask and ``cond``: what a cache holds after generating them, computed afresh (under
        a new condition: LongLive's KV re-cache at a prompt switch)."""
        self._check(frames, cond)
        sigma = torch.zeros(len(frames), max(1, frames.shape[1] // self.config.frames_per_block),
                            device=frames.device)
        return self._whole_clip(frames, sigma, cond)[1]

    def forward_block(self, frames: torch.Tensor, sigma: torch.Tensor, cond: Condition,
                      context: BlockContext | None) -> tuple[torch.Tensor, list[KV]]:
        """One block (``frames`` [B, frames_per_block, S, S, C] at noise level ``sigma`` [B]) under ``cond`` (class
        ids or a caption) after ``context`` (from :meth:`prepare_context`; None at the start).

        Returns the velocity and the block's unrotated (k, v) per layer, which a cache stores after the clean
        (``sigma = 0``) pass. The block takes the frame positions right after its context."""
        c = self.config
        self._check(frames, cond)
        if frames.shape[1] != c.frames_per_block:
            raise ValueError(f"a block has {c.frames_per_block} frames, got {frames.shape[1]}")
        start = 0 if context is None else context.frames
        caption = self._caption(cond)
        out, kvs = self._run(self.patchify(frames), self._condition(sigma[:, None], cond, caption),
                             self._rope(start, c.frames_per_block), None if context is None else context.kvs, None,
                             caption)
        return self.unpatchify(out, c.frames_per_block), kvs

    def _run(self, tokens: torch.Tensor, cond: torch.Tensor, rope: torch.Tensor, context: list[KV] | None,
             mask: torch.Tensor | None, caption: PrefixCondition | None) -> tuple[torch.Tensor, list[KV]]:
        h = self.patch_embed(tokens.to(self.patch_embed.weight.dtype))
        kvs = []
        for i, layer in enumerate(self.layers):
            h, kv = layer(h, cond, rope, context[i] if context is not None else None, mask, caption)
            kvs.append(kv)
        shift, scale = per_token(self.final_modulation(F.silu(cond)), self.config.tokens_per_block).chunk(2, dim=-1)
        return self.output(torch.addcmul(shift, self.final_norm(h), 1 + scale)).float(), kvs


def start_from_class(model: BlockDiffusionTransformer, class_model: BlockDiffusionTransformer) -> list[str]:
    """Copy into the text model ``model`` every tensor of ``class_model`` it shares (same name and shape); returns
    the names of ``model``'s own tensors, left as initialised. Fresh from the copy, its cross-attention is closed
    (``wo`` zero), so it is the class model with the projected pooled caption in place of the class row."""
    if not model.is_text or class_model.is_text:
        kinds = ["text" if m.is_text else "class" for m in (model, class_model)]
        raise ValueError(f"start_from_class copies a class model into a text model, got a {kinds[0]} model and a "
                         f"{kinds[1]} model")
    return copy_shared_tensors(model, class_model)
