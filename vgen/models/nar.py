"""NAR: a class-conditional neighbouring autoregressive transformer (He et al., arXiv 2503.10696) over an image
grid H x W or a video grid T x H x W, built from LlamaGen's blocks.

Order. Step ``s`` generates every token at Manhattan distance ``s`` from the first one (coordinates summing to
``s``), in raster order within the step, as NAR's samplers do: ``H + W - 1`` steps for an image, ``T + H + W - 2``
for a video. Step 0 is the prefill on the class position.

Proximity mask. Token ``i`` sees token ``j`` iff ``d(j) <= d(i)``: every earlier step and the whole of its own
step (NAR's ``setup_diagonal_mask``, bidirectional within a diagonal). Every token sees the class position, which
sees only itself. No target leaks: a token at distance ``d`` only predicts neighbours at ``d + 1``.

Dimension-oriented heads. Head ``a`` predicts the next token along axis ``rank - 1 - a`` (images: right, below;
video: right, below, next frame) and reads the hidden state after ``n_layer + a`` blocks, each head with its own
RMSNorm and output layer (NAR's R/B heads on images, R/D/B on video). The logits of a token are the mean over
the heads whose predecessor exists (1 to ``rank`` of them); the first token takes the mean of every head at the
class position.

Frame 0 first (``image_first=True``, video only; vgen's addition, after NBP's hybrid start). Frame 0 is laid out
as an image: its cells keep their distances ``h + w`` and see only frame 0, so it is drawn in ``H + W - 1`` steps
exactly as an image NAR model of the frame grid draws an image. The other frames follow in the 3-D order, every
distance raised by ``H + W - 2``, so they see all of frame 0: ``T + 2 (H + W) - 4`` steps in all. The first token
takes the spatial heads at the class position, as an image model does; every later cell takes NAR's rule, so
frame 1's cells take the next-frame head at frame 0's cells. Those were fed many steps earlier, so decoding keeps
their last hidden state in the cache (:class:`NARCache`) and runs the next-frame head on it when frame 1 needs it.

Sequence layout: slot 0 holds the class embedding and slot ``1 + p`` the token at raster position ``p``, which is
where its keys and values are written in the KV cache whatever the step that produced it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from vgen.models.backbone import AXIS_NAMES, GridConfig
from vgen.models.cache import KVCache, RowSlots
from vgen.models.conditioning import TokenGridModel, init_llamagen_weights
from vgen.models.config_fields import declare
from vgen.models.layers import PrefixMask, RMSNorm, frame_offsets
from vgen.models.linear import Linear
from vgen.models.llamagen import LabelEmbedder, TransformerBlock


@dataclass(frozen=True)
class NARConfig(GridConfig):
    """LlamaGen's ``ModelArgs`` over a token grid ((H, W) or (T, H, W); :class:`~vgen.models.backbone.GridConfig`)
    and whether a video's frame 0 is drawn first (``image_first``); the model has ``n_layer`` blocks plus one more
    per extra head (``rank - 1``), as NAR stacks them. ``rope="spatial"`` lets an image NAR model's weights start a
    video one (``vgen.training.nar.warm_start``)."""

    image_first: bool = declare(False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.image_first and self.rank != 3:
            raise ValueError(f"image_first draws frame 0 of a video grid (frames, rows, columns) first, "
                             f"got {self.grid}")


@dataclass(frozen=True)
class TeacherForcedPass:
    """A teacher-forced pass over the class and the first raster positions: its slots in step order (``order``),
    where the proximity mask lets every query see a prefix of the keys (``mask``), the permutation back to slot
    order (``restore``) and which row feeds which head for each position (``link``)."""

    order: torch.Tensor
    restore: torch.Tensor
    mask: PrefixMask
    link: tuple[torch.Tensor, torch.Tensor]


class NeighbourLayout:
    """Next-neighbour order on a raster grid: distances, steps, the proximity mask, and which input feeds which
    head for each target. Pure bookkeeping, built once per model (index tensors on one device). ``image_first``
    (video) lays frame 0 out as an image ahead of the other frames."""

    def __init__(self, grid: tuple[int, ...], device: torch.device | str = "cpu", image_first: bool = False) -> None:
        self.grid = tuple(grid)
        self.image_first = image_first
        rank = len(grid)
        coords = torch.cartesian_prod(*(torch.arange(n, device=device) for n in grid)).reshape(-1, rank)
        self.coords = coords  # [N, rank], raster order
        self.distance = coords.sum(1)  # [N]
        self.strides = [math.prod(grid[a + 1:]) for a in range(rank)]
        # the first token takes these heads at the class slot: every one (NAR's rule), the spatial ones when frame 0
        # opens as an image
        self.first_heads = torch.ones(rank, dtype=torch.bool, device=device)
        if image_first:
            self.first_heads[-1] = False
            if grid[0] > 1:
                self.distance = self.distance + (coords[:, 0] > 0) * (grid[1] + grid[2] - 2)
        self.num_steps = int(self.distance.max()) + 1
        self.steps = [torch.nonzero(self.distance == s).flatten() for s in range(self.num_steps)]
        n = len(coords)
        seen = torch.ones(1 + n, 1 + n, dtype=torch.bool, device=device)
        seen[1:, 1:] = self.distance[None, :] <= self.distance[:, None]
        seen[0, 1:] = False
        self.mask = seen  # [1 + N, 1 + N] over slots: class, then raster positions
        # slots fed at step s (the class at step 0, else step s - 1's tokens) and the keys they may see
        self.inputs = [torch.zeros(1, dtype=torch.long, device=device)] + [1 + p for p in self.steps[:-1]]
        # frame 1's cells take the next-frame head at frame 0's cells, which were fed many steps earlier (image_first):
        # decoding keeps the last hidden state of frame 0's cells (``kept``: rows of the inputs) and runs the head
        # again on those a step's targets need (``held``: frame 0 positions, rows after the inputs in ``links``)
        frame = self.kept_cells = grid[1] * grid[2] if image_first and grid[0] > 1 else 0
        self.kept = [torch.nonzero((i >= 1) & (i <= frame)).flatten() for i in self.inputs]
        self.held = []
        for i, t in zip(self.inputs, self.steps):
            below = t[(t >= frame) & (t < 2 * frame)] - frame
            self.held.append(below[~torch.isin(1 + below, i)])
        self.links = [self.link(i, t, h) for i, t, h in zip(self.inputs, self.steps, self.held)]
        self.key_ends = [int(torch.nonzero(seen[i].any(0)).max()) + 1 for i in self.inputs]
        # slots cached before step s's tokens are fed: the class and steps 0..s-1
        self.cached_before = [1 + sum(len(t) for t in self.steps[:s]) for s in range(self.num_steps)]
        # the slots in step order (the class, then step by step): there the proximity mask is a prefix of the keys
        # for every query, which a teacher-forced pass attends in chunks (PrefixMask)
        self.order = torch.cat([torch.zeros(1, dtype=torch.long, device=device), 1 + torch.cat(self.steps)])
        # teacher-forced passes by token count: the whole grid, and frame 0 alone when it comes first
        self.passes = {n: self.teacher_forced(n)}
        if image_first and grid[0] > 1:
            self.passes[grid[1] * grid[2]] = self.teacher_forced(grid[1] * grid[2])

    def teacher_forced(self, length: int) -> TeacherForcedPass:
        """The teacher-forced pass over the class and raster positions ``0 .. length - 1``, which must be the first
        steps (the whole grid, or frame 0 when it comes first)."""
        order = self.order[:1 + length]
        if not torch.equal(order.sort().values, torch.arange(1 + length, device=order.device)):
            raise ValueError(f"the first {length} raster positions are not the first steps of the {self.grid} grid")
        return TeacherForcedPass(order, torch.argsort(order), PrefixMask.from_dense(self.mask[order][:, order]),
                                 self.link(torch.arange(1 + length, device=order.device),
                                           torch.arange(length, device=order.device)))

    def link(self, inputs: torch.Tensor, targets: torch.Tensor,
             held: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """For each head a and target, the row holding its predecessor and whether it exists: ``src, valid``
        [rank, len(targets)]. Rows are the slots ``inputs``, then for the last head the positions ``held``. Head a's
        predecessor of position p is p minus one step along axis ``rank - 1 - a``; the first position's predecessor
        is the class slot for the heads ``first_heads``."""
        rank = len(self.grid)
        row = torch.full((1 + len(self.coords),), -1, dtype=torch.long, device=inputs.device)
        if held is not None:
            row[1 + held] = len(inputs) + torch.arange(len(held), device=inputs.device)
        row[inputs] = torch.arange(len(inputs), device=inputs.device)
        first = targets == 0
        src, valid = [], []
        for a in range(rank):
            axis = rank - 1 - a
            ok = torch.where(first, self.first_heads[a], self.coords[targets, axis] > 0)
            slot = torch.where(first, 0, 1 + targets - self.strides[axis])
            src.append(torch.where(ok, row[slot.clamp(min=0)], 0))
            valid.append(ok)
        src, valid = torch.stack(src), torch.stack(valid)
        if (src[valid] < 0).any() or (src[:-1] >= len(inputs)).any():
            raise ValueError("a predecessor of the targets is not among the inputs")
        return src, valid

    def to(self, device: torch.device) -> NeighbourLayout:
        return NeighbourLayout(self.grid, device, self.image_first)


def combine_heads(head_logits: list[torch.Tensor], src: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Logits [B, n_out, V] of the targets: per target the mean, over heads with a predecessor, of that head's
    logits [B, n_in, V] at the predecessor's row (``src``, ``valid`` from :meth:`NeighbourLayout.link`)."""
    total = None
    for logits, s, ok in zip(head_logits, src, valid):
        picked = logits[:, s] * ok[None, :, None]
        total = picked if total is None else total + picked
    return total / valid.sum(0)[None, :, None]


class OutputHead(nn.Module):
    """One dimension-oriented head: its own RMSNorm and output layer."""

    def __init__(self, dim: int, vocab_size: int, eps: float) -> None:
        super().__init__()
        self.norm = RMSNorm(dim, eps)
        self.output = Linear(dim, vocab_size, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.output(self.norm(h)).float()


class NARCache(KVCache):
    """A NAR model's KV cache, plus the last hidden state of frame 0's cells (``frame0`` [B, H * W, dim]; empty
    unless the model draws frame 0 first), from which frame 1's cells take the next-frame head."""

    def __init__(self, num_layers: int, batch_size: int, num_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                 frame_tokens: int = 0, dim: int = 0) -> None:
        super().__init__(num_layers, batch_size, num_heads, max_len, head_dim, dtype, device)
        self.frame0 = torch.zeros(batch_size, frame_tokens, dim, dtype=dtype, device=device)

    def buffers(self) -> list[torch.Tensor]:
        return [*super().buffers(), self.frame0]


class NARTransformer(TokenGridModel, nn.Module):
    """Class-conditional NAR over ``config.grid``; tokens are always handled in raster order [B, N]."""

    token_order: ClassVar[str] = "next-neighbour"

    def __init__(self, config: NARConfig) -> None:
        super().__init__()
        self.config = config
        self.cls_embedding = LabelEmbedder(config.num_classes, config.dim, config.class_dropout_prob)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.tok_dropout = nn.Dropout(config.token_dropout_p)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layer + config.rank - 1))
        self.heads = nn.ModuleList(OutputHead(config.dim, config.vocab_size, config.norm_eps)
                                   for _ in range(config.rank))
        if config.rope == "spatial":
            self.frame_embedding = nn.Embedding(config.grid[0], config.dim)
        # plain attributes, not buffers: the rope table stays fp32 when the model is cast (as in LlamaGen)
        self.rope = config.rope_table()
        self.layout = NeighbourLayout(config.grid, image_first=config.image_first)
        self.apply(init_llamagen_weights)
        for head in self.heads:
            nn.init.zeros_(head.output.weight)
        if config.rope == "spatial":
            nn.init.zeros_(self.frame_embedding.weight)

    # -- token layout ------------------------------------------------------------------------------------------
    @property
    def num_steps(self) -> int:
        """Forward passes to generate a grid: ``H + W - 1`` (image), ``T + H + W - 2`` (video) or
        ``T + 2 (H + W) - 4`` (video, ``image_first``)."""
        return self.layout.num_steps

    @property
    def steps(self) -> list[torch.Tensor]:
        """Raster positions generated at each step (ascending), on the model's device."""
        return self._layout().steps

    def _layout(self) -> NeighbourLayout:
        device = self.tok_embeddings.weight.device
        if self.layout.mask.device != device:
            self.layout = self.layout.to(device)
        if self.rope.device != device:
            self.rope = self.rope.to(device)
        return self.layout

    # -- forward passes ----------------------------------------------------------------------------------------
    def _heads(self, h: torch.Tensor, rope: torch.Tensor, mask: torch.Tensor | PrefixMask, cache: KVCache | None,
               slots: torch.Tensor, key_end: int = 0,
               restore: torch.Tensor | None = None) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Run every block over the sequence slots ``slots`` of ``h``; head a reads the hidden state after
        ``n_layer + a`` blocks, put back in slot order by ``restore`` when given. Returns the heads' logits and the
        last hidden state (the last head's input), in the order of ``slots``."""
        if self.config.rope == "spatial":  # slot 1 + p holds token p, in its frame
            h = h + frame_offsets(self.frame_embedding, slots, self.grid[1] * self.grid[2])
        if self.training:
            h = self.tok_dropout(h)
        # a diagonal's slots are scattered over the raster, so no slice write; the proximity mask is the attend
        rows = None if cache is None else RowSlots(slots[None].expand(h.shape[0], -1), key_end, mask, None)
        outputs = []
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, cache, i, rows=rows, mask=mask)
            if i >= self.config.n_layer - 1:
                outputs.append(self.heads[len(outputs)](h if restore is None else h[:, restore]))
        if cache is not None:
            cache.advance(h.shape[1])
        return outputs, h

    def head_logits(self, class_ids: torch.Tensor, tokens: torch.Tensor) -> list[torch.Tensor]:
        """Teacher-forced pass under the proximity mask: each head's logits [B, 1 + n, V] over the slots of the n
        tokens given (:meth:`forward`). The blocks run over the slots in step order, where the mask lets attention
        skip the keys no query of a chunk sees."""
        layout = self._layout()
        if tokens.ndim != 2 or tokens.shape[1] not in layout.passes:
            frame = (f" or [batch, {self.grid[1] * self.grid[2]}] (frame 0 alone, which comes first)"
                     if len(layout.passes) > 1 else "")
            raise ValueError(f"tokens must be [batch, {self.num_tokens}] (the whole {self._grid_text()} grid in raster "
                             f"order){frame}, got shape {tuple(tokens.shape)}")
        tf = layout.passes[tokens.shape[1]]
        h = torch.cat([self.cls_embedding(class_ids), self.tok_embeddings(tokens)], dim=1)[:, tf.order]
        return self._heads(h, self.rope[tf.order], tf.mask, None, tf.order, restore=tf.restore)[0]

    def forward(self, class_ids: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [B, n, V] in raster order: row p predicts token p from every token nearer the origin (training
        and the reference for cached decoding). ``tokens`` is the whole grid, unshifted, or with ``image_first``
        frame 0 alone [B, H * W], whose cells see only frame 0 (a first frame to learn from, as NBP's)."""
        return combine_heads(self.head_logits(class_ids, tokens), *self._layout().passes[tokens.shape[1]].link)

    def new_cache(self, batch_size: int, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> NARCache:
        """An empty cache with a slot for the class and for every raster position (and, with ``image_first``, room
        for frame 0's last hidden states)."""
        p = self.tok_embeddings.weight
        return NARCache(len(self.layers), batch_size, self.config.kv_heads, 1 + self.num_tokens,
                        self.config.head_dim, dtype or p.dtype, device or p.device, self.layout.kept_cells,
                        self.config.dim)

    def prefill(self, class_ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Run the class position into an empty cache; logits [B, 1, V] of step 0 (the first token)."""
        if cache.length != 0:
            raise ValueError(f"prefill needs an empty cache, this one holds {cache.length} positions")
        return self._step(self.cls_embedding(class_ids), 0, cache)

    def decode(self, tokens: torch.Tensor, step: int, cache: KVCache) -> torch.Tensor:
        """Feed the tokens [B, n] generated at ``step`` (raster order within the step) and return the logits
        [B, n', V] of step ``step + 1``; their keys and values go to the cache at their raster slots."""
        layout = self._layout()
        if not 0 <= step < self.num_steps - 1:
            raise ValueError(f"step must be in 0..{self.num_steps - 2} (the last of {self.num_steps} steps feeds "
                             f"nothing), got {step}")
        count = len(layout.steps[step])
        if tokens.ndim != 2 or tokens.shape[1] != count:
            raise ValueError(f"step {step} of the {self._grid_text()} grid has {count} tokens, got tokens of shape "
                             f"{tuple(tokens.shape)}")
        held = layout.cached_before[step]
        if cache.length != held:
            raise ValueError(f"decoding step {step} needs a cache holding the class and steps 0..{step - 1} "
                             f"({held} positions), this one holds {cache.length}")
        return self._step(self.tok_embeddings(tokens), step + 1, cache)

    def _step(self, h: torch.Tensor, target_step: int, cache: KVCache) -> torch.Tensor:
        layout = self._layout()
        if layout.kept_cells and not (isinstance(cache, NARCache) and cache.frame0.shape[1] == layout.kept_cells):
            raise ValueError(f"this model draws frame 0 first and keeps its {layout.kept_cells} cells' hidden "
                             f"states for frame 1: decode with a cache from its new_cache()")
        slots, end = layout.inputs[target_step], layout.key_ends[target_step]
        heads, last = self._heads(h, self.rope[slots], layout.mask[slots, :end], cache, slots, end)
        kept, held = layout.kept[target_step], layout.held[target_step]
        if len(kept):
            cache.frame0[:, slots[kept] - 1] = last[:, kept]
        if len(held):
            heads[-1] = torch.cat([heads[-1], self.heads[-1](cache.frame0[:, held])], dim=1)
        return combine_heads(heads, *layout.links[target_step])

    def _grid_text(self) -> str:
        return " x ".join(f"{n} {name}" for n, name in zip(self.grid, AXIS_NAMES[self.config.rank]))
