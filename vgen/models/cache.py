"""Preallocated key/value cache with rollback, shared by every attention backbone.

One buffer per layer of shape [B, H, max_len, D] is allocated once; ``append`` writes new keys and values at the
current length and returns views of everything cached so far, so decoding recomputes nothing and never
reallocates. ``crop(n)`` rolls the cache back to its first ``n`` positions: a speculative sampler calls it to
drop the keys of rejected draft tokens before the next verification. ``write`` is the static-shape variant for
compiled single-token decoding: it takes the position as a tensor and returns the whole buffers
(``row_slots(static=True)`` does the same for per-row windows). ``mask_keys`` records which positions of a
left-padded prefix are padding, per row, for the backbone to mask in every later pass.

A per-row pass may also write a tree of drafts (:class:`DraftTree`, ``row_slots(tree=)``): node i takes slot
``start + i`` and position ``start + depth[i]``, and sees the row's prefix and its own ancestors; ``move_slots``
then moves the accepted path's keys to the slots of their positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class RowSlots:
    """Where one pass with per-row starts writes (:meth:`KVCache.row_slots`), worked out once for all layers:
    the slots [B, n], their maximum + 1 (``end``), which cached keys each query may see (``attend``, bool
    [B, 1, n, end]: its own row's keys up to its own slot; NAR's scattered diagonals pass their proximity mask),
    ``common_start``, the first slot when every row starts there (then a write is a plain slice, as at batch 1
    with or without CFG), and the queries' ``positions`` [B, n] (the rotary index) where they differ from their
    slots (a tree pass), None where they are the slots."""

    slots: torch.Tensor
    end: int
    attend: torch.Tensor
    common_start: int | None
    positions: torch.Tensor | None = None

    @property
    def position_ids(self) -> torch.Tensor:
        """Each query's position [B, n]: ``positions``, or the slots when None."""
        return self.slots if self.positions is None else self.positions


class DraftTree(Protocol):
    """What a tree verify pass needs of its draft tree (the samplers' ``TreeShape`` is one; models do not import
    it): T nodes numbered so that every parent comes before its children, node 0 the root."""

    @property
    def depth(self) -> torch.Tensor:
        """LongTensor [T]: each node's distance from the root (0 for the root)."""
        ...

    def ancestors(self) -> torch.Tensor:
        """bool [T, T]: ``[i, j]`` True where node j is node i or one of its ancestors."""
        ...


def tree_attend(ancestors: torch.Tensor, keys: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """Which of the ``keys`` [K] (slots) each node of a tree written from slots ``starts`` [B] sees, bool [B, T, K]:
    every key before its row's start, and the slots of its ancestors and its own (``ancestors`` bool [T, T])."""
    nodes = ancestors.shape[0]
    rel = keys[None, :] - starts[:, None]  # [B, K]: the node a key holds, where 0 <= rel < T
    inside = ((rel >= 0) & (rel < nodes))[:, None, :]
    seen = ancestors[:, rel.clamp(0, nodes - 1)].transpose(0, 1)  # [B, T, K]
    return (rel < 0)[:, None, :] | (inside & seen)


class KVCache:
    """Per-layer key/value buffers plus the number of valid positions ``length`` (shared by the batch)."""

    def __init__(self, num_layers: int, batch_size: int, num_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> None:
        shape = (batch_size, num_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_len = max_len
        self.length = 0
        # bool [B, max_len], True = attendable: the padding of a left-padded prefix stays masked for every later
        # query of its row (None: every cached key is attendable)
        self.key_mask: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.keys[0].shape[0]

    def reserve(self, num_new: int) -> int:
        """Check that ``num_new`` more positions fit; returns the position the first of them will take."""
        if self.length + num_new > self.max_len:
            raise ValueError(f"KV cache overflow: {self.length} cached + {num_new} new > max_len {self.max_len}")
        return self.length

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write [B, H, n, D] keys/values of ``layer`` after the cached ones; return all keys/values so far.

        ``length`` does not move until :meth:`advance`, so every layer of one forward pass writes the same slots.
        """
        start, end = self.length, self.length + k.shape[2]
        self.keys[layer][:, :, start:end] = k
        self.values[layer][:, :, start:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor,
              slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Static-shape :meth:`append` for compiled decoding: write [B, H, n, D] keys/values of ``layer`` at the
        positions ``slots`` (LongTensor [n]) and return the whole buffers [B, H, max_len, D].

        The positions come as a tensor, not from ``length``, so a compiled graph does not depend on how full the
        cache is; the caller masks the slots past its query and moves ``length`` with :meth:`advance`.
        """
        self.keys[layer].index_copy_(2, slots, k)
        self.values[layer].index_copy_(2, slots, v)
        return self.keys[layer], self.values[layer]

    def write_rows(self, layer: int, k: torch.Tensor, v: torch.Tensor,
                   rows: RowSlots) -> tuple[torch.Tensor, torch.Tensor]:
        """Write [B, H, n, D] keys/values of ``layer`` at the per-row positions of ``rows`` and return the first
        ``rows.end`` positions of every row.

        For batches whose rows advance independently (speculative decoding): the caller tracks each row's
        valid length and masks the slots past it (``rows.attend``); ``length`` is not used.
        """
        if rows.common_start is not None:
            self.keys[layer][:, :, rows.common_start:rows.end] = k
            self.values[layer][:, :, rows.common_start:rows.end] = v
        else:  # indexed assignment, not scatter_: compiled, scatter_ copied the whole buffer at every write
            batch = torch.arange(k.shape[0], device=k.device)[:, None]
            self.keys[layer][batch, :, rows.slots] = k.transpose(1, 2)
            self.values[layer][batch, :, rows.slots] = v.transpose(1, 2)
        return self.keys[layer][:, :, :rows.end], self.values[layer][:, :, :rows.end]

    def row_slots(self, starts: torch.Tensor, count: int, static: bool = False, span: int | None = None,
                  tree: DraftTree | None = None) -> RowSlots:
        """The :class:`RowSlots` of a per-row write of ``count`` positions from ``starts`` [B] (checked to fit).

        ``static``: shapes that do not depend on ``starts`` (for compiled verify passes): every write scatters and
        attention spans the whole buffer under the mask, or its first ``span`` slots when the caller knows that
        every write ends there, with no device sync; the caller sized the cache so the writes fit
        (``new_cache(extra=)``), since checking would need one.

        ``tree`` (``count`` nodes): node i still takes slot ``starts + i``, but sits at position
        ``starts + depth[i]`` and sees only the keys before ``starts`` and its ancestors' (:func:`tree_attend`)."""
        if tree is not None and tree.depth.shape != (count,):
            raise ValueError(f"a tree of {len(tree.depth)} nodes cannot fill a window of {count} slots")
        slots = starts[:, None] + torch.arange(count, device=starts.device)
        if static:
            end, common = self.max_len if span is None else span, None
        else:
            first, last = torch.stack([starts.min(), starts.max()]).tolist()  # one device sync
            end, common = last + count, first if first == last else None
            if end > self.max_len:
                raise ValueError(f"KV cache overflow: slot {end - 1} requested, max_len {self.max_len}")
        keys = torch.arange(end, device=starts.device)
        if tree is None:
            return RowSlots(slots, end, (keys[None, None, :] <= slots[:, :, None])[:, None], common)
        attend = tree_attend(tree.ancestors().to(starts.device), keys, starts)
        return RowSlots(slots, end, attend[:, None], common, starts[:, None] + tree.depth.to(starts.device))

    def move_slots(self, src: torch.Tensor, dst: torch.Tensor, mask: torch.Tensor) -> None:
        """In every layer, copy row b's keys and values at slot ``src[b, i]`` to slot ``dst[b, i]`` where
        ``mask[b, i]`` (all [B, n]; where ``mask``, ``dst[b, i]`` is no other entry's of its row): after a tree
        pass, the accepted path's keys move to the slots of their positions (a key is rotated at its position, not
        its slot, so the copy is exact).

        Each buffer is read whole before it is written, so ``src`` and ``dst`` may overlap; the shapes do not
        depend on the values (an entry masked out rewrites what its ``dst`` holds), for compiled passes."""
        batch = torch.arange(src.shape[0], device=src.device)[:, None]
        keep = mask[:, :, None, None]
        for buffer in self.buffers():
            buffer[batch, :, dst] = torch.where(keep, buffer[batch, :, src], buffer[batch, :, dst])

    def mask_keys(self, mask: torch.Tensor) -> None:
        """Set which of the first ``mask.shape[1]`` positions of each row may be attended to (``mask`` bool [B, n],
        False on a prefix's padding); every later position may be. Written in place into one buffer, so its
        address stays fixed for CUDA graphs; per row and untouched by :meth:`crop` and per-row writes."""
        if self.key_mask is None:
            self.key_mask = torch.ones(self.batch_size, self.max_len, dtype=torch.bool, device=self.keys[0].device)
        self.key_mask.fill_(True)
        self.key_mask[:, :mask.shape[1]] = mask

    def attendable(self, pattern: torch.Tensor | None, end: int) -> torch.Tensor | None:
        """``pattern`` (True = attend, over the first ``end`` cached keys; None = all of them) with the padded keys
        of :meth:`mask_keys` masked out per row; None (the pass keeps its own pattern) when no prefix padding is
        recorded."""
        if self.key_mask is None:
            return None
        keys = self.key_mask[:, None, None, :end]
        return keys if pattern is None else pattern & keys

    def buffers(self) -> list[torch.Tensor]:
        """Every key and value buffer (e.g. to mark their addresses static for CUDA graphs)."""
        return [*self.keys, *self.values]

    def advance(self, num_new: int) -> None:
        """Mark the ``num_new`` positions written by the finished forward pass as cached."""
        self.length += num_new

    def crop(self, length: int) -> None:
        """Keep only the first ``length`` positions (later writes overwrite the rest)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of length {self.length} to {length}")
        self.length = length
