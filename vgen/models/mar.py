"""Continuous-token AR transformer with MAR's diffusion head, in raster order with a KV cache.

The transformer is LlamaGen's (the same blocks, 2-D RoPE and class table with a null row for guidance), with a
projection of continuous tokens [C] in place of the token embedding: linear as in MAR, or a small MLP
(``token_hidden``), which is what lets a discrete AR model's trunk be reused (:mod:`vgen.training.mar`). Position 0
holds the class and the output at position p, after the final norm, is the condition ``z`` from which the diffusion
head denoises token p. Raster order with a KV cache is what speculative decoding needs: :meth:`decode` /
:meth:`decode_rows` append any number of tokens and return one condition per appended token, the last predicting the
next token.

Tokens are the KL tokenizer's latents scaled to unit variance (the tokenizer holds the scale, as MAR's 0.2325
for its kl16), which is what the head's noise schedule expects.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vgen.models.backbone import GRID_LIMIT
from vgen.models.cache import KVCache, RowSlots
from vgen.models.conditioning import ClassConditional, init_llamagen_weights
from vgen.models.config_fields import ModelConfig, declare, probability, size
from vgen.models.diffusion_head import MAX_DIFFUSION_STEPS, DiffusionHead, HeadConfig
from vgen.models.gaussian_diffusion import training_loss
from vgen.models.layers import RMSNorm, rope_2d_table
from vgen.models.linear import Linear
from vgen.models.llamagen import GPTConfig, LabelEmbedder, TransformerBlock


@dataclass(frozen=True)
class MARConfig(ModelConfig):
    """Transformer size, token grid and channels, and the diffusion head (MAR-B: dim 768, head w1024 d6)."""

    token_channels: int = size(16)
    grid_size: int = size(16, at_most=GRID_LIMIT)
    dim: int = size(768)
    n_layer: int = size(12)
    n_head: int = size(12)
    multiple_of: int = size(256)
    num_classes: int = size(1000, at_least=0)
    class_dropout_prob: float = probability(0.1)
    dropout_p: float = probability(0.1)
    head_width: int = size(1024)
    head_depth: int = size(6)
    num_train_steps: int = size(1000, at_most=MAX_DIFFUSION_STEPS)
    num_sampling_steps: int = size(100, at_most=MAX_DIFFUSION_STEPS)
    clip_x0: float = declare(0.0, at_least=0)
    diffusion_batch_mul: int = size(4)
    token_hidden: int = size(0, at_least=0)  # > 0: tokens enter by Linear(C, hidden) -> SiLU -> Linear(hidden, dim)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.transformer()  # the relations of dim, heads and grid
        self.head()  # and of the diffusion steps

    def transformer(self) -> GPTConfig:
        """The LlamaGen block settings of the transformer (its vocabulary is unused)."""
        return GPTConfig(vocab_size=1, dim=self.dim, n_layer=self.n_layer, n_head=self.n_head,
                         multiple_of=self.multiple_of, num_classes=self.num_classes, block_size=self.grid_size ** 2,
                         class_dropout_prob=self.class_dropout_prob, token_dropout_p=self.dropout_p,
                         resid_dropout_p=self.dropout_p, ffn_dropout_p=self.dropout_p)

    def head(self) -> HeadConfig:
        return HeadConfig(token_channels=self.token_channels, cond_dim=self.dim, width=self.head_width,
                          depth=self.head_depth, num_train_steps=self.num_train_steps,
                          num_sampling_steps=self.num_sampling_steps, clip_x0=self.clip_x0)


def token_projection(config: MARConfig) -> nn.Module:
    """The map from continuous tokens [.., C] to the transformer width."""
    if config.token_hidden == 0:
        return Linear(config.token_channels, config.dim)
    return nn.Sequential(Linear(config.token_channels, config.token_hidden), nn.SiLU(),
                         Linear(config.token_hidden, config.dim))


class ContinuousAR(ClassConditional, nn.Module):
    """Class-conditional raster-order AR over ``grid_size ** 2`` continuous tokens with a diffusion head."""

    token_order = "continuous"

    def __init__(self, config: MARConfig) -> None:
        super().__init__()
        self.config = config
        tcfg = config.transformer()
        self.cls_embedding = LabelEmbedder(config.num_classes, config.dim, config.class_dropout_prob)
        self.token_proj = token_projection(config)
        self.tok_dropout = nn.Dropout(config.dropout_p)
        self.layers = nn.ModuleList(TransformerBlock(tcfg) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.dim, tcfg.norm_eps)
        for m in self.modules():
            init_llamagen_weights(m)
        self.head = DiffusionHead(config.head())  # after the init above: the head has its own
        self.rope = rope_2d_table(config.grid_size, tcfg.head_dim, tcfg.rope_base)

    # -- layout ------------------------------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return self.config.grid_size ** 2

    @property
    def grid(self) -> tuple[int, int]:
        return (self.config.grid_size, self.config.grid_size)

    @property
    def token_channels(self) -> int:
        return self.config.token_channels

    @property
    def device(self) -> torch.device:
        return self.cls_embedding.embedding_table.weight.device

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Transformer inputs [.., dim] of continuous tokens [.., C] (in the weights' dtype)."""
        return self.token_proj(tokens.to(self.cls_embedding.embedding_table.weight.dtype))

    # -- transformer -------------------------------------------------------------------------------------------
    def _run(self, h: torch.Tensor, rope: torch.Tensor, cache: KVCache | None,
             rows: RowSlots | None = None) -> torch.Tensor:
        if self.training:
            h = self.tok_dropout(h)
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, cache, i, rows=rows)
        return self.norm(h)

    def _rope(self, device: torch.device) -> torch.Tensor:
        if self.rope.device != device:
            self.rope = self.rope.to(device)
        return self.rope

    def forward(self, class_ids: torch.Tensor, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Full causal pass: conditions [B, 1 + n, dim] for tokens [B, n, C]; position p conditions token p."""
        h = self.cls_embedding(class_ids)
        if tokens is not None and tokens.shape[1]:
            h = torch.cat([h, self.embed_tokens(tokens)], dim=1)
        if h.shape[1] > 1 + self.num_tokens:
            raise ValueError(f"sequence of {h.shape[1]} positions exceeds 1 + {self.num_tokens} tokens")
        return self._run(h, self._rope(h.device)[:h.shape[1]], None)

    def loss(self, class_ids: torch.Tensor, tokens: torch.Tensor, generator: torch.Generator | None = None,
             context_noise: float = 0.0) -> torch.Tensor:
        """Mean diffusion loss of every token given its prefix (each token noised ``diffusion_batch_mul`` times).

        ``context_noise`` > 0 perturbs the prefix the trunk reads (not the tokens the head learns) with Gaussian
        noise of a standard deviation drawn per image from ``[0, context_noise]``: sampling feeds the trunk its
        own imperfect tokens, and a trunk trained only on exact ones is thrown off by small errors.
        """
        context = tokens[:, :-1]
        if context_noise > 0:
            sigma = context_noise * torch.rand(len(tokens), 1, 1, device=tokens.device, generator=generator)
            context = context + sigma * torch.randn(context.shape, device=tokens.device, generator=generator)
        return self.prefix_loss(class_ids, tokens, context, generator)

    def prefix_loss(self, class_ids: torch.Tensor, tokens: torch.Tensor, context: torch.Tensor,
                    generator: torch.Generator | None = None) -> torch.Tensor:
        """Mean diffusion loss of every token of ``tokens`` [B, L, C] when the trunk reads ``context`` [B, L-1, C]
        as the prefix (``tokens[:, :-1]`` itself, or a perturbed copy)."""
        b, n, c = tokens.shape
        z = self(class_ids, context)
        mul = self.config.diffusion_batch_mul
        x0 = tokens.reshape(b * n, c).repeat(mul, 1).float()
        cond = z.reshape(b * n, -1).repeat(mul, 1)
        return training_loss(self.head, self.head.train_schedule, x0, cond, generator).mean()

    def new_cache(self, batch_size: int, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None, extra: int = 0) -> KVCache:
        """An empty cache with room for the class position, every token and ``extra`` slots past the end."""
        p = self.cls_embedding.embedding_table.weight
        tcfg = self.config.transformer()
        return KVCache(self.config.n_layer, batch_size, tcfg.kv_heads, 1 + self.num_tokens + extra, tcfg.head_dim,
                       dtype or p.dtype, device or p.device)

    def prefill(self, class_ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Run the class position into an empty cache; the condition [B, dim] of token 0."""
        if cache.length != 0:
            raise ValueError(f"prefill needs an empty cache, this one holds {cache.length} positions")
        cache.reserve(1)
        z = self._run(self.cls_embedding(class_ids), self._rope(class_ids.device)[:1], cache)
        cache.advance(1)
        return z[:, -1]

    def decode(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Append tokens [B, k, C]; conditions [B, k, dim], row i for the token after appended token i."""
        start = cache.reserve(tokens.shape[1])
        rope = self._rope(tokens.device)[start:start + tokens.shape[1]]
        z = self._run(self.embed_tokens(tokens), rope, cache)
        cache.advance(tokens.shape[1])
        return z

    def decode_rows(self, tokens: torch.Tensor, starts: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Tokens [B, k, C] written at slots ``starts[b] .. starts[b] + k - 1`` of each row (rows advance on
        their own, as in :meth:`LlamaGenGPT.decode_rows`); conditions [B, k, dim]. Slots past the last token
        reuse its rotary position; their outputs are meaningless."""
        rows = cache.row_slots(starts, tokens.shape[1])
        rope = self._rope(tokens.device)
        rope = rope[rows.slots.clamp(max=rope.shape[0] - 1)]
        return self._run(self.embed_tokens(tokens), rope, cache, rows=rows)

