"""Janus-Pro text-to-image generation as a vgen backbone, with weights from ``transformers``' Janus checkpoints.

``transformers``' ``JanusForConditionalGeneration.generate(generation_mode="image")`` runs a Llama language model
over a chat-formatted prompt that ends in the begin-of-image (BOI) token, then one image token per step: the
last hidden state goes through the generation head (``proj_out`` -> GELU -> ``vision_head``), classifier-free
guidance merges the conditional and unconditional rows (default scale 5), and the chosen token comes back in
through the generation embeddings and aligner. The unconditional rows are the prompts with every token but BOS
and BOI replaced by the pad token, under the same attention mask. The VQ decoder turns the tokens into pixels
(the released models: 24 x 24 = 576 tokens, 384 px).

:class:`JanusT2I` holds the language model in vgen's own layers (LlamaGen's attention block, RMSNorm, SwiGLU,
1-D rotary positions) so that it gets vgen's KV cache: per-row writes and rollback, which speculative
verification needs and ``transformers``' caches do not offer. Llama rotates the two halves of each head
(``rotate_half``), vgen interleaved pairs; the query and key rows are permuted on loading so that both compute
the same attention. :class:`JanusVQ` wraps ``transformers``' own VQ model as a vgen tokenizer (``decode_code``,
``codebook()`` for LANTERN's neighbourhoods). :func:`load_janus` reads a folder written by ``save_pretrained``;
``transformers`` is imported there only (the ``t2i`` extra).

Sequence layout: the prompt prefix takes slots ``0 .. L - 1`` of the cache (left-padded, the padding masked out
of attention), image token ``i`` slot ``L + i``; rotary positions are the slot indices, as in ``transformers``.
Samplers number slots as if every prefix were one position (slot ``s`` holds image token ``s - 1``):
:meth:`JanusT2I.decode_rows` and :meth:`JanusT2I.decode_step` add ``L - 1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vgen.models.backbone import GRID_LIMIT, BackboneConfig
from vgen.models.cache import DraftTree, KVCache
from vgen.models.conditioning import Condition, PrefixCondition, TokenGrid, check_prompt_ids
from vgen.models.config_fields import declare, size
from vgen.models.hf_folder import check_model_folder, model_type
from vgen.models.layers import FeedForward, RMSNorm, llama_block_weights, rope_grid_table
from vgen.models.linear import Linear
from vgen.models.llamagen import TransformerBlock

JANUS_PRO_HINT = ("put a Janus-Pro checkpoint in transformers' layout there, e.g. `huggingface-cli download "
                  "deepseek-community/Janus-Pro-1B --local-dir {folder}`")
ACTIVATIONS = {"gelu": lambda: nn.GELU(), "gelu_pytorch_tanh": lambda: nn.GELU(approximate="tanh")}


@dataclass(frozen=True)
class JanusT2IConfig(BackboneConfig):
    """The image-generation half of a Janus config: the Llama language model (``dim``, ``n_layer``, ``n_head``,
    ``n_kv_head``, ``intermediate_size``, ``rope_base``, ``norm_eps``, ``text_vocab_size``), the generation
    embeddings (``vocab_size`` codes of ``image_embed_dim``), aligner (``aligner_layers`` linear layers) and head
    (``head_dim_proj`` wide), the image grid (``grid_size`` squared tokens), the special tokens of the prompt
    and its null form, and ``max_prompt_tokens``, the longest prompt (padding included) a cache has room for.
    The architecture defaults are Janus-Pro-1B's; the token ids come from a checkpoint (:func:`janus_t2i_config`)."""

    vocab_size: int = 16384
    dim: int = 2048
    n_layer: int = 24
    n_head: int = 16
    norm_eps: float = 1e-6
    intermediate_size: int = size(5632)
    text_vocab_size: int = size(102400)
    image_embed_dim: int = size(8)
    head_dim_proj: int = size(2048)
    aligner_layers: int = size(2)
    hidden_act: str = declare("gelu", choices=tuple(ACTIVATIONS))
    grid_size: int = size(24, at_most=GRID_LIMIT)
    bos_token_id: int | None = size(None, at_least=0)
    boi_token_id: int | None = size(None, at_least=0)
    pad_token_id: int | None = size(None, at_least=0)
    max_prompt_tokens: int = size(256, at_most=GRID_LIMIT ** 2)
    cfg_scale: float = declare(5.0, at_least=0)
    num_classes: int = 0
    class_dropout_prob: float = 0.0
    token_dropout_p: float = 0.0
    resid_dropout_p: float = 0.0
    ffn_dropout_p: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.boi_token_id is None or self.pad_token_id is None:
            raise ValueError("a Janus config needs boi_token_id and pad_token_id (janus_t2i_config reads them from "
                             "the checkpoint's generation config)")
        for name in ("bos_token_id", "boi_token_id", "pad_token_id"):
            if getattr(self, name) is not None and getattr(self, name) >= self.text_vocab_size:
                raise ValueError(f"{name} {getattr(self, name)} is not a token of the text_vocab_size "
                                 f"{self.text_vocab_size} the model embeds")

    @property
    def num_tokens(self) -> int:
        return self.grid_size ** 2

    @property
    def grid(self) -> tuple[int, int]:
        return (self.grid_size, self.grid_size)


class JanusKVCache(KVCache):
    """A :class:`KVCache` that also knows the length of the prompt prefix it was filled with: ``prefix_length`` and
    ``offset`` = ``prefix_length - 1`` as a LongTensor [1] (for compiled steps); the prefix's padding is the
    cache's ``key_mask``. All are set in place by :meth:`start` at the prefill."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.offset = torch.zeros(1, dtype=torch.long, device=self.keys[0].device)
        self.prefix_length = 1

    def start(self, mask: torch.Tensor) -> None:
        """Record the prefix mask [B, L] (True on real positions) of the positions about to be prefilled."""
        self.mask_keys(mask)
        self.prefix_length = mask.shape[1]
        self.offset.fill_(mask.shape[1] - 1)


class JanusAligner(nn.Module):
    """``transformers``' ``JanusVQVAEAlignerMLP``: ``fc1``, then (activation, linear) ``layers - 1`` times."""

    def __init__(self, in_dim: int, dim: int, layers: int, act: str) -> None:
        super().__init__()
        self.fc1 = Linear(in_dim, dim)
        self.hidden_layers = nn.ModuleList(Linear(dim, dim) for _ in range(layers - 1))
        self.act = ACTIVATIONS[act]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc1(x)
        for layer in self.hidden_layers:
            x = layer(self.act(x))
        return x


class JanusHead(nn.Module):
    """``transformers``' ``JanusVQVAEHead``: ``vision_head(act(proj_out(h)))``, the image-token logits."""

    def __init__(self, dim: int, width: int, vocab_size: int, act: str) -> None:
        super().__init__()
        self.proj_out = Linear(dim, width)
        self.act = ACTIVATIONS[act]()
        self.vision_head = Linear(width, vocab_size)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.vision_head(self.act(self.proj_out(h)))


class JanusBlock(TransformerBlock):
    """LlamaGen's pre-norm block with Llama's MLP width (``intermediate_size``, not LlamaGen's rounding rule)."""

    def __init__(self, cfg: JanusT2IConfig) -> None:
        super().__init__(cfg)
        self.feed_forward = FeedForward(cfg.dim, cfg.intermediate_size)


class JanusT2I(TokenGrid, nn.Module):
    """Janus-Pro's language model with its image-generation embeddings and head: a raster text-to-image backbone
    over ``grid_size ** 2`` tokens, conditioned on a left-padded prompt of token ids (:func:`janus_condition`)."""

    token_order = "raster"

    def __init__(self, config: JanusT2IConfig) -> None:
        super().__init__()
        self.config = config
        self.text_embeddings = nn.Embedding(config.text_vocab_size, config.dim)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.image_embed_dim)  # Janus' generation_embeddings
        self.aligner = JanusAligner(config.image_embed_dim, config.dim, config.aligner_layers, config.hidden_act)
        self.layers = nn.ModuleList(JanusBlock(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.head = JanusHead(config.dim, config.head_dim_proj, config.vocab_size, config.hidden_act)
        # Llama's 1-D rotary table, kept fp32 as a plain attribute (like LlamaGen's) for every slot of a cache
        self.rope = rope_grid_table((config.max_prompt_tokens + config.num_tokens,), config.head_dim,
                                    config.rope_base, num_prefix=0)

    # -- what every backbone answers --------------------------------------------------------------------------
    text_conditional = True  # conditioned on a prompt, not a class
    prompt_token_ids = True  # the prompt comes as token ids (a pipeline's prompt_ids=), not as embeddings

    def check_condition(self, cond: Condition) -> None:
        """Raise a ValueError unless ``cond`` is a prompt prefix of token ids this model can take."""
        if not isinstance(cond, PrefixCondition):
            raise ValueError(f"{type(self).__name__} is text-conditioned: give a prompt, not class ids")
        check_prompt_ids(cond, self.config.max_prompt_tokens, self.config.text_vocab_size)

    def null_condition(self, cond: PrefixCondition) -> PrefixCondition:
        """The unconditional prompt of ``generate(generation_mode="image")``: every token but BOS and BOI replaced
        by the pad token, under the same mask."""
        keep = cond.values == self.config.boi_token_id
        if self.config.bos_token_id is not None:
            keep |= cond.values == self.config.bos_token_id
        return PrefixCondition(cond.values.masked_fill(~keep, self.config.pad_token_id), cond.mask)

    # -- forward passes ----------------------------------------------------------------------------------------
    def embed_image_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Image tokens [B, k] -> language-model inputs [B, k, dim] (generation embeddings, then the aligner)."""
        return self.aligner(self.tok_embeddings(tokens))

    def _rope(self, positions: torch.Tensor) -> torch.Tensor:
        if self.rope.device != positions.device:
            self.rope = self.rope.to(positions.device)
        return self.rope[positions.clamp(max=self.rope.shape[0] - 1)]

    def _head(self, h: torch.Tensor, return_hidden: bool) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        h = self.norm(h)
        logits = self.head(h).float()
        return (logits, h) if return_hidden else logits

    def new_cache(self, batch_size: int, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None, extra: int = 0) -> JanusKVCache:
        """An empty cache with room for the longest prompt, every image token and ``extra`` more slots."""
        p = self.head.vision_head.weight
        return JanusKVCache(self.config.n_layer, batch_size, self.config.kv_heads,
                            self.config.max_prompt_tokens + self.config.num_tokens + extra, self.config.head_dim,
                            dtype or p.dtype, device or p.device)

    def prefill(self, cond: PrefixCondition, cache: JanusKVCache,
                return_hidden: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Run the prompt prefix into an empty cache; logits [B, V] for image token 0 (with ``return_hidden``, also
        the last position's final normed hidden state [B, 1, dim])."""
        if cache.length != 0:
            raise ValueError(f"prefill needs an empty cache, this one holds {cache.length} positions")
        n = cond.length
        cache.reserve(n)
        cache.start(cond.mask)
        positions = torch.arange(n, device=cond.device)
        mask = cond.causal_mask()
        h = self.text_embeddings(cond.values)
        rope = self._rope(positions)
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, cache, i, mask=mask)
        cache.advance(n)
        out = self._head(h[:, -1:], return_hidden)
        return (out[0][:, -1], out[1]) if return_hidden else out[:, -1]

    def decode(self, tokens: torch.Tensor, cache: JanusKVCache) -> torch.Tensor:
        """Append image tokens [B, k] after the cached positions; logits [B, k, V], row i predicting the next."""
        t = tokens.shape[1]
        start = cache.reserve(t)
        positions = torch.arange(start, start + t, device=tokens.device)
        keys = torch.arange(start + t, device=tokens.device)
        mask = cache.attendable(keys[None, :] <= positions[:, None], start + t)
        h = self.embed_image_tokens(tokens)
        rope = self._rope(positions)
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, cache, i, mask=mask)
        cache.advance(t)
        return self._head(h, False)

    def decode_rows(self, tokens: torch.Tensor, starts: torch.Tensor, cache: JanusKVCache, return_hidden: bool = False,
                    static: bool = False, image_end: int | None = None,
                    tree: DraftTree | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Image tokens [B, k] written at slots ``starts[b] ... starts[b] + k - 1`` of each row b, counted as if
        the prefix were one position (slot s holds image token s - 1); logits [B, k, V] (and, with
        ``return_hidden``, the final normed hidden states). Rows advance independently; the caller tracks them.
        ``static``: one shape for a compiled verify pass (:meth:`KVCache.row_slots`), attending up to image token
        ``image_end`` when given. ``tree``: the tokens are the nodes of a draft tree, each at the position of its
        depth (:meth:`LlamaGenGPT.decode_rows <vgen.models.llamagen.LlamaGenGPT.decode_rows>`)."""
        shift = cache.prefix_length - 1
        span = None if image_end is None else image_end + shift
        rows = cache.row_slots(starts + shift, tokens.shape[1], static, span, tree)
        mask = cache.attendable(rows.attend, rows.end)
        h = self.embed_image_tokens(tokens)
        rope = self._rope(rows.position_ids)
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, cache, i, rows=rows, mask=mask)
        return self._head(h, return_hidden)

    def tree_root_slots(self, starts: torch.Tensor, cache: JanusKVCache) -> torch.Tensor:
        """The cache slots [B] where :meth:`decode_rows` writes the first token of a window from ``starts`` [B]
        (:meth:`LlamaGenGPT.tree_root_slots <vgen.models.llamagen.LlamaGenGPT.tree_root_slots>`)."""
        return starts + (cache.prefix_length - 1)

    def decode_step(self, tokens: torch.Tensor, slot: torch.Tensor, cache: JanusKVCache) -> torch.Tensor:
        """One image token per row [B, 1] at ``slot`` (LongTensor [1], counted as in :meth:`decode_rows`); logits
        [B, V]. The static-shape twin of ``decode(tokens, cache)[:, -1]`` for CUDA graphs: attention spans the
        whole cache under a mask; the caller moves ``cache.length`` (``advance(1)``)."""
        at = slot + cache.offset
        mask = cache.attendable((torch.arange(cache.max_len, device=tokens.device) <= at)[None, None, None],
                               cache.max_len)
        h = self.embed_image_tokens(tokens)
        rope = self.rope.index_select(0, at)
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, cache, i, at, mask=mask)
        return self._head(h[:, -1], False)


class JanusVQ(nn.Module):
    """``transformers``' Janus VQ model as a vgen tokenizer: codes -> pixels, and the code vectors its decoder
    receives (L2-normalised rows of the codebook, as ``get_codebook_entry`` uses them)."""

    def __init__(self, vqmodel: nn.Module) -> None:
        super().__init__()
        self.vqmodel = vqmodel

    @property
    def codebook_size(self) -> int:
        return self.vqmodel.quantize.embedding.num_embeddings

    @property
    def downsample_factor(self) -> int:
        """Pixels per code along a side: the encoder halves the image once per channel multiplier after the first
        (16 for Janus-Pro's 384-px images of 24 x 24 codes)."""
        return 2 ** (len(self.vqmodel.config.channel_multiplier) - 1)

    def codebook(self) -> torch.Tensor:
        return F.normalize(self.vqmodel.quantize.embedding.weight, p=2, dim=-1)

    @torch.no_grad()
    def decode_code(self, codes: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        """Codes [B, h, w] (or [B, h * w]) -> images [B, 3, H, W] in about [-1, 1]."""
        codes = codes.reshape(codes.shape[0], -1)
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.codebook_size):
            raise ValueError(f"codes must lie in [0, {self.codebook_size})")
        return self.vqmodel.decode(codes).float()


def janus_t2i_state_dict(hf: dict[str, torch.Tensor], config: JanusT2IConfig) -> dict[str, torch.Tensor]:
    """:class:`JanusT2I`'s weights from a ``JanusForConditionalGeneration`` state dict (keys ``model.*``)."""
    lm, out = "model.language_model.", {}
    out["text_embeddings.weight"] = hf[lm + "embed_tokens.weight"]
    out["norm.weight"] = hf[lm + "norm.weight"]
    for i in range(config.n_layer):
        out.update(llama_block_weights(hf.__getitem__, f"{lm}layers.{i}.", f"layers.{i}.", config.n_head,
                                       config.kv_heads))
    out["tok_embeddings.weight"] = hf["model.generation_embeddings.weight"]
    for name in ("fc1.weight", "fc1.bias", *(f"hidden_layers.{j}.{p}" for j in range(config.aligner_layers - 1)
                                             for p in ("weight", "bias"))):
        out["aligner." + name] = hf["model.generation_aligner." + name]
    for name in ("proj_out.weight", "proj_out.bias", "vision_head.weight", "vision_head.bias"):
        out["head." + name] = hf["model.generation_head." + name]
    return out


def janus_t2i_config(hf_config: Any, generation_config: Any, max_prompt_tokens: int = 256) -> JanusT2IConfig:
    """The :class:`JanusT2IConfig` of a ``transformers`` ``JanusConfig`` and the model's generation config (its
    BOS, pad and ``generation_kwargs["boi_token_id"]``, and its ``guidance_scale``, 5 when unset as in
    ``generate``)."""
    text, vq, vision = hf_config.text_config, hf_config.vq_config, hf_config.vision_config
    rope = getattr(text, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"unsupported rotary scaling {rope.get('rope_type')!r} in the Janus language model")
    if getattr(text, "attention_bias", False) or getattr(text, "mlp_bias", False):
        raise ValueError("a Janus language model with attention or MLP biases is not supported")
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    if head_dim * text.num_attention_heads != text.hidden_size:
        raise ValueError("a Janus language model whose heads do not tile its hidden size is not supported")
    side = vision.image_size // vision.patch_size
    if side * side != vision.num_image_tokens:
        raise ValueError(f"Janus config has {vision.num_image_tokens} image tokens but a {side}x{side} VQ grid")
    boi = (getattr(generation_config, "generation_kwargs", None) or {}).get("boi_token_id")
    if boi is None or generation_config.pad_token_id is None:
        raise ValueError("the Janus generation config needs pad_token_id and generation_kwargs['boi_token_id']")
    return JanusT2IConfig(
        vocab_size=vq.num_embeddings, dim=text.hidden_size, n_layer=text.num_hidden_layers,
        n_head=text.num_attention_heads, n_kv_head=text.num_key_value_heads, rope_base=float(rope["rope_theta"]),
        norm_eps=text.rms_norm_eps, intermediate_size=text.intermediate_size, text_vocab_size=text.vocab_size,
        image_embed_dim=vq.embed_dim, head_dim_proj=vq.projection_dim, aligner_layers=vq.num_hidden_layers,
        hidden_act=vq.hidden_act, grid_size=side, bos_token_id=generation_config.bos_token_id, boi_token_id=boi,
        pad_token_id=generation_config.pad_token_id, max_prompt_tokens=max_prompt_tokens,
        cfg_scale=float(generation_config.guidance_scale or 5.0))


def janus_t2i_from_transformers(hf_model: nn.Module, max_prompt_tokens: int = 256) -> JanusT2I:
    """A :class:`JanusT2I` holding (sharing) the generation weights of a ``JanusForConditionalGeneration``."""
    config = janus_t2i_config(hf_model.config, hf_model.generation_config, max_prompt_tokens)
    with torch.device("meta"):
        model = JanusT2I(config)
    model.load_state_dict(janus_t2i_state_dict(hf_model.state_dict(), config), strict=True, assign=True)
    return model.eval()


def janus_condition(processor: Any, prompts: Sequence[str], max_prompt_tokens: int | None = None) -> PrefixCondition:
    """The prompt prefix ``generate(generation_mode="image")`` runs for each prompt: a user turn of the processor's
    chat template with the assistant's generation prompt, then BOI (the processor's image mode), tokenised with
    BOS and left-padded to one length; the mask is the tokenizer's attention mask. The unconditional rows are
    ``model.null_condition`` of it."""
    if isinstance(prompts, str) or not len(prompts):
        raise ValueError("give a non-empty list of prompts")
    for i, p in enumerate(prompts):
        if not isinstance(p, str) or not p.strip():
            raise ValueError(f"prompt {i} is empty or not a string")
    if getattr(processor, "chat_template", None) is None:
        raise ValueError("the Janus processor has no chat template (chat_template.jinja missing from its folder)")
    texts = [processor.apply_chat_template([{"role": "user", "content": [{"type": "text", "text": p}]}],
                                           add_generation_prompt=True) for p in prompts]
    enc = processor(text=texts, generation_mode="image", padding=True, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"].bool()
    if max_prompt_tokens is not None and ids.shape[1] > max_prompt_tokens:
        longest = int(mask.sum(1).argmax())
        raise ValueError(f"prompt {longest} takes {int(mask[longest].sum())} tokens with the chat template; this "
                         f"model takes at most {max_prompt_tokens} (max_prompt_tokens): shorten it")
    return PrefixCondition(ids, mask)


@dataclass
class LoadedJanus:
    """What :func:`load_janus` returns: the backbone, its VQ tokenizer and the ``transformers`` processor."""

    model: JanusT2I
    tokenizer: JanusVQ
    processor: Any

    def condition(self, prompts: Sequence[str]) -> PrefixCondition:
        """:func:`janus_condition` of ``prompts`` on the model's device."""
        cond = janus_condition(self.processor, prompts, self.model.config.max_prompt_tokens)
        return cond.to(self.model.head.vision_head.weight.device)


def is_janus_folder(folder: str | Path) -> bool:
    """Whether ``folder`` holds a ``transformers`` checkpoint whose config names the Janus model type."""
    return model_type(folder) == "janus"


def check_janus_folder(folder: str | Path) -> Path:
    """``folder`` as a Path, or a one-line ValueError if it is missing or not a Janus checkpoint with its processor."""
    return check_model_folder(folder, "janus", "Janus", JANUS_PRO_HINT, "the original deepseek-ai layout is not read, ")


def load_janus(folder: str | Path, dtype: torch.dtype | None = None, device: torch.device | str | None = None,
               max_prompt_tokens: int = 256) -> LoadedJanus:
    """A Janus checkpoint in ``transformers``' layout (``save_pretrained`` of ``JanusForConditionalGeneration``
    and ``JanusProcessor`` in one folder), read offline: the backbone, the VQ tokenizer and the processor."""
    path = check_janus_folder(folder)
    try:
        from transformers import JanusForConditionalGeneration, JanusProcessor
    except ImportError as e:
        raise ImportError(f"Janus needs transformers (pip install -e \".[t2i]\"): {e}") from None
    hf = JanusForConditionalGeneration.from_pretrained(path, local_files_only=True, dtype=dtype or torch.float32)
    processor = JanusProcessor.from_pretrained(path, local_files_only=True)
    model = janus_t2i_from_transformers(hf, max_prompt_tokens)
    tokenizer = JanusVQ(hf.model.vqmodel).eval()
    if device is not None:
        model, tokenizer = model.to(device), tokenizer.to(device)
    return LoadedJanus(model, tokenizer, processor)
