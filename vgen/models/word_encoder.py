"""A small word-level text encoder: the stand-in for T5 in vgen's embedded text-to-image model.

The released FLAN-T5-XL cannot be shipped inside the package, and the embedded model's captions come from a closed
grammar (``vgen.data.scenes``), so a transformer encoder over that grammar's words, trained jointly with the image
model, does T5's job: it turns prompts into left-padded caption features with their mask, the condition a
LlamaGen-T2I backbone takes. Words outside the vocabulary read as one unknown token, with a warning naming them and
what to say instead (:func:`unknown_word_notes`).
"""

from __future__ import annotations

import difflib
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from vgen.data.scenes import caption_words
from vgen.models.backbone import GRID_LIMIT
from vgen.models.conditioning import PrefixCondition
from vgen.models.config_fields import ModelConfig, declare, size
from vgen.models.text_encoder import PromptTruncatedWarning

PAD, UNKNOWN, END = "<pad>", "<unk>", "<end>"
SPECIAL_WORDS = (PAD, UNKNOWN, END)


# counts a caption never states: the scenes hold one shape each
COUNT_WORDS = frozenset(("one", "two", "three", "four", "six", "seven", "eight", "nine", "ten", "several", "many",
                         "some", "few", "pair", "couple", "both", "multiple"))


class UnknownWordsWarning(UserWarning):
    """A prompt used words the text encoder was not trained on; they read as one unknown token each."""


def unknown_word_notes(prompt: str, known: set[str]) -> str:
    """What to tell the user about ``prompt``'s words, empty when there is nothing: the words outside ``known``,
    sorted, each with a hint (a plural: its singular; another word: the nearest known word by :mod:`difflib`, when
    one is close), then the plurals and counts (number words, and digits, which the encoder does not read at all)
    with the note that the model draws a single shape (in an image, or in each frame of a stream)."""
    notes, counts = [], []
    for word in sorted({w for w in caption_words(prompt) if w not in known}):
        singular = next((w for w in (word[:-1], word[:-2]) if word.endswith("s") and w in known), None)
        nearest = difflib.get_close_matches(word, sorted(known), n=1)
        if singular:
            notes.append(f"{word} (say {singular!r})")
        elif nearest and word not in COUNT_WORDS:
            notes.append(f"{word} (did you mean {nearest[0]!r}?)")
        else:
            notes.append(word)
        if singular or word in COUNT_WORDS:
            counts.append(word)
    digits = sorted(set(re.findall(r"\d+", prompt)), key=int)
    parts = [f"words this model does not know, read as unknown: {', '.join(notes)}"] if notes else []
    if counts or digits:
        unread = " (digits are not read)" if digits else ""
        parts.append(f"{', '.join(counts + digits)}: the model draws a single shape{unread}")
    return "; ".join(parts)


@dataclass(frozen=True)
class WordEncoderConfig(ModelConfig):
    """The vocabulary (special words first) and a pre-norm transformer encoder's sizes; ``max_length`` counts
    the end token, and is the caption length of the image model it conditions."""

    vocabulary: tuple[str, ...] = declare()
    dim: int = size(256)
    n_layer: int = size(2)
    n_head: int = size(4)
    max_length: int = size(24, at_least=2, at_most=GRID_LIMIT)

    def __post_init__(self) -> None:
        super().__post_init__()
        if tuple(self.vocabulary[:len(SPECIAL_WORDS)]) != SPECIAL_WORDS:
            raise ValueError(f"the vocabulary must start with {SPECIAL_WORDS}")
        if len(set(self.vocabulary)) != len(self.vocabulary):
            raise ValueError("the vocabulary has repeated words")
        if self.dim % self.n_head:
            raise ValueError(f"dim {self.dim} is not divisible by n_head {self.n_head}")

    @classmethod
    def for_words(cls, words: Sequence[str], **sizes) -> WordEncoderConfig:
        return cls(vocabulary=SPECIAL_WORDS + tuple(w for w in words if w not in SPECIAL_WORDS), **sizes)


class WordTextEncoder(nn.Module):
    """Prompts -> caption features [B, max_length, dim], left-padded, with their mask (see :meth:`encode`)."""

    def __init__(self, config: WordEncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.index = {word: i for i, word in enumerate(config.vocabulary)}
        self.known = set(config.vocabulary) - set(SPECIAL_WORDS)
        self.embed = nn.Embedding(len(config.vocabulary), config.dim)
        self.position = nn.Parameter(torch.randn(config.max_length, config.dim) * 0.02)
        layer = nn.TransformerEncoderLayer(config.dim, config.n_head, 4 * config.dim, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, config.n_layer, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(config.dim)

    @property
    def caption_dim(self) -> int:
        return self.config.dim

    @property
    def max_length(self) -> int:
        return self.config.max_length

    def tokenize(self, prompts: str | Sequence[str]) -> torch.Tensor:
        """Word ids [B, max_length], right-padded with ``<pad>`` (id 0), each prompt ended by ``<end>``; words
        past ``max_length - 1`` are dropped and words outside the vocabulary read ``<unk>``, with a warning
        naming them (:func:`unknown_word_notes`)."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if not prompts:
            raise ValueError("no prompt given: give at least one prompt")
        ids = torch.zeros(len(prompts), self.max_length, dtype=torch.long)
        kept = self.max_length - 1
        for row, prompt in enumerate(prompts):
            words = caption_words(prompt)
            if unknown := unknown_word_notes(prompt, self.known):
                warnings.warn(f"prompt {row}: {unknown}", UnknownWordsWarning, stacklevel=3)
            if len(words) > kept:
                warnings.warn(f"prompt {row} has {len(words)} words but the text encoder keeps {kept}: its last "
                              f"{len(words) - kept} were dropped: {' '.join(words[kept:])!r}",
                              PromptTruncatedWarning, stacklevel=3)
            row_ids = [self.index.get(w, self.index[UNKNOWN]) for w in words[:kept]] + [self.index[END]]
            ids[row, :len(row_ids)] = torch.tensor(row_ids)
        return ids

    def forward(self, word_ids: torch.Tensor) -> PrefixCondition:
        """Word ids [B, max_length] (right-padded, 0 = pad) -> the left-padded caption condition."""
        mask = word_ids != self.index[PAD]
        h = self.embed(word_ids) + self.position[:word_ids.shape[1]]
        h = self.norm(self.blocks(h, src_key_padding_mask=~mask))
        return PrefixCondition.from_padded(h, mask, self.max_length)

    def condition(self, prompts: str | Sequence[str]) -> PrefixCondition:
        """Prompts as the condition a LlamaGen-T2I backbone takes (no gradient)."""
        device = self.embed.weight.device
        with torch.no_grad():
            return self(self.tokenize(prompts).to(device))

    def encode(self, prompts: str | Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``prompt_embeds`` [B, max_length, dim] and ``prompt_attention_mask`` [B, max_length], left-padded."""
        cond = self.condition(prompts)
        return cond.values, cond.mask
