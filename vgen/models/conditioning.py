"""The conditioning contract: what a backbone is conditioned on, and what every backbone answers about it.

A *condition* is one of
- class ids, a 1-D integer tensor [B] (the class-conditional backbones), or
- a :class:`PrefixCondition`: a per-row prefix run before the image tokens, left-padded to one length, with its
  attention mask: caption embeddings [B, L, D] (LlamaGen-T2I) or prompt token ids [B, L] (Janus-Pro).

Samplers never look inside a condition. They ask the backbone to check it (``check_condition``), to give its
unconditional form for classifier-free guidance (``null_condition``, stacked after it as the batch
``[cond; null]`` by :func:`cat_conditions`), and to run it into a KV cache (``prefill``); so every sampler runs on
every kind of conditioning.

Each backbone keeps its settings in ``self.config``; the mixins below read them from there, so a sampler or a
pipeline can ask any backbone the same questions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vgen.models.layout import TokenLayout


@dataclass(frozen=True)
class PrefixCondition:
    """A left-padded prefix per row: ``values`` [B, L, D] embeddings or [B, L] token ids, and ``mask`` [B, L]
    (bool, True on real positions). Left padding puts each row's real positions last, so the image tokens follow
    the prompt directly in every row; the padding is masked out of attention.

    ``null`` (optional): the rows' own unconditional prefix for classifier-free guidance (a negative prompt, of its
    own length), which a backbone's ``null_condition`` returns; it travels with its rows through indexing, ``to``
    and :func:`cat_conditions`."""

    values: torch.Tensor
    mask: torch.Tensor
    null: PrefixCondition | None = None

    def __post_init__(self) -> None:
        if self.values.ndim not in (2, 3):
            raise ValueError(f"prefix values must be [B, L] token ids or [B, L, D] embeddings, got shape "
                             f"{tuple(self.values.shape)}")
        if self.mask.dtype != torch.bool or tuple(self.mask.shape) != tuple(self.values.shape[:2]):
            raise ValueError(f"prefix mask must be a bool tensor of shape {tuple(self.values.shape[:2])}, got "
                             f"{self.mask.dtype} of shape {tuple(self.mask.shape)}")
        if (self.mask[:, :-1] & ~self.mask[:, 1:]).any():
            raise ValueError("prefix mask must be left-padded: padding first, then each row's real positions")
        if not self.mask[:, -1].all():
            raise ValueError("every row of a prefix needs at least one real position")
        if self.null is not None and len(self.null) != len(self):
            raise ValueError(f"the null prefix has {len(self.null)} rows for a prefix of {len(self)}")

    @classmethod
    def from_padded(cls, values: torch.Tensor, mask: torch.Tensor | None, length: int) -> PrefixCondition:
        """Embeddings [B, L, D] with their attention mask [B, L] (1 or True on real positions; None: all real),
        padded in any layout (a text encoder's right padding included), as the left-padded condition of ``length``
        positions that LlamaGen-T2I takes: each row's real positions in order and last, zeros before them
        (LlamaGen's ``sample_t2i.py``)."""
        if values.ndim != 3:
            raise ValueError(f"prompt_embeds must be [batch, tokens, features], got shape {tuple(values.shape)}")
        if mask is None:
            mask = torch.ones(values.shape[:2], dtype=torch.bool, device=values.device)
        if tuple(mask.shape) != tuple(values.shape[:2]):
            raise ValueError(f"prompt_attention_mask of shape {tuple(mask.shape)} does not fit prompt_embeds of shape "
                             f"{tuple(values.shape)}: expected {tuple(values.shape[:2])}")
        mask = mask.to(values.device).bool()
        counts = mask.sum(1)
        if not len(counts) or bool((counts == 0).any()):
            raise ValueError("every prompt needs at least one token: a row of prompt_attention_mask has none")
        if int(counts.max()) > length:
            raise ValueError(f"a prompt of {int(counts.max())} tokens is longer than the model's {length} caption "
                             f"positions")
        order = torch.argsort(mask.int(), dim=1, stable=True)  # padding first, real positions last, each in order
        values = values.gather(1, order[..., None].expand_as(values))
        mask = mask.gather(1, order)
        if mask.shape[1] >= length:
            values, mask = values[:, -length:], mask[:, -length:]
        else:
            pad = length - mask.shape[1]
            values = torch.cat([values.new_zeros(len(values), pad, values.shape[2]), values], dim=1)
            mask = torch.cat([mask.new_zeros(len(mask), pad), mask], dim=1)
        return cls(values * mask[..., None], mask)

    def __len__(self) -> int:
        return self.values.shape[0]

    def __getitem__(self, rows: slice | torch.Tensor) -> PrefixCondition:
        """The rows ``rows`` (a slice or an index tensor), as class ids [B] are indexed."""
        return PrefixCondition(self.values[rows], self.mask[rows], None if self.null is None else self.null[rows])

    @property
    def length(self) -> int:
        """Positions per row, padding included."""
        return self.values.shape[1]

    def causal_mask(self) -> torch.Tensor:
        """The attention mask [B, 1, L, L] of a prefill over this prefix: causal, with the padding seen by no query
        but itself (a query that sees nothing would give NaNs)."""
        positions = torch.arange(self.length, device=self.device)
        causal = positions[None, :] <= positions[:, None]
        return (causal & self.mask[:, None, None, :]) | torch.eye(self.length, dtype=torch.bool, device=self.device)

    @property
    def device(self) -> torch.device:
        return self.values.device

    def to(self, device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> PrefixCondition:
        """On ``device``; ``dtype`` casts embeddings (token ids keep theirs)."""
        values = self.values.to(device)
        if dtype is not None and values.is_floating_point():
            values = values.to(dtype)
        return PrefixCondition(values, self.mask.to(device), None if self.null is None else self.null.to(device, dtype))


Condition = torch.Tensor | PrefixCondition
"""Class ids [B] or a :class:`PrefixCondition`."""


def check_prompt_ids(cond: PrefixCondition, max_tokens: int, vocab_size: int, name: str = "prompt") -> None:
    """Raise a ValueError unless ``cond`` holds token ids [B, L] of a ``vocab_size`` vocabulary, at most
    ``max_tokens`` positions long (padding included): the prompts of models that embed their own text tokens."""
    if cond.values.ndim != 2 or cond.values.is_floating_point():
        raise ValueError(f"a {name} is token ids [B, L], got {cond.values.dtype} of shape {tuple(cond.values.shape)}")
    if cond.length > max_tokens:
        raise ValueError(f"{name} of {cond.length} tokens (padding included) is longer than this model's limit of "
                         f"{max_tokens} (max_prompt_tokens)")
    ids = cond.values[cond.mask]
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"{name} token ids must lie in [0, {vocab_size})")


def check_caption_features(cond: PrefixCondition, positions: int, dim: int, limits: tuple[str, str],
                           exact: bool = False) -> None:
    """Raise a ValueError unless ``cond`` holds caption features [B, L, ``dim``] (floating point) with L equal to
    ``positions`` (``exact``: a model whose captions are padded to a fixed length) or at most ``positions``: the
    captions of models that take a text encoder's features. ``limits`` names the model's two config fields, for
    positions and for dim, in the messages."""
    values, (length_name, dim_name) = cond.values, limits
    shape = f"[B, {'' if exact else '<= '}{positions}, {dim}]"
    if values.ndim != 3 or not values.is_floating_point():
        raise ValueError(f"a caption is features {shape}, got {values.dtype} of shape {tuple(values.shape)}")
    if values.shape[2] != dim:
        raise ValueError(f"caption features of dimension {values.shape[2]} do not fit this model's {dim_name} {dim}")
    if exact and values.shape[1] != positions:
        raise ValueError(f"a caption of {values.shape[1]} positions does not fit this model's {length_name} "
                         f"{positions}: left-pad (or truncate) the prompt to {positions}")
    if not exact and cond.length > positions:
        raise ValueError(f"a caption of {cond.length} positions is longer than this model's {length_name} "
                         f"{positions}")


def cat_conditions(conditions: Sequence[Condition]) -> Condition:
    """Rows of several conditions of one kind stacked in order (the CFG batch ``[cond; null]``). Prompts of token
    ids are left-padded to the longest (id 0, masked); prefixes of embeddings must have one length. The ``null``
    prefixes are stacked too when every condition has one."""
    if all(isinstance(c, torch.Tensor) for c in conditions):
        return torch.cat(list(conditions))
    if all(isinstance(c, PrefixCondition) for c in conditions):
        lengths = {c.length for c in conditions}
        if len(lengths) != 1 and any(c.values.ndim != 2 for c in conditions):
            raise ValueError(f"prefixes of different lengths {sorted(lengths)} cannot be stacked; pad them to one")
        length = max(lengths)
        values = torch.cat([F.pad(c.values, (length - c.length, 0)) if c.values.ndim == 2 else c.values
                            for c in conditions])
        mask = torch.cat([F.pad(c.mask, (length - c.length, 0)) for c in conditions])
        nulls = [c.null for c in conditions]
        return PrefixCondition(values, mask, None if any(n is None for n in nulls) else cat_conditions(nulls))
    raise TypeError(f"cannot stack conditions of different kinds: {[type(c).__name__ for c in conditions]}")


class ClassConditional:
    """A model conditioned on ``config.num_classes`` classes through a table with one extra (null) row."""

    config: Any

    @property
    def num_classes(self) -> int:
        return self.config.num_classes

    def null_condition(self, class_ids: torch.Tensor) -> torch.Tensor:
        """The unconditional counterpart of ``class_ids`` (the null class row), for CFG."""
        return torch.full_like(class_ids, self.config.num_classes)

    def check_condition(self, cond: Condition) -> None:
        """Raise a ValueError unless ``cond`` is a 1-D integer tensor of valid (non-null) class ids."""
        if isinstance(cond, PrefixCondition):
            raise ValueError(f"{type(self).__name__} is class-conditional: give class ids, not a text prompt")
        if cond.ndim != 1 or cond.dtype.is_floating_point or cond.dtype == torch.bool:
            raise ValueError(f"class_ids must be a 1-D integer tensor, got {cond.dtype} of shape {tuple(cond.shape)}")
        bad = cond[(cond < 0) | (cond >= self.num_classes)]
        if bad.numel():
            n = self.num_classes
            raise ValueError(f"class id {int(bad[0])} is out of range for a model with {n} classes (valid: 0..{n - 1})")


class TokenGrid:
    """A model over ``config.num_tokens`` discrete tokens of ``config.vocab_size`` codes laid out on
    ``config.grid`` ((rows, columns) or (frames, rows, columns))."""

    config: Any

    @property
    def grid(self) -> tuple[int, ...]:
        return self.config.grid

    @property
    def num_tokens(self) -> int:
        return self.config.num_tokens

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def token_layout(self) -> TokenLayout:
        """Where the model's sequence holds fixed tokens among the codes: none (every position a code, rows of the
        grid's last axis)."""
        return TokenLayout((math.prod(self.grid[:-1]), self.grid[-1]))

    def code_embeddings(self) -> torch.Tensor:
        """The input embedding of each code [vocab_size, width] (GSD's latent distances)."""
        return self.tok_embeddings.weight


class TokenGridModel(ClassConditional, TokenGrid):
    """A class-conditional :class:`TokenGrid` model."""


def init_llamagen_weights(module: nn.Module) -> None:
    """LlamaGen's initialisation, applied module by module: N(0, 0.02) for linear weights and embeddings."""
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)
