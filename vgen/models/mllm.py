"""A multimodal language model that writes an image as codes between fixed tokens (Emu3, Lumina-mGPT/Chameleon).

:class:`LayoutLM` is a Llama (or Chameleon: ``qk_norm``) language model over a whole text-and-image vocabulary,
made a vgen backbone over the image codes alone: its inputs embed every id through the full table, its head keeps
only the rows of the image codes (``head.weight = lm_head.weight[code_ids]``, ``code_ids`` the text id of each code),
so samplers see ``vocab_size`` codes on a ``grid`` and nothing else. The fixed tokens of its
:class:`~vgen.models.layout.TokenLayout` (a row end after every row of codes) are written by the backbone: every
pass feeds the row ends after the codes it feeds and returns the outputs that predict codes, so a pass over a
window of codes computes exactly what one-token-at-a-time generation computes at those codes.

Sequence layout: the prompt prefix takes slots ``0 .. P - 1`` of the cache (left-padded, the padding masked out of
attention; its last ids are the layout's head, which the condition builders put there), code ``c`` slot
``P + offset(c)``. The rotary position of a slot is the number of real tokens before it in its row (padding
skipped), as ``generate`` numbers a left-padded row. Samplers number slots as if the prefix were one position
(slot ``s`` holds code ``s - 1``), as for every backbone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vgen.models.backbone import GRID_LIMIT, BackboneConfig
from vgen.models.cache import DraftTree, KVCache
from vgen.models.conditioning import Condition, PrefixCondition, TokenGrid, check_prompt_ids
from vgen.models.config_fields import declare, size
from vgen.models.layers import FeedForward, RMSNorm, rope_grid_table
from vgen.models.layout import TokenLayout
from vgen.models.linear import Linear
from vgen.models.llamagen import QKNormAttention, TransformerBlock

TOKEN_IDS = dict(at_least=0, length=(0, 64))  # a declaration of fixed token ids (none to 64 of them)


@dataclass(frozen=True)
class MLLMConfig(BackboneConfig):
    """A Llama or Chameleon language model generating ``image_rows x image_cols`` codes of a ``vocab_size``
    codebook inside its ``text_vocab_size`` vocabulary: the blocks (``dim``, ``n_layer``, ``n_head``,
    ``n_kv_head``, ``intermediate_size``, ``norm_eps``, ``rope_base``, ``qk_norm``), the layout's fixed ids
    (``row_end``, ``head_tokens`` ending every prompt, ``tail``), the context (``max_positions`` rotary positions,
    ``max_prompt_tokens`` of prompt a cache has room for), the pad id, and the family's default guidance and
    top-k over codes."""

    vocab_size: int = 8192
    dim: int = 4096
    n_layer: int = 32
    n_head: int = 32
    text_vocab_size: int = size(65536)
    intermediate_size: int = size(11008)
    qk_norm: bool = declare(False)
    image_rows: int = size(48, at_most=GRID_LIMIT)
    image_cols: int = size(48, at_most=GRID_LIMIT)
    row_end: tuple[int, ...] = declare((), **TOKEN_IDS)
    head_tokens: tuple[int, ...] = declare((), **TOKEN_IDS)
    tail: tuple[int, ...] = declare((), **TOKEN_IDS)
    max_positions: int = size(4096)
    max_prompt_tokens: int = size(256)
    pad_token_id: int = size(0, at_least=0)
    cfg_scale: float = declare(3.0, at_least=0)
    top_k: int | None = size(None)
    num_classes: int = 0
    class_dropout_prob: float = 0.0
    token_dropout_p: float = 0.0
    resid_dropout_p: float = 0.0
    ffn_dropout_p: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.vocab_size > self.text_vocab_size:
            raise ValueError(f"vocab_size {self.vocab_size} (image codes) exceeds the text_vocab_size "
                             f"{self.text_vocab_size} they are part of")
        for name in ("row_end", "head_tokens", "tail"):
            bad = [i for i in getattr(self, name) if i >= self.text_vocab_size]
            if bad:
                raise ValueError(f"{name} id {bad[0]} is not a token of the text_vocab_size {self.text_vocab_size}")
        if self.pad_token_id >= self.text_vocab_size:
            raise ValueError(f"pad_token_id {self.pad_token_id} is not a token of the text_vocab_size "
                             f"{self.text_vocab_size}")
        if len(self.head_tokens) > self.max_prompt_tokens:
            raise ValueError(f"the {len(self.head_tokens)} head tokens do not fit max_prompt_tokens "
                             f"{self.max_prompt_tokens}")
        need = self.max_prompt_tokens + self.layout.offset(self.num_tokens) + len(self.tail)
        if need > self.max_positions:
            raise ValueError(f"a {self.image_rows}x{self.image_cols} image after a prompt of max_prompt_tokens "
                             f"{self.max_prompt_tokens} takes {need} positions, more than the model's "
                             f"max_positions {self.max_positions}")

    @property
    def grid(self) -> tuple[int, int]:
        return (self.image_rows, self.image_cols)

    @property
    def num_tokens(self) -> int:
        return self.image_rows * self.image_cols

    @property
    def layout(self) -> TokenLayout:
        """Where the fixed ids sit among the codes (:attr:`LayoutLM.token_layout`)."""
        return TokenLayout(self.grid, self.row_end, self.head_tokens, self.tail)


class LayoutKVCache(KVCache):
    """A :class:`KVCache` that also knows its prompt prefix: ``prefix_length`` (P) and the same as a LongTensor [1]
    ``offset`` (for compiled steps), each row's left padding ``pad`` [B] (rotary positions skip it), and ``codes``,
    the codes :meth:`LayoutLM.decode` has appended. All are set in place at the prefill (:meth:`start`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        device = self.keys[0].device
        self.offset = torch.zeros(1, dtype=torch.long, device=device)
        self.pad = torch.zeros(self.batch_size, dtype=torch.long, device=device)
        self.prefix_length = 1
        self.codes = 0

    def start(self, mask: torch.Tensor) -> None:
        """Record the prefix mask [B, L] (True on real positions) of the positions about to be prefilled."""
        self.mask_keys(mask)
        self.prefix_length, self.codes = mask.shape[1], 0
        self.offset.fill_(mask.shape[1])
        self.pad.copy_(mask.shape[1] - mask.sum(1))


class MLLMBlock(TransformerBlock):
    """LlamaGen's pre-norm block with Llama's MLP width (``intermediate_size``) and, for Chameleon, the query-key
    norm (:class:`~vgen.models.llamagen.QKNormAttention`)."""

    def __init__(self, cfg: MLLMConfig) -> None:
        super().__init__(cfg)
        self.feed_forward = FeedForward(cfg.dim, cfg.intermediate_size)
        if cfg.qk_norm:
            self.attention = QKNormAttention(cfg)


class LayoutLM(TokenGrid, nn.Module):
    """A language model generating image codes between the fixed tokens of its layout (module docstring),
    conditioned on left-padded prompts of token ids that end in the layout's head, each with its own unconditional
    prompt for guidance (``PrefixCondition.null``; without one, the head alone)."""

    token_order = "raster"
    text_conditional = True  # conditioned on a prompt, not a class
    prompt_token_ids = True  # the prompt comes as token ids (a pipeline's prompt_ids=), not as embeddings

    def __init__(self, config: MLLMConfig) -> None:
        super().__init__()
        self.config = config
        self.text_embeddings = nn.Embedding(config.text_vocab_size, config.dim)
        self.register_buffer("code_ids", torch.arange(config.vocab_size))  # the text id of each code
        self.layers = nn.ModuleList(MLLMBlock(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.head = Linear(config.dim, config.vocab_size, bias=False)
        # Llama's 1-D rotary table, kept fp32 as a plain attribute (like LlamaGen's)
        self.rope = rope_grid_table((config.max_positions,), config.head_dim, config.rope_base, num_prefix=0)

    @property
    def token_layout(self) -> TokenLayout:
        return self.config.layout

    def code_embeddings(self) -> torch.Tensor:
        return self.text_embeddings.weight[self.code_ids]

    # -- conditions ----------------------------------------------------------------------------------------------
    def check_condition(self, cond: Condition) -> None:
        """Raise a ValueError unless ``cond`` (and its null prompt, if any) is a prompt of token ids this model
        takes: ids of its vocabulary, no longer than ``max_prompt_tokens``, every row ending in the head ids."""
        if not isinstance(cond, PrefixCondition):
            raise ValueError(f"{type(self).__name__} is text-conditioned: give a prompt, not class ids")
        for name, c in (("prompt", cond), ("null prompt", cond.null)):
            if c is None:
                continue
            check_prompt_ids(c, self.config.max_prompt_tokens, self.config.text_vocab_size, name)
            head = self.config.head_tokens
            if head and (c.length < len(head) or not bool((c.values[:, -len(head):] == c.values.new_tensor(head))
                                                          .all())):
                raise ValueError(f"every {name} row must end in the image head ids {list(head)}")

    def null_condition(self, cond: PrefixCondition) -> PrefixCondition:
        """The unconditional prompt of ``cond``'s rows: its ``null`` (a negative prompt), else the head ids alone
        (Lumina-mGPT's unconditional context)."""
        if cond.null is not None:
            return cond.null
        head = self.config.head_tokens
        if not head:
            raise ValueError(f"{type(self).__name__} guides against a negative prompt: give the prompt one "
                             f"(PrefixCondition.null), or run without guidance")
        values = cond.values.new_tensor(head).expand(len(cond), -1)
        return PrefixCondition(values, torch.ones_like(values, dtype=torch.bool))

    # -- forward passes ------------------------------------------------------------------------------------------
    def _rope(self, positions: torch.Tensor, cache: LayoutKVCache) -> torch.Tensor:
        """Rotary rows [B, t, head_dim / 2, 2] of slots [t] or [B, t]: each row's slot less its padding."""
        if self.rope.device != positions.device:
            self.rope = self.rope.to(positions.device)
        rows = positions - cache.pad[:, None] if positions.ndim == 2 else positions[None] - cache.pad[:, None]
        return self.rope[rows.clamp(0, self.rope.shape[0] - 1)]

    def _run(self, ids: torch.Tensor, rope: torch.Tensor, cache: LayoutKVCache, **where: Any) -> torch.Tensor:
        h = self.text_embeddings(ids)
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, cache, i, **where)
        return self.norm(h)

    def _codes_out(self, h: torch.Tensor, out: torch.Tensor,
                   return_hidden: bool) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The logits (and normed hidden states) of the positions ``out`` [B, k] that predict codes."""
        h = h.gather(1, out[..., None].expand(-1, -1, h.shape[-1]))
        logits = self.head(h).float()
        return (logits, h) if return_hidden else logits

    def new_cache(self, batch_size: int, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None, extra: int = 0) -> LayoutKVCache:
        """An empty cache with room for the longest prompt, every code with its row ends, and a window of
        ``extra`` more codes past the image."""
        layout, p = self.token_layout, self.head.weight
        length = (self.config.max_prompt_tokens + layout.offset(self.num_tokens + extra) + layout.max_width(extra)
                  + layout.fixed_per_row)
        return LayoutKVCache(self.config.n_layer, batch_size, self.config.kv_heads, length, self.config.head_dim,
                             dtype or p.dtype, device or p.device)

    def prefill(self, cond: PrefixCondition, cache: LayoutKVCache,
                return_hidden: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Run the prompt prefix into an empty cache; logits [B, V] for code 0 (with ``return_hidden``, also the
        last position's final normed hidden state [B, 1, dim])."""
        if cache.length != 0:
            raise ValueError(f"prefill needs an empty cache, this one holds {cache.length} positions")
        n = cond.length
        cache.reserve(n)
        cache.start(cond.mask)
        positions = torch.arange(n, device=cond.device)
        mask = cond.causal_mask()
        h = self._run(cond.values, self._rope(positions, cache), cache, mask=mask)
        cache.advance(n)
        logits = self.head(h[:, -1]).float()
        return (logits, h[:, -1:]) if return_hidden else logits

    def decode(self, codes: torch.Tensor, cache: LayoutKVCache) -> torch.Tensor:
        """Append codes [B, k] (with the row ends after them) after the cached positions; logits [B, k, V], row i
        predicting the next code."""
        layout, first, k = self.token_layout, cache.codes, codes.shape[1]
        width = layout.offset(first + k) - layout.offset(first)
        start = cache.reserve(width)
        ids, out = layout.window(torch.full_like(codes[:, 0], first), self.code_ids[codes], width)
        positions = torch.arange(start, start + width, device=codes.device)
        keys = torch.arange(start + width, device=codes.device)
        mask = cache.attendable(keys[None, :] <= positions[:, None], start + width)
        h = self._run(ids, self._rope(positions, cache), cache, mask=mask)
        cache.advance(width)
        cache.codes += k
        return self._codes_out(h, out, False)

    def decode_rows(self, tokens: torch.Tensor, starts: torch.Tensor, cache: LayoutKVCache, return_hidden: bool = False,
                    static: bool = False, image_end: int | None = None,
                    tree: DraftTree | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Codes [B, k] from code ``starts[b] - 1`` of each row b (sampler slot ``starts[b]``), written with their
        row ends at the row's own slots; logits [B, k, V] (and, with ``return_hidden``, the final normed hidden
        states), row i predicting code ``starts + i``. Rows advance independently; the caller tracks them.
        ``static``: one shape for a compiled verify pass (the widest window of k codes, :meth:`KVCache.row_slots`),
        attending up to the slots of code ``image_end`` when given. A draft ``tree`` is refused: its branches would
        need their own row ends."""
        if tree is not None:
            raise NotImplementedError("tree verify passes are supported on LlamaGen and Janus backbones, not on a "
                                      "layout model's rows")
        layout, k = self.token_layout, tokens.shape[1]
        first = starts - 1
        begin = cache.prefix_length + layout.offset(first)
        # the widest window of k codes, or the widest real one (one device sync)
        width = layout.max_width(k) if static else int((layout.offset(first + k) - layout.offset(first)).max())
        span = None if image_end is None else min(cache.prefix_length + layout.offset(image_end)
                                                  + layout.fixed_per_row, cache.max_len)
        rows = cache.row_slots(begin, width, static, span)
        ids, out = layout.window(first, self.code_ids[tokens], width)
        h = self._run(ids, self._rope(rows.slots, cache), cache, rows=rows,
                      mask=cache.attendable(rows.attend, rows.end))
        return self._codes_out(h, out, return_hidden)

    def decode_step(self, tokens: torch.Tensor, slot: torch.Tensor, cache: LayoutKVCache) -> torch.Tensor:
        """One code per row [B, 1] at sampler slot ``slot`` (LongTensor [1]: code ``slot - 1``); logits [B, V]. The
        static-shape twin of ``decode(tokens, cache)[:, -1]`` for CUDA graphs: it always feeds the code and the
        row-end ids after it (1 + E positions), reads the code's output inside a row and the last row end's at a
        row's end (the stale row ends elsewhere are overwritten by the next step); attention spans the whole cache
        under a mask; the caller moves ``cache.length`` (``advance(1)``)."""
        layout, e = self.token_layout, self.token_layout.fixed_per_row
        code = slot - 1
        begin = (cache.offset + layout.offset(code)).expand(len(tokens))
        rows = cache.row_slots(begin, 1 + e, static=True)
        ids = torch.cat([self.code_ids[tokens], tokens.new_tensor(layout.row_end).expand(len(tokens), -1)], dim=1)
        h = self._run(ids, self._rope(rows.slots, cache), cache, rows=rows,
                      mask=cache.attendable(rows.attend, rows.end))
        h = torch.where((code % layout.width == layout.width - 1)[:, None], h[:, e], h[:, 0])
        return self.head(h).float()
