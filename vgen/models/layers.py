"""Transformer building blocks shared by vgen's backbones (LlamaGen numerics)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from vgen.models.linear import Linear


def find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - (n % k)


def swiglu_hidden_dim(dim: int, multiple_of: int, ffn_dim_multiplier: float | None = None) -> int:
    """LlamaGen / LLaMA SwiGLU width: 2/3 of 4*dim, optionally scaled, rounded up to ``multiple_of``."""
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return find_multiple(hidden, multiple_of)


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in fp32 and cast back, then scaled."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return out.type_as(x) * self.weight


class FeedForward(nn.Module):
    """SwiGLU MLP ``w2(silu(w1 x) * w3 x)`` without biases."""

    def __init__(self, dim: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.w1 = Linear(dim, hidden, bias=False)
        self.w3 = Linear(dim, hidden, bias=False)
        self.w2 = Linear(hidden, dim, bias=False)
        self.ffn_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ffn_dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


PREFIX_ROPES = ("zero", "identity")
"""How the condition (prefix) positions of a rotary table turn: ``"zero"`` (LlamaGen's: cos = sin = 0, their
queries and keys vanish, so every query scores every prefix key 0 wherever it sits) or ``"identity"`` (cos = 1,
sin = 0: the prefix sits at the grid's origin, so a query's score against a prefix key depends on the query's
absolute place, and a caption can steer where things go)."""


def rope_2d_table(grid_size: int, head_dim: int, base: float = 10000.0, num_prefix: int = 1,
                  prefix: str = "zero") -> torch.Tensor:
    """LlamaGen's 2-D rotary table, [num_prefix + grid_size**2, head_dim // 2, 2] of (cos, sin).

    The first half of each head's rotation pairs turns with the row index, the second half with the column index,
    ``head_dim // 4`` frequencies each. With ``prefix="zero"`` the prefix (condition) positions get cos = sin = 0,
    which zeroes their queries and keys exactly as LlamaGen does; their values still reach every later token.
    """
    return rope_grid_table((grid_size, grid_size), head_dim, base, num_prefix, prefix)


def rope_grid_table(shape: tuple[int, ...], head_dim: int, base: float = 10000.0,
                    num_prefix: int = 1, prefix: str = "zero") -> torch.Tensor:
    """Rotary table of a raster grid of any rank (rows x columns, frames x rows x columns, ...),
    [num_prefix + prod(shape), head_dim // 2, 2] of (cos, sin), the prefix positions as ``prefix`` says
    (:data:`PREFIX_ROPES`).

    The ``head_dim // 2`` rotation pairs are split into one block per axis, in axis order: every axis but the
    first gets ``pairs // rank`` pairs, the first the rest; an axis with ``k`` pairs turns pair ``j`` with its
    coordinate at frequency ``base ** (-j / k)``. For a square 2-D grid this is LlamaGen's table exactly.
    """
    if prefix not in PREFIX_ROPES:
        raise ValueError(f"prefix rotation must be one of {PREFIX_ROPES}, got {prefix!r}")
    pairs, rank = head_dim // 2, len(shape)
    if head_dim % 2 or pairs < rank or min(shape, default=0) < 1:
        raise ValueError(f"a rotary table for grid {tuple(shape)} needs positive sizes and an even head_dim >= "
                         f"{2 * rank}, got head_dim {head_dim}")
    cpu = torch.device("cpu")  # explicit, so that building a model on the meta device still gets a real table
    counts = [pairs - (rank - 1) * (pairs // rank)] + [pairs // rank] * (rank - 1)
    coords = torch.cartesian_prod(*(torch.arange(n, dtype=torch.float32, device=cpu) for n in shape))
    coords = coords.reshape(-1, rank)
    angles = []
    for axis, k in enumerate(counts):
        sub = 2 * k
        freqs = 1.0 / (base ** (torch.arange(0, sub, 2, device=cpu)[:k].float() / sub))
        angles.append(torch.outer(coords[:, axis], freqs))
    grid = torch.cat(angles, dim=-1)
    table = torch.stack([torch.cos(grid), torch.sin(grid)], dim=-1)
    head = torch.zeros(num_prefix, pairs, 2, device=cpu)
    if prefix == "identity":
        head[..., 0] = 1.0
    return torch.cat([head, table])


def rope_frames_table(grid: tuple[int, int, int], head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """Rotary table of a video grid (frames, rows, columns) that rotates only rows and columns: each frame's 2-D
    table (LlamaGen's for a square frame), frame after frame, after one unrotated prefix (class) row. A video model
    with it sees every frame with the geometry of an image model of the frame grid; it tells frames apart by other
    means (:func:`frame_offsets`)."""
    frame = rope_grid_table(tuple(grid[1:]), head_dim, base)
    return torch.cat([frame[:1], frame[1:].repeat(grid[0], 1, 1)])


def frame_offsets(embedding: nn.Embedding, slots: torch.Tensor, frame_tokens: int) -> torch.Tensor:
    """Per-frame embedding of sequence slots (any shape: [..., dim]) for the rows-and-columns rotary table: slot
    ``s >= 1`` stands for raster position ``s - 1`` of the grid, in frame ``(s - 1) // frame_tokens``; slot 0 (the
    class) gets none."""
    frames = (slots - 1).clamp(min=0) // frame_tokens
    return embedding(frames) * (slots > 0)[..., None].to(embedding.weight.dtype)


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of ``x`` [B, T, H, D] by ``table`` [T, D/2, 2] (or [B, T, D/2, 2], a position per
    row), in fp32."""
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    if table.ndim == 3:
        table = table[None]
    cos, sin = table[:, :, None, :, 0], table[:, :, None, :, 1]
    out = torch.stack([xs[..., 0] * cos - xs[..., 1] * sin, xs[..., 1] * cos + xs[..., 0] * sin], dim=-1)
    return out.flatten(3).type_as(x)


def permute_rotary(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of a query or key projection (or the per-head columns of a query or key norm, given as a column)
    reordered per head from Llama's halves (``i``, ``i + d/2``) to vgen's interleaved pairs (``2i``, ``2i + 1``):
    the same rotation, so the same attention scores."""
    d = weight.shape[0] // heads
    order = torch.arange(d).view(2, d // 2).t().reshape(-1)
    return weight.view(heads, d, -1)[:, order].reshape(weight.shape)


def llama_block_weights(get: Callable[[str], torch.Tensor], src: str, dst: str, n_head: int,
                        kv_heads: int) -> dict[str, torch.Tensor]:
    """One decoder layer in ``transformers``' Llama key layout (``{src}self_attn.q_proj.weight``, ``mlp.*``, the
    two RMSNorms) as the keys of a vgen :class:`~vgen.models.llamagen.TransformerBlock` under ``dst``: query, key
    and value fused into ``attention.wqkv`` with the query and key rows in vgen's rotary order
    (:func:`permute_rotary`). ``get`` reads one tensor by key (a dict's ``__getitem__``, a safetensors reader)."""
    q = permute_rotary(get(src + "self_attn.q_proj.weight"), n_head)
    k = permute_rotary(get(src + "self_attn.k_proj.weight"), kv_heads)
    return {dst + "attention.wqkv.weight": torch.cat([q, k, get(src + "self_attn.v_proj.weight")]),
            dst + "attention.wo.weight": get(src + "self_attn.o_proj.weight"),
            dst + "feed_forward.w1.weight": get(src + "mlp.gate_proj.weight"),
            dst + "feed_forward.w3.weight": get(src + "mlp.up_proj.weight"),
            dst + "feed_forward.w2.weight": get(src + "mlp.down_proj.weight"),
            dst + "attention_norm.weight": get(src + "input_layernorm.weight"),
            dst + "ffn_norm.weight": get(src + "post_attention_layernorm.weight")}


class PrefixMask:
    """An attention mask under which query ``i`` sees exactly the keys ``0 .. ends[i] - 1``, with ``ends``
    non-decreasing: a causal mask, a block-causal one (NBP's), or NAR's proximity mask with the slots in diagonal
    order. Attention then runs in query chunks, each over only the keys its last query sees, which skips the
    masked-out upper part (about half of a long sequence's score matrix) that a dense mask computes and discards.

    ``min_chunk``: queries a chunk holds at least (fewer, larger kernel calls against a little masked work)."""

    def __init__(self, ends: torch.Tensor, min_chunk: int = 64) -> None:
        ends = ends.long()
        if ends.ndim != 1 or len(ends) == 0 or (ends[1:] < ends[:-1]).any() or ends[0] < 1:
            raise ValueError("a prefix mask needs a non-empty, non-decreasing row of key counts >= 1")
        self.ends = ends
        dense = torch.arange(int(ends[-1]), device=ends.device)[None, :] < ends[:, None]  # [t, keys]
        self.chunks: list[tuple[int, int, int, torch.Tensor | None]] = []  # (first query, query end, key end, mask)
        start = 0
        while start < len(ends):
            stop = min(start + min_chunk, len(ends))
            stop += int((ends[stop:] == ends[stop - 1]).sum())  # a run of equal key counts is never split
            end = int(ends[stop - 1])
            uniform = bool((ends[start:stop] == end).all())  # every query of the chunk sees the same keys
            self.chunks.append((start, stop, end, None if uniform else dense[start:stop, :end]))
            start = stop

    @classmethod
    def from_dense(cls, mask: torch.Tensor, min_chunk: int = 64) -> PrefixMask:
        """The prefix mask equal to a bool mask [t, keys] whose rows are growing prefixes; any other mask is refused."""
        ends = mask.sum(1)
        if (mask.ndim != 2 or not len(ends) or mask.shape[1] != int(ends.max())
                or not torch.equal(torch.arange(mask.shape[1], device=mask.device)[None, :] < ends[:, None], mask)):
            raise ValueError("the mask's rows are not growing prefixes of its keys")
        return cls(ends, min_chunk)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0) -> torch.Tensor:
        """``scaled_dot_product_attention`` of q [B, H, t, d] under this mask, chunk by chunk."""
        outs = [F.scaled_dot_product_attention(q[:, :, start:stop], k[:, :, :end], v[:, :, :end], attn_mask=mask,
                                               dropout_p=dropout_p)
                for start, stop, end, mask in self.chunks]
        return torch.cat(outs, dim=2)
