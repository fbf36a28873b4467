"""An EAGLE-style draft head for a LlamaGen GPT (the drafter LANTERN used).

One transformer layer that runs beside the target. At sequence slot ``s`` it reads the target's final hidden
state ``f_s`` (the feature that predicts image token ``s``) together with the embedding of token ``s``, and
predicts the next feature ``f_{s+1}``; the target's own output layer turns that into a draft distribution for
token ``s + 1``. Feeding its prediction back in drafts several tokens from one target pass. The head shares
the target's token embeddings and output layer (frozen), so it adds only ``fc`` (2 dim -> dim), one block and
a norm: a few percent of the target's parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vgen.models.backbone import GRID_LIMIT
from vgen.models.cache import KVCache
from vgen.models.config_fields import ModelConfig, declare, size
from vgen.models.layers import RMSNorm, rope_2d_table
from vgen.models.linear import Linear
from vgen.models.llamagen import GPTConfig, LlamaGenGPT, TransformerBlock


@dataclass(frozen=True)
class DraftHeadConfig(ModelConfig):
    """The target's width, heads and grid (the head must match them) and the norm epsilon."""

    dim: int = size()
    n_head: int = size()
    block_size: int = size(at_most=GRID_LIMIT ** 2)
    multiple_of: int = size(256)
    rope_base: float = declare(10000.0, above=0)
    norm_eps: float = declare(1e-5, above=0, below=1)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.block_config()  # the relations of width, heads and grid

    @classmethod
    def for_target(cls, target: GPTConfig) -> DraftHeadConfig:
        return cls(target.dim, target.n_head, target.block_size, target.multiple_of, target.rope_base,
                   target.norm_eps)

    def block_config(self) -> GPTConfig:
        return GPTConfig(dim=self.dim, n_layer=1, n_head=self.n_head, block_size=self.block_size,
                         multiple_of=self.multiple_of, rope_base=self.rope_base, norm_eps=self.norm_eps,
                         token_dropout_p=0.0, resid_dropout_p=0.0, ffn_dropout_p=0.0)


class DraftHead(nn.Module):
    def __init__(self, config: DraftHeadConfig) -> None:
        super().__init__()
        self.config = config
        block = config.block_config()
        self.fc = Linear(2 * config.dim, config.dim, bias=False)
        self.layer = TransformerBlock(block)
        self.norm = RMSNorm(config.dim, config.norm_eps)
        # slot s reads token s, which sits at target position s + 1 of the rope table (slot 0 = class)
        self.rope = rope_2d_table(block.grid_size, block.head_dim, config.rope_base)[1:]

    def check_target(self, target: LlamaGenGPT) -> None:
        """Raise a ValueError unless ``target`` has the width, heads and grid this head was trained for."""
        c, t = self.config, target.config
        if (c.dim, c.n_head, c.block_size) != (t.dim, t.n_head, t.block_size):
            raise ValueError(f"draft head for dim {c.dim}, {c.n_head} heads, {c.block_size} tokens does not fit a "
                             f"target with dim {t.dim}, {t.n_head} heads, {t.block_size} tokens")

    def new_cache(self, batch_size: int, extra: int = 0) -> KVCache:
        p = self.fc.weight
        return KVCache(1, batch_size, self.config.n_head, self.config.block_size + extra,
                       self.config.dim // self.config.n_head, p.dtype, p.device)

    def _inputs(self, features: torch.Tensor, tokens: torch.Tensor, target: LlamaGenGPT) -> torch.Tensor:
        return self.fc(torch.cat([features.to(self.fc.weight.dtype), target.tok_embeddings(tokens)], dim=-1))

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, target: LlamaGenGPT) -> torch.Tensor:
        """Training pass over whole sequences: features [B, T, dim] of slots 0..T-1 and tokens [B, T] ->
        predicted normed features [B, T, dim] of slots 1..T."""
        h = self._inputs(features, tokens, target)
        if self.rope.device != h.device:
            self.rope = self.rope.to(h.device)
        return self.norm(self.layer(h, self.rope[:h.shape[1]], None, 0))

    def decode_rows(self, features: torch.Tensor, tokens: torch.Tensor, starts: torch.Tensor, cache: KVCache,
                    target: LlamaGenGPT, static: bool = False) -> torch.Tensor:
        """Cached pass with per-row starts (as :meth:`LlamaGenGPT.decode_rows`, ``static`` included): predicted
        features [B, T, dim]."""
        rows = cache.row_slots(starts, tokens.shape[1], static)
        if self.rope.device != tokens.device:
            self.rope = self.rope.to(tokens.device)
        rope = self.rope[rows.slots.clamp(max=self.rope.shape[0] - 1)]
        h = self.layer(self._inputs(features, tokens, target), rope, cache, 0, rows=rows)
        return self.norm(h)
