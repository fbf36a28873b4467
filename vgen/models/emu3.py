"""Emu3-Gen text-to-image generation as a vgen backbone, with weights from ``transformers``' Emu3 checkpoints.

``transformers``' ``Emu3ForConditionalGeneration`` is one Llama language model over a vocabulary of text and image
tokens. Its documented image generation (transformers' docs, model_doc/emu3) prompts ``BOS + text + <|image
start|>{h}*{w}<|image token|>`` (``Emu3Processor(..., return_for_image_generation=True)``, ``h = w =
round(sqrt(image_area) / 8)``: 90 x 90 codes at the default 518,400-pixel area, 720 px), then constrains every step
with a ``prefix_allowed_tokens_fn``: after each row of ``w`` visual tokens the end-of-line token
``<|extra_200|>``, after the last row ``<|extra_201|>`` (end of frame), ``<|image end|>`` and EOS. Classifier-free
guidance runs a second, unconditioned context, the negative prompt (:data:`NEGATIVE_PROMPT`, tokenised as
``BOS + text`` in the docs; the original baaivision/Emu3 code puts the image header after it too), and feeds it every
generated token, row ends included. Visual token ``<|visual token 000123|>`` is VQ code 123; their text ids are
looked up by name (the vocabulary mapping's ``img2bpe``), never assumed contiguous.

vgen runs this as a :class:`~vgen.models.mllm.LayoutLM` whose samplers see VQ codes only: the layout
(:class:`~vgen.models.layout.TokenLayout`, ``row_end=(eol,)``, ``tail=(eof, eoi, eos)``) writes the row ends itself,
the head keeps the code rows of ``lm_head``, and guidance merges raw logits over the codes, which gives the same
softmax, top-k and argmax as ``transformers``' log-softmax merge over the whole vocabulary followed by the mask.
The VQ model (``Emu3VQVAE``) is ``transformers``' own, wrapped as a vgen tokenizer (:class:`Emu3VQ`).
:func:`load_emu3` reads a folder written by ``save_pretrained`` (BAAI/Emu3-Gen-hf); ``transformers`` is imported
there only (the ``t2i`` extra).

Sampling defaults: the folder's ``generation_config.json`` (``guidance_scale``, ``top_k``) where it sets them, else
the original code's CFG 3.0 and top-k 2048 (baaivision/Emu3 image_generation.py); :class:`Emu3Defaults` records which
applied. The docs and the original also end each prompt in :data:`PROMPT_SUFFIX`; vgen leaves prompts as given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vgen.models.checkpoint_io import describe_mismatch, safetensors_shapes
from vgen.models.conditioning import PrefixCondition
from vgen.models.hf_folder import check_model_folder, model_type
from vgen.models.layers import llama_block_weights
from vgen.models.mllm import LayoutLM, MLLMConfig

EMU3_GEN_HINT = ("put an Emu3-Gen checkpoint in transformers' layout there, e.g. `huggingface-cli download "
                 "BAAI/Emu3-Gen-hf --local-dir {folder}`")
NEGATIVE_PROMPT = ("lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, fewer digits, cropped, "
                   "worst quality, low quality, normal quality, jpeg artifacts, signature, watermark, username, "
                   "blurry.")
"""The negative prompt of transformers' docs and baaivision/Emu3's image_generation.py."""
PROMPT_SUFFIX = " masterpiece, film grained, best quality."
"""What the docs' first prompt and the original's ``POSITIVE_PROMPT`` append to a prompt (vgen does not)."""
IMAGE_AREA = 518400
"""``Emu3Processor``'s default image area in pixels: 720 x 720, 90 x 90 codes."""
ORIGINAL_CFG_SCALE = 3.0
ORIGINAL_TOP_K = 2048
SPATIAL_FACTOR = 8
"""Pixels per code along a side that ``Emu3Processor`` assumes (its fixed ``downsample_ratio``)."""
EOL_TOKEN, EOF_TOKEN, EOI_TOKEN = "<|extra_200|>", "<|extra_201|>", "<|image end|>"


@dataclass(frozen=True)
class Emu3Defaults:
    """The guidance scale and top-k an Emu3 folder samples with by default, and where each came from."""

    cfg_scale: float
    top_k: int
    source: str


def emu3_defaults(generation_config: Any) -> Emu3Defaults:
    """``guidance_scale`` and ``top_k`` of the generation config where it sets them, else the original code's."""
    scale = getattr(generation_config, "guidance_scale", None)
    top_k = getattr(generation_config, "top_k", None)
    source = ", ".join(f"{name} from {'generation_config.json' if value is not None else 'the original Emu3 code'}"
                       for name, value in (("guidance_scale", scale), ("top_k", top_k)))
    return Emu3Defaults(float(ORIGINAL_CFG_SCALE if scale is None else scale),
                        int(ORIGINAL_TOP_K if top_k is None else top_k), source)


def emu3_grid(image_area: int) -> tuple[int, int]:
    """The square code grid ``Emu3Processor`` asks for at ``image_area`` pixels (its ``calculate_generate_size`` at
    ratio 1:1)."""
    if isinstance(image_area, bool) or not isinstance(image_area, int) or image_area <= 0:
        raise ValueError(f"image_area must be a positive number of pixels, got {image_area!r}")
    side = int(round(image_area ** 0.5 / SPATIAL_FACTOR))
    if side < 1:
        raise ValueError(f"image_area {image_area} is smaller than one {SPATIAL_FACTOR}x{SPATIAL_FACTOR}-pixel code")
    return side, side


def _token_id(vocab: dict[str, int], name: str) -> int:
    if name not in vocab:
        raise ValueError(f"the Emu3 config's vocabulary_map has no {name!r} token")
    return int(vocab[name])


def emu3_code_ids(vocabulary_map: dict[str, int], codebook_size: int) -> torch.Tensor:
    """Text id of each VQ code [codebook_size]: ``<|visual token 000123|>`` is code 123 (transformers'
    ``Emu3ImageVocabularyMapping.img2bpe``)."""
    ids = {int(name[-8:-2]): int(i) for name, i in vocabulary_map.items() if name.startswith("<|visual token")}
    if sorted(ids) != list(range(codebook_size)):
        raise ValueError(f"the Emu3 config's vocabulary_map names {len(ids)} visual tokens, not one for each of the "
                         f"{codebook_size} codes of its VQ codebook")
    return torch.tensor([ids[c] for c in range(codebook_size)], dtype=torch.long)


def emu3_config(hf_config: Any, generation_config: Any, image_area: int = IMAGE_AREA,
                max_prompt_tokens: int = 256) -> MLLMConfig:
    """The :class:`MLLMConfig` of a ``transformers`` ``Emu3Config`` and its generation config, generating a square
    image of ``image_area`` pixels (:func:`emu3_grid`) after prompts of up to ``max_prompt_tokens`` tokens."""
    text, vq, vocab = hf_config.text_config, hf_config.vq_config, hf_config.vocabulary_map or {}
    rope = getattr(text, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 1e6}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"unsupported rotary scaling {rope.get('rope_type')!r} in the Emu3 language model")
    if getattr(text, "attention_bias", False) or getattr(text, "mlp_bias", False):
        raise ValueError("an Emu3 language model with attention or MLP biases is not supported")
    if text.hidden_act != "silu":
        raise ValueError(f"an Emu3 language model with activation {text.hidden_act!r} is not supported (silu)")
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    if head_dim * text.num_attention_heads != text.hidden_size:
        raise ValueError("an Emu3 language model whose heads do not tile its hidden size is not supported")
    factor = 2 ** (len(vq.channel_multiplier) - 1)
    if factor != SPATIAL_FACTOR:
        raise ValueError(f"the Emu3 VQ model maps {factor} pixels to a code (channel_multiplier "
                         f"{list(vq.channel_multiplier)}), but Emu3Processor sizes prompts for {SPATIAL_FACTOR}")
    rows, cols = emu3_grid(image_area)
    span = rows * (cols + 1) + 3  # codes, a row end after each row, then end of frame, end of image, EOS
    room = text.max_position_embeddings - span
    if room < max_prompt_tokens:
        raise ValueError(f"image_area {image_area} takes {rows}x{cols} codes, {span} positions with row ends and "
                         f"end tokens: with "
                         f"prompts of up to {max_prompt_tokens} tokens (max_prompt_tokens) this exceeds the "
                         f"{text.max_position_embeddings} positions of the language model (max_position_embeddings); "
                         f"lower image_area or max_prompt_tokens (room for {max(room, 0)} prompt tokens)")
    eos = generation_config.eos_token_id if generation_config.eos_token_id is not None else text.eos_token_id
    pad = generation_config.pad_token_id if generation_config.pad_token_id is not None else text.pad_token_id
    defaults = emu3_defaults(generation_config)
    return MLLMConfig(
        vocab_size=vq.codebook_size, text_vocab_size=text.vocab_size, dim=text.hidden_size,
        n_layer=text.num_hidden_layers, n_head=text.num_attention_heads, n_kv_head=text.num_key_value_heads,
        norm_eps=text.rms_norm_eps, rope_base=float(rope["rope_theta"]), intermediate_size=text.intermediate_size,
        image_rows=rows, image_cols=cols, row_end=(_token_id(vocab, EOL_TOKEN),),
        tail=(_token_id(vocab, EOF_TOKEN), _token_id(vocab, EOI_TOKEN), int(eos)),
        max_positions=text.max_position_embeddings, max_prompt_tokens=max_prompt_tokens, pad_token_id=int(pad),
        cfg_scale=defaults.cfg_scale, top_k=defaults.top_k)


def emu3_state_dict(hf: dict[str, torch.Tensor], config: MLLMConfig,
                    code_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """:class:`LayoutLM`'s weights from an ``Emu3ForConditionalGeneration`` state dict (``transformers`` 5 keys
    ``model.text_model.*`` and ``lm_head``): query and key rows permuted for vgen's rotary pairs, the head cut to
    the rows of the visual tokens (``code_ids``, :func:`emu3_code_ids`)."""
    lm = "model.text_model."
    head = hf["lm_head.weight"]
    out = {"text_embeddings.weight": hf[lm + "embed_tokens.weight"], "code_ids": code_ids.to(head.device),
           "norm.weight": hf[lm + "norm.weight"], "head.weight": head[code_ids.to(head.device)]}
    for i in range(config.n_layer):
        out.update(llama_block_weights(hf.__getitem__, f"{lm}layers.{i}.", f"layers.{i}.", config.n_head,
                                       config.kv_heads))
    return out


class Emu3VQ(nn.Module):
    """``transformers``' ``Emu3VQVAE`` as a vgen tokenizer: codes -> pixels in [-1, 1] (the image processor's
    ``postprocess`` un-normalises with its ``image_mean`` / ``image_std``; this maps the same pixels to [-1, 1]), and
    the raw codebook rows its nearest-neighbour quantiser compares against."""

    def __init__(self, vqmodel: nn.Module, image_mean: Sequence[float] = (0.5, 0.5, 0.5),
                 image_std: Sequence[float] = (0.5, 0.5, 0.5)) -> None:
        super().__init__()
        self.vqmodel = vqmodel
        if self.downsample_factor != SPATIAL_FACTOR:
            raise ValueError(f"an Emu3 VQ model must map {SPATIAL_FACTOR} pixels to a code (Emu3Processor's "
                             f"downsample_ratio), this one maps {self.downsample_factor}")
        self.register_buffer("mean", torch.tensor(image_mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(image_std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)

    @property
    def codebook_size(self) -> int:
        return self.vqmodel.quantize.embedding.num_embeddings

    @property
    def downsample_factor(self) -> int:
        """Pixels per code along a side: the decoder doubles the size once per channel multiplier after the first."""
        return 2 ** (len(self.vqmodel.config.channel_multiplier) - 1)

    def codebook(self) -> torch.Tensor:
        return self.vqmodel.quantize.embedding.weight

    @torch.no_grad()
    def decode_code(self, codes: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        """Codes [B, h, w], or [B, h * w] with ``grid`` (h, w) (square when None) -> images [B, 3, 8h, 8w]."""
        if codes.ndim == 2:
            side = math.isqrt(codes.shape[1])
            h, w = grid if grid is not None else (side, side)
            if h * w != codes.shape[1]:
                raise ValueError(f"{codes.shape[1]} codes a row do not fill a {h}x{w} grid")
            codes = codes.reshape(codes.shape[0], h, w)
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.codebook_size):
            raise ValueError(f"codes must lie in [0, {self.codebook_size})")
        pixels = self.vqmodel.decode(codes).float() * self.std + self.mean
        return pixels * 2 - 1


def emu3_condition(processor: Any, prompts: Sequence[str], grid: tuple[int, int],
                   negative_prompt: str | Sequence[str] | None = None,
                   max_prompt_tokens: int | None = None) -> PrefixCondition:
    """The prompt rows the docs' ``generate`` call runs for a ``grid`` of codes: ``BOS + prompt + <|image start|>h*w
    <|image token|>`` (the processor's image-generation mode), left-padded to one length, and as ``null`` the
    negative prompt (one for all rows, or one per row; None: :data:`NEGATIVE_PROMPT`) tokenised as ``BOS + text`` as
    the docs do, left-padded to its own length. Rotary positions skip the padding in both; ``transformers``'
    guidance processor numbers the negative rows from their first position, padding included, so per-row negative
    prompts of different lengths give it other positions (the docs' one negative prompt has no padding)."""
    if isinstance(prompts, str) or not len(prompts):
        raise ValueError("give a non-empty list of prompts")
    for i, p in enumerate(prompts):
        if not isinstance(p, str) or not p.strip():
            raise ValueError(f"prompt {i} is empty or not a string")
    if negative_prompt is None:
        negative_prompt = NEGATIVE_PROMPT
    negatives = [negative_prompt] * len(prompts) if isinstance(negative_prompt, str) else list(negative_prompt)
    if len(negatives) != len(prompts) or not all(isinstance(n, str) for n in negatives):
        raise ValueError(f"negative_prompt must be one string or one per prompt ({len(prompts)})")
    rows, cols = grid
    if rows != cols:
        raise ValueError(f"Emu3 prompts here ask for square images, not a {rows}x{cols} grid")
    enc = processor(text=list(prompts), return_for_image_generation=True, image_area=(SPATIAL_FACTOR * rows) ** 2,
                    padding=True, padding_side="left", return_tensors="pt")
    if [list(s) for s in enc["image_sizes"]] != [[rows, cols]] * len(prompts):
        raise ValueError(f"the Emu3 processor asks for {enc['image_sizes'][0]} codes, not the model's {[rows, cols]}")
    neg = processor(text=negatives, padding=True, padding_side="left", return_tensors="pt")
    for name, e, header in (("prompt", enc, " with the image header"), ("negative prompt", neg, "")):
        mask = e["attention_mask"].bool()
        if max_prompt_tokens is not None and mask.shape[1] > max_prompt_tokens:
            longest = int(mask.sum(1).argmax())
            raise ValueError(f"{name} {longest} takes {int(mask[longest].sum())} tokens{header}; this model takes "
                             f"at most {max_prompt_tokens} (max_prompt_tokens): shorten it")
    null = PrefixCondition(neg["input_ids"], neg["attention_mask"].bool())
    return PrefixCondition(enc["input_ids"], enc["attention_mask"].bool(), null)


@dataclass
class LoadedEmu3:
    """What :func:`load_emu3` returns: the backbone, its VQ tokenizer, the ``transformers`` processor and the
    sampling defaults (with where they came from)."""

    model: LayoutLM
    tokenizer: Emu3VQ
    processor: Any
    defaults: Emu3Defaults

    def condition(self, prompts: Sequence[str], negative_prompt: str | Sequence[str] | None = None
                  ) -> PrefixCondition:
        """:func:`emu3_condition` of ``prompts`` for the model's grid, on the model's device."""
        cond = emu3_condition(self.processor, prompts, self.model.grid, negative_prompt,
                              self.model.config.max_prompt_tokens)
        return cond.to(self.model.head.weight.device)


def is_emu3_folder(folder: str | Path) -> bool:
    """Whether ``folder`` holds a ``transformers`` checkpoint whose config names the Emu3 model type."""
    return model_type(folder) == "emu3"


def check_emu3_folder(folder: str | Path) -> Path:
    """``folder`` as a Path, or a one-line ValueError if it is missing or not an Emu3 checkpoint with its processor
    (the original BAAI/Emu3-Gen layout, model_type 'Emu3' with remote code, is not read)."""
    return check_model_folder(folder, "emu3", "Emu3", EMU3_GEN_HINT,
                              "the original BAAI/Emu3-Gen layout (remote code) is not read, ")


def _tf5_key(name: str) -> str:
    """A weight name of an Emu3 hub file as ``transformers`` 5 names it after loading (its conversion mapping)."""
    if name.startswith("text_model.lm_head"):
        return name.replace("text_model.lm_head", "lm_head", 1)
    if name.startswith("text_model.model."):
        return "model.text_model." + name.removeprefix("text_model.model.")
    if name.startswith(("text_model.", "vqmodel.")):
        return "model." + name
    return name


def check_emu3_weights(folder: Path, hf_config: Any) -> None:
    """A one-line ValueError unless the folder's safetensors headers hold exactly the tensors, of the shapes, that
    ``Emu3ForConditionalGeneration`` of ``hf_config`` has (read before any weight is loaded)."""
    from transformers import Emu3ForConditionalGeneration

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{str(folder)!r} has an Emu3 config but no weights (*.safetensors)")
    got = {_tf5_key(k): v for f in files for k, v in safetensors_shapes(f).items()}
    with torch.device("meta"):
        reference = Emu3ForConditionalGeneration(hf_config)
    expected = {k: tuple(v.shape) for k, v in reference.state_dict().items()}
    problem = describe_mismatch(expected, got)
    if problem:
        raise ValueError(f"the weights in {str(folder)!r} do not fit its config.json: {problem}")


def emu3_from_transformers(hf_model: nn.Module, image_area: int = IMAGE_AREA,
                           max_prompt_tokens: int = 256) -> LayoutLM:
    """A :class:`LayoutLM` holding (sharing where it can) the language-model weights of an
    ``Emu3ForConditionalGeneration``."""
    config = emu3_config(hf_model.config, hf_model.generation_config, image_area, max_prompt_tokens)
    code_ids = emu3_code_ids(hf_model.config.vocabulary_map, config.vocab_size)
    with torch.device("meta"):
        model = LayoutLM(config)
    model.load_state_dict(emu3_state_dict(hf_model.state_dict(), config, code_ids), strict=True, assign=True)
    return model.eval()


def load_emu3(folder: str | Path, dtype: torch.dtype | None = None, device: torch.device | str | None = None,
              image_area: int = IMAGE_AREA, max_prompt_tokens: int = 256) -> LoadedEmu3:
    """An Emu3 checkpoint in ``transformers``' layout (``save_pretrained`` of ``Emu3ForConditionalGeneration`` and
    ``Emu3Processor`` in one folder, e.g. BAAI/Emu3-Gen-hf), read offline: the backbone generating ``image_area``
    pixels, the VQ tokenizer, the processor and the sampling defaults. Config, weights, image area and prompt room
    are checked before any weight is read."""
    path = check_emu3_folder(folder)
    try:
        from transformers import Emu3Config, Emu3ForConditionalGeneration, Emu3Processor, GenerationConfig
    except ImportError as e:
        raise ImportError(f"Emu3 needs transformers (pip install -e \".[t2i]\"): {e}") from None
    hf_config = Emu3Config.from_pretrained(path, local_files_only=True)
    try:
        generation_config = GenerationConfig.from_pretrained(path, local_files_only=True)
    except OSError:
        generation_config = GenerationConfig.from_model_config(hf_config)
    emu3_config(hf_config, generation_config, image_area, max_prompt_tokens)  # grid, room and tokens, before weights
    check_emu3_weights(path, hf_config)
    processor = Emu3Processor.from_pretrained(path, local_files_only=True)
    hf = Emu3ForConditionalGeneration.from_pretrained(path, local_files_only=True, dtype=dtype or torch.float32)
    model = emu3_from_transformers(hf, image_area, max_prompt_tokens)
    image_processor = processor.image_processor
    tokenizer = Emu3VQ(hf.model.vqmodel, image_processor.image_mean, image_processor.image_std).eval()
    if device is not None:
        model, tokenizer = model.to(device), tokenizer.to(device)
    return LoadedEmu3(model, tokenizer, processor, emu3_defaults(hf.generation_config))
