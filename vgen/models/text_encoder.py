"""T5 text features for text-to-image models, as LlamaGen-T2I takes them: FLAN-T5-XL's encoder output for a
prompt of at most 120 tokens, left-padded (the valid positions at the end of each row) with its mask.

``transformers`` is an optional dependency (``pip install -e ".[t2i]"``): it is imported when a folder is loaded,
so the rest of vgen works without it. Weights and tokenizer come from a local folder only, never from a hub.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vgen.models.conditioning import PrefixCondition

T5_MAX_LENGTH = 120
"""LlamaGen-T2I's caption length (its ``cls_token_num`` and ``--t5-feature-max-len``)."""

LLAMAGEN_T5_SUBFOLDER = "flan-t5-xl"
"""LlamaGen's sampler reads ``<--t5-path>/flan-t5-xl``; a folder laid out that way is accepted as well."""

T5_FOLDER_HINT = ("put the FLAN-T5-XL files there: the folder holding config.json, the weights and the tokenizer "
                  "files, e.g. a download of google/flan-t5-xl")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
TOKENIZER_FILES = ("tokenizer.json", "spiece.model")


class PromptTruncatedWarning(UserWarning):
    """A prompt had more tokens than the text encoder takes; its end was dropped."""


def resolve_t5_folder(path: str | Path) -> Path:
    """The folder that holds a T5 model's ``config.json``, weights and tokenizer: ``path`` itself or LlamaGen's
    ``path/flan-t5-xl``. Raises a one-line ``FileNotFoundError`` or ``ValueError`` naming what is missing or wrong."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"no T5 folder at {folder}: {T5_FOLDER_HINT}")
    if not (folder / "config.json").is_file() and (folder / LLAMAGEN_T5_SUBFOLDER / "config.json").is_file():
        folder = folder / LLAMAGEN_T5_SUBFOLDER
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"the T5 folder {folder} has no config.json: {T5_FOLDER_HINT}")
    try:
        model_type = json.loads(config_file.read_text()).get("model_type")
    except (json.JSONDecodeError, AttributeError):
        raise ValueError(f"{config_file} is not a model config (a JSON object with a model_type)") from None
    if model_type != "t5":
        raise ValueError(f"{folder} holds a {model_type!r} model, not a T5 one (its config.json needs model_type "
                         f"'t5'): {T5_FOLDER_HINT}")
    if not any(any(folder.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        raise FileNotFoundError(f"the T5 folder {folder} has no weights (model*.safetensors or pytorch_model*.bin): "
                                f"{T5_FOLDER_HINT}")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(f"the T5 folder {folder} has no tokenizer (tokenizer.json or spiece.model): {T5_FOLDER_HINT}")
    return folder


def check_caption_dim(text_dim: int, caption_dim: int, source: str = "the text encoder") -> None:
    """Raises a one-line ``ValueError`` unless ``source``'s ``text_dim``-wide features fit a model that expects
    ``caption_dim`` (LlamaGen-T2I: 2048, FLAN-T5-XL's width)."""
    if text_dim != caption_dim:
        raise ValueError(f"{source} gives {text_dim}-dim caption features but the model expects caption_dim="
                         f"{caption_dim}: use the text encoder the checkpoint was trained with")


class T5TextEncoder(nn.Module):
    """A T5 encoder and its tokenizer turning prompts into left-padded caption features and their mask.

    Prompts are lower-cased and stripped (LlamaGen's plain text preprocessing), tokenised with the end-of-sequence
    token, cut to ``max_length`` tokens with a :class:`PromptTruncatedWarning`, encoded, then left-padded
    (:meth:`~vgen.models.conditioning.PrefixCondition.from_padded`). Build it with :meth:`from_pretrained`; move
    it with ``to(device, dtype)``.
    """

    def __init__(self, model: nn.Module, tokenizer: Any, max_length: int = T5_MAX_LENGTH) -> None:
        super().__init__()
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_length = max_length

    @classmethod
    def from_pretrained(cls, path: str | Path, max_length: int = T5_MAX_LENGTH, device: str | torch.device = "cpu",
                        dtype: torch.dtype = torch.float32) -> T5TextEncoder:
        """Loads the T5 encoder (the decoder of a full T5 checkpoint is left out) and its tokenizer from the local
        folder ``path`` (see :func:`resolve_t5_folder`), in ``dtype`` on ``device``."""
        folder = resolve_t5_folder(path)
        try:
            from transformers import AutoTokenizer, T5EncoderModel
        except ImportError:
            raise ImportError('the T5 text encoder needs transformers: pip install -e ".[t2i]"') from None
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        model = T5EncoderModel.from_pretrained(folder, local_files_only=True, dtype=dtype)
        return cls(model, tokenizer, max_length).to(device)

    @property
    def caption_dim(self) -> int:
        """The width of the features (the encoder's ``d_model``: 2048 for FLAN-T5-XL)."""
        return self.model.config.d_model

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def encode(self, prompts: str | Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Caption features [B, max_length, caption_dim] in the encoder's dtype, zero at padded positions, and the
        bool mask [B, max_length] of valid positions, both left-padded (``prompt_embeds`` and
        ``prompt_attention_mask`` as LlamaGen-T2I takes them)."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if not prompts:
            raise ValueError("no prompt given: give at least one prompt")
        texts = [prompt.lower().strip() for prompt in prompts]
        self._warn_truncated(texts)
        batch = self.tokenizer(texts, max_length=self.max_length, padding="max_length", truncation=True,
                               add_special_tokens=True, return_tensors="pt")
        input_ids = batch["input_ids"].to(self.device)
        mask = batch["attention_mask"].to(self.device)
        with torch.no_grad():
            hidden = self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        cond = PrefixCondition.from_padded(hidden, mask, self.max_length)
        return cond.values, cond.mask

    def condition(self, prompts: str | Sequence[str]) -> PrefixCondition:
        """:meth:`encode` as the condition a LlamaGen-T2I backbone takes."""
        return PrefixCondition(*self.encode(prompts))

    def _warn_truncated(self, texts: list[str]) -> None:
        """Warns, prompt by prompt, which tokens the ``max_length`` cut drops (the end-of-sequence token is kept)."""
        kept = self.max_length - self.tokenizer.num_special_tokens_to_add(pair=False)
        token_ids = self.tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
        for index, ids in enumerate(token_ids):
            if len(ids) > kept:
                dropped = self.tokenizer.decode(ids[kept:])
                warnings.warn(f"prompt {index} has {len(ids)} text tokens but the text encoder keeps {kept} "
                              f"(max_length {self.max_length} with the end-of-sequence token): its last "
                              f"{len(ids) - kept} tokens were dropped: {dropped!r}", PromptTruncatedWarning,
                              stacklevel=3)
