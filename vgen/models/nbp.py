"""NBP: a class-conditional next-block-prediction transformer (Ren et al., arXiv 2502.07737) over an image grid
H x W or a video grid T x H x W, built from LlamaGen's blocks.

Blocks. The raster token sequence is cut into equal blocks: a row (``W`` tokens) or, for video, a frame
(``H * W`` tokens). A grid of ``N`` tokens has ``K = N / B`` blocks and takes ``K`` forward passes.

Sequence layout (NBP's ``[c, bov x B, z_0 .. z_{N-B-1}]``): slot 0 holds the class embedding, slots ``1 .. B``
the ``B`` learned begin-of-video embeddings, and slot ``1 + B + p`` the token at raster position ``p`` of every
block but the last. Input block ``k`` (the begin-of-video block for ``k = 0``, else the tokens of block
``k - 1``) fills slots ``1 + kB .. (k + 1)B``, and the output at its ``j``-th slot predicts token ``j`` of block
``k``: token ``j`` of one block predicts token ``j`` of the next. Slot ``s >= 1`` is rotated with the grid
coordinates of the token it predicts (raster position ``s - 1``), the class slot not at all (LlamaGen).

Block-causal mask. A slot in input block ``k`` sees the class slot and every slot of input blocks ``0 .. k``
(full attention inside its block, causal across blocks: NBP's ``get_attn_mask``); the class slot sees itself.
No target leaks: the slots of block ``k`` hold tokens of blocks ``< k`` only.

Hybrid start (``hybrid=True``, NBP's ``--hybrid`` of its class-conditional UCF-101 models). Block 0 has no earlier
block to read, so with parallel decoding its ``B`` tokens are drawn independently given the class alone: on data
whose first frame is many-modal (where is the object, what colour) that is noise. The hybrid layout generates block
0 token by token instead: slot 1 holds the first begin-of-video embedding and predicts token 0, slots ``2 .. B``
hold tokens ``0 .. B-2`` under a causal mask (next-token prediction), and input block 1 is ``[z_{B-1}, bov_1 ..
bov_{B-1}]`` (NBP's ``middle_bos``, here the remaining begin-of-video rows, so both layouts have the same
parameters). Slots and positions are otherwise unchanged; sampling takes ``B + K - 1`` passes.
``hybrid_blocks = m`` (vgen's) draws the first ``m`` blocks token by token instead of block 0 alone, ``L = m B``
tokens: with row blocks and ``m = H`` that is all of frame 0, which is then drawn as an image model of the frame
grid draws an image, and every later row as a block; sampling takes ``L + K - m`` passes.

KV cache. :meth:`NBPTransformer.prefill` runs the class and begin-of-video slots (step 1), and each
:meth:`NBPTransformer.decode` feeds one generated block and returns the next block's logits (steps 2 .. K); the
keys and values of every block stay cached, so a step computes only its own ``B`` slots. In the hybrid layout
:meth:`NBPTransformer.prefill` runs the class and the first begin-of-video slot, and
:meth:`NBPTransformer.decode_first_block` feeds block 0 one token at a time before ``decode`` takes over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from vgen.models.backbone import GridConfig
from vgen.models.cache import KVCache
from vgen.models.conditioning import TokenGridModel, init_llamagen_weights
from vgen.models.config_fields import declare, size
from vgen.models.layers import PrefixMask, RMSNorm, frame_offsets
from vgen.models.linear import Linear
from vgen.models.llamagen import LabelEmbedder, TransformerBlock

BLOCK_KINDS = ("row", "frame")


@dataclass(frozen=True)
class NBPConfig(GridConfig):
    """LlamaGen's ``ModelArgs`` over a token grid ((H, W) or (T, H, W); :class:`~vgen.models.backbone.GridConfig`),
    the block kind (``"row"`` or, for video, ``"frame"``) and whether block 0 (``hybrid``; the first
    ``hybrid_blocks`` blocks) is generated token by token. ``rope="spatial"`` lets an image model's weights start
    the video model (``vgen.training.nbp.warm_start``)."""

    grid: tuple[int, ...] = (16, 8, 8)
    block: str = declare("frame", choices=BLOCK_KINDS)
    hybrid: bool = declare(False)
    hybrid_blocks: int = size(1)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.block == "frame" and self.rank != 3:
            raise ValueError(f"frame blocks need a video grid (frames, rows, columns), got {self.grid}")
        if self.num_blocks < 2:
            raise ValueError(f"a {self.grid} grid in {self.block} blocks has {self.num_blocks} block; NBP needs >= 2")
        if not 1 <= self.hybrid_blocks < self.num_blocks or (self.hybrid_blocks > 1 and not self.hybrid):
            raise ValueError(f"hybrid_blocks must be 1, or with hybrid=True between 1 and {self.num_blocks - 1} (the "
                             f"leading blocks drawn token by token), got {self.hybrid_blocks} (hybrid={self.hybrid})")

    @property
    def block_size(self) -> int:
        """Tokens per block: a row (``W``) or a frame (``H * W``)."""
        return self.grid[-1] if self.block == "row" else self.grid[-1] * self.grid[-2]

    @property
    def num_blocks(self) -> int:
        return self.num_tokens // self.block_size

    @property
    def first_tokens(self) -> int:
        """Tokens drawn one per pass before the blocks (``hybrid_blocks * block_size``; 0 without ``hybrid``)."""
        return self.hybrid_blocks * self.block_size if self.hybrid else 0

    @property
    def num_steps(self) -> int:
        """Forward passes to generate a grid: one per block, or per token of the first ``hybrid_blocks`` blocks."""
        return self.num_blocks + (self.first_tokens - self.hybrid_blocks if self.hybrid else 0)


def block_causal_mask(num_blocks: int, block_size: int, hybrid: bool = False,
                      device: torch.device | str = "cpu", hybrid_blocks: int = 1) -> torch.Tensor:
    """Bool [1 + K*B, 1 + K*B] (True = attend) over the slots: the class slot, then ``K`` input blocks of ``B``.

    A slot of input block ``k`` sees the class slot and the slots of blocks ``0 .. k``; the class slot sees itself.
    With ``hybrid`` input blocks ``0 .. hybrid_blocks - 1`` are causal (next-token prediction of those blocks).
    """
    block = torch.arange(num_blocks * block_size, device=device) // block_size
    mask = torch.ones(1 + len(block), 1 + len(block), dtype=torch.bool, device=device)
    mask[1:, 1:] = block[None, :] <= block[:, None]
    mask[0, 1:] = False
    if hybrid:
        length = hybrid_blocks * block_size
        first = slice(1, 1 + length)
        mask[first, first] = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    return mask


class NBPTransformer(TokenGridModel, nn.Module):
    """Class-conditional next-block prediction over ``config.grid``; tokens are handled in raster order [B, N]."""

    token_order: ClassVar[str] = "next-block"

    def __init__(self, config: NBPConfig) -> None:
        super().__init__()
        self.config = config
        self.cls_embedding = LabelEmbedder(config.num_classes, config.dim, config.class_dropout_prob)
        self.bov = nn.Parameter(torch.zeros(config.block_size, config.dim))
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.tok_dropout = nn.Dropout(config.token_dropout_p)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = Linear(config.dim, config.vocab_size, bias=False)
        if config.rope == "spatial":
            self.frame_embedding = nn.Embedding(config.grid[0], config.dim)
        # plain attributes, not buffers: the rope table stays fp32 when the model is cast (as in LlamaGen)
        self.rope = config.rope_table()
        self.mask = block_causal_mask(config.num_blocks, config.block_size, config.hybrid,
                                      hybrid_blocks=config.hybrid_blocks)
        self._prefix_masks: dict[int, PrefixMask] = {}  # the mask of each teacher-forced length, as key prefixes
        self.apply(init_llamagen_weights)
        nn.init.normal_(self.bov, std=0.02)
        nn.init.zeros_(self.output.weight)
        if config.rope == "spatial":
            nn.init.zeros_(self.frame_embedding.weight)

    # -- token layout ------------------------------------------------------------------------------------------
    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def num_steps(self) -> int:
        """Forward passes to generate a grid (:attr:`NBPConfig.num_steps`)."""
        return self.config.num_steps

    @property
    def hybrid(self) -> bool:
        return self.config.hybrid

    @property
    def first_tokens(self) -> int:
        """Tokens drawn one per pass before the blocks (:attr:`NBPConfig.first_tokens`)."""
        return self.config.first_tokens

    # -- forward passes ----------------------------------------------------------------------------------------
    def _run(self, h: torch.Tensor, start: int, cache: KVCache | None) -> torch.Tensor:
        """Slots ``start .. start + len(h) - 1`` through every block under the block-causal mask; logits [B, t, V]."""
        device = h.device
        if self.rope.device != device:
            self.rope, self.mask = self.rope.to(device), self.mask.to(device)
            self._prefix_masks.clear()
        end = start + h.shape[1]
        if self.config.rope == "spatial":
            h = h + self._frame_offsets(start, end, device)
        if self.training:
            h = self.tok_dropout(h)
        rope, mask = self.rope[start:end], self.mask[start:end, :end]
        if cache is None and start == 0:  # teacher-forced: every slot sees a prefix of the slots, in chunks
            if end not in self._prefix_masks:
                self._prefix_masks[end] = PrefixMask.from_dense(mask)
            mask = self._prefix_masks[end]
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, cache, i, mask=mask)
        if cache is not None:
            cache.advance(h.shape[1])
        return self.output(self.norm(h)).float()

    def _frame_offsets(self, start: int, end: int, device: torch.device) -> torch.Tensor:
        """The per-frame embedding of slots ``start .. end - 1`` [t, dim] (``rope="spatial"``): slot ``s >= 1`` is in
        the frame of the token it predicts (raster position ``s - 1``); the class slot gets none."""
        return frame_offsets(self.frame_embedding, torch.arange(start, end, device=device),
                             self.grid[1] * self.grid[2])

    def _bov(self, batch: int) -> torch.Tensor:
        return self.bov[None].expand(batch, -1, -1).to(self.tok_embeddings.weight.dtype)

    def forward(self, class_ids: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Teacher-forced pass (training, and the reference for cached decoding): logits [B, M, V] in raster order,
        row p predicting token p from the blocks before its own. ``tokens`` [B, M] is the whole grid or its first
        ``M`` tokens in whole blocks: a row's logits read no later block, so a prefix gives the whole pass's first
        ``M`` rows at the prefix's cost (a trainer scores other frames of a clip as a first frame this way)."""
        n, b = self.num_tokens, self.block_size
        m = tokens.shape[1] if tokens.ndim == 2 else 0
        if tokens.ndim != 2 or not 0 < m <= n or m % b:
            raise ValueError(f"tokens must be [batch, M] with M the whole {self._grid_text()} grid ({n}) or a prefix "
                             f"of whole {self.config.block} blocks of {b}, got shape {tuple(tokens.shape)}")
        return self._run(self._input_slots(class_ids, tokens, m), 0, None)[:, 1:]

    def _input_slots(self, class_ids: torch.Tensor, tokens: torch.Tensor, m: int) -> torch.Tensor:
        """The embedded class slot and input slots ``1 .. m`` [B, 1 + m, dim], which predict raster tokens
        ``0 .. m - 1`` and read the leading tokens of ``tokens`` they need."""
        b, first = self.block_size, self.first_tokens
        # the token-by-token start (L tokens) reads tokens 0 .. L-2 of itself, so it needs them even for M <= L
        emb = self.tok_embeddings(tokens[:, :max(m - b, min(m, first)) if self.hybrid else m - b])
        bov = self._bov(len(class_ids))
        # hybrid: [bov_0, z_0 .. z_{L-2}], then input block m [z_{L-1}, bov_1 .. bov_{B-1}], then blocks m ..
        inputs = [bov[:, :1], emb[:, :first], bov[:, 1:], emb[:, first:]] if self.hybrid else [bov, emb]
        return torch.cat([self.cls_embedding(class_ids), *inputs], dim=1)[:, :1 + m]

    def new_cache(self, batch_size: int, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> KVCache:
        """An empty cache with a slot for the class and every input slot (``1 + N``)."""
        p = self.tok_embeddings.weight
        return KVCache(self.config.n_layer, batch_size, self.config.kv_heads, 1 + self.num_tokens,
                       self.config.head_dim, dtype or p.dtype, device or p.device)

    def prefill(self, class_ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Run the class and begin-of-video slots into an empty cache; logits [B, block_size, V] of block 0 (hybrid:
        logits [B, 1, V] of its token 0)."""
        if cache.length != 0:
            raise ValueError(f"prefill needs an empty cache, this one holds {cache.length} positions")
        bov = self._bov(len(class_ids))
        h = torch.cat([self.cls_embedding(class_ids), bov[:, :1] if self.hybrid else bov], dim=1)
        return self._run(h, 0, cache)[:, 1:]

    def prefill_given(self, class_ids: torch.Tensor, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Run the class, the begin-of-video slots and given leading blocks ``tokens`` [B, k * block_size] into an
        empty cache in one pass, as :meth:`prefill` and ``k`` calls of :meth:`decode` would (the same mask), and
        return the logits [B, block_size, V] of block ``k``. The given blocks must cover the hybrid layout's
        token-by-token start."""
        if cache.length != 0:
            raise ValueError(f"prefill_given needs an empty cache, this one holds {cache.length} positions")
        b, given = self.block_size, tokens.shape[-1]
        if tokens.ndim != 2 or given % b or not max(b, self.first_tokens) <= given < self.num_tokens:
            raise ValueError(f"prefill_given takes whole blocks of {b} tokens covering the first "
                             f"{max(b, self.first_tokens)} and fewer than all {self.num_tokens}, got shape "
                             f"{tuple(tokens.shape)}")
        return self._run(self._input_slots(class_ids, tokens, given + b), 0, cache)[:, -b:]

    def decode_first_block(self, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Hybrid layout: feed token ``i`` [B, 1] of the token-by-token start (the cache holding the class, the first
        begin-of-video slot and tokens ``< i``) and return the logits [B, 1, V] of token ``i + 1``, for
        ``i < first_tokens - 1``."""
        if not self.hybrid:
            raise ValueError("decode_first_block is the hybrid layout's; this model generates block 0 in one pass")
        if token.ndim != 2 or token.shape[1] != 1:
            raise ValueError(f"decode_first_block takes one token per sample [B, 1], got shape {tuple(token.shape)}")
        start, first = cache.length, self.first_tokens
        if not 2 <= start <= first:
            raise ValueError(f"decode_first_block needs a cache holding the class, the first begin-of-video slot and "
                             f"fewer than {first - 1} tokens of the token-by-token start (2 .. {first} "
                             f"positions: call prefill first), this one holds {start}")
        return self._run(self.tok_embeddings(token), start, cache)

    def decode(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Feed block ``k`` [B, block_size] (the cache holding the class and blocks before it) and return the logits
        [B, block_size, V] of block ``k + 1``. In the hybrid layout the cache holds tokens ``0 .. L-2`` of the
        token-by-token start already, and feeding its last block ``m - 1`` runs input block ``m``, ``[z_{L-1}, bov_1 ..
        bov_{B-1}]``."""
        b = self.block_size
        if tokens.ndim != 2 or tokens.shape[1] != b:
            raise ValueError(f"a block of the {self._grid_text()} grid in {self.config.block} blocks has {b} "
                             f"tokens, got tokens of shape {tuple(tokens.shape)}")
        start = cache.length
        if start < 1 + max(b, self.first_tokens) or (start - 1) % b:
            raise ValueError(f"decode needs a cache holding the class and whole blocks (1 + k * {b} positions, "
                             f"k >= {self.config.hybrid_blocks}: call prefill"
                             f"{' and decode_first_block' if self.hybrid else ''} first), this one holds {start}")
        if start + b > 1 + self.num_tokens:
            raise ValueError(f"all {self.config.num_blocks} blocks are generated; the last block feeds nothing")
        h = self.tok_embeddings(tokens)
        if self.hybrid and start == 1 + self.first_tokens:
            h = torch.cat([h[:, -1:], self._bov(len(tokens))[:, 1:]], dim=1)
        return self._run(h, start, cache)

    def _grid_text(self) -> str:
        names = ("frames", "rows", "columns")[-len(self.grid):]
        return " x ".join(f"{n} {name}" for n, name in zip(self.grid, names))
