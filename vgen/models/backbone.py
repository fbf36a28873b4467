"""The settings every backbone built from LlamaGen's transformer blocks shares, declared and validated once.

:class:`BackboneConfig` holds LlamaGen's ``ModelArgs`` less the sequence length (the blocks, the token and class
tables, their dropout); :class:`~vgen.models.llamagen.GPTConfig` adds the sequence, :class:`GridConfig` a token
grid with its rotary positions for the backbones that are not next-token in raster order (NAR, NBP).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vgen.models.config_fields import ModelConfig, declare, probability, size
from vgen.models.layers import rope_frames_table, rope_grid_table

ROPE_KINDS = ("grid", "spatial")
AXIS_NAMES = {2: ("rows", "columns"), 3: ("frames", "rows", "columns")}
GRID_LIMIT = 1 << 10
"""The most positions a grid axis (frames, rows or columns, or pixels of a frame's side) holds: 1024, far above any
model's 16 to 48 tokens; the tables a model builds over its grid stay small enough to build in seconds."""


@dataclass(frozen=True)
class BackboneConfig(ModelConfig):
    """LlamaGen's ``ModelArgs`` for class-conditional generation, less the sequence length (defaults: GPT-B)."""

    vocab_size: int = size(16384)
    dim: int = size(768)
    n_layer: int = size(12)
    n_head: int = size(12)
    n_kv_head: int | None = size(None)
    multiple_of: int = size(256)
    ffn_dim_multiplier: float | None = declare(None, above=0, at_most=64)
    rope_base: float = declare(10000.0, above=0)
    norm_eps: float = declare(1e-5, above=0, below=1)
    num_classes: int = size(1000, at_least=0)
    class_dropout_prob: float = probability(0.1)
    token_dropout_p: float = probability(0.1)
    attn_dropout_p: float = probability(0.0)
    resid_dropout_p: float = probability(0.1)
    ffn_dropout_p: float = probability(0.1)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dim % self.n_head:
            raise ValueError(f"dim {self.dim} is not divisible by n_head {self.n_head}")
        if self.head_dim % 4:
            raise ValueError(f"head_dim {self.head_dim} (dim {self.dim} / n_head {self.n_head}) must be divisible "
                             f"by 4 for rotary positions")
        if self.n_head % self.kv_heads:
            raise ValueError(f"n_head {self.n_head} is not divisible by n_kv_head {self.kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head


def check_rotary_pairs(grid: tuple[int, ...], rope: str, head_dim: int) -> None:
    """Refuse a head too narrow for its rotary table: one rotation pair (two channels) at least per rotated axis,
    every axis of ``grid`` with ``rope="grid"``, a frame's rows and columns with ``rope="spatial"``."""
    axes = len(grid) if rope == "grid" else 2
    if head_dim // 2 < axes:
        raise ValueError(f"head_dim {head_dim} gives {head_dim // 2} rotation pairs, fewer than {axes} axes of grid "
                         f"{tuple(grid)} that rope={rope!r} rotates")


@dataclass(frozen=True)
class GridConfig(BackboneConfig):
    """A backbone over a token grid ((H, W) or (T, H, W)) and how its positions are encoded.

    ``rope="grid"`` rotates every axis of the grid (time too); ``rope="spatial"`` (video only) rotates each frame's
    rows and columns with LlamaGen's 2-D table and tells frames apart by a learned per-frame embedding, zero at
    initialisation: every frame then sees the geometry an image model of the same frame grid was trained with, so
    such a model's weights can start the video model."""

    grid: tuple[int, ...] = size((16, 16), at_most=GRID_LIMIT, length=(2, 3))
    rope: str = declare("grid", choices=ROPE_KINDS)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rope == "spatial" and self.rank != 3:
            raise ValueError(f"rope='spatial' encodes the frames of a video grid (frames, rows, columns), got "
                             f"{self.grid}")
        check_rotary_pairs(self.grid, self.rope, self.head_dim)

    @property
    def rank(self) -> int:
        return len(self.grid)

    @property
    def num_tokens(self) -> int:
        return math.prod(self.grid)

    def rope_table(self) -> torch.Tensor:
        """The rotary rows of the class slot and every grid position: the whole grid's (``rope="grid"``), or each
        frame's rows and columns repeated frame after frame (``rope="spatial"``)."""
        if self.rope == "grid":
            return rope_grid_table(self.grid, self.head_dim, self.rope_base)
        return rope_frames_table(self.grid, self.head_dim, self.rope_base)
