"""CLIP score of images against their prompts, as torchmetrics' ``CLIPScore`` (1.9) computes it.

For a pair (image I, prompt C), with ``E_I`` and ``E_C`` the projected image and text embeddings of a
``transformers`` ``CLIPModel`` after its ``CLIPProcessor``::

    score(I, C) = 100 * cos(E_I, E_C)                      (per pair, in [-100, 100])
    CLIP score  = max(mean over the pairs of score, 0)     (torchmetrics' ``compute``)

torchmetrics clamps the mean, not each pair (its docstring writes ``max(100 cos, 0)`` per pair; its code sums the
unclamped pair scores and clamps their mean). :meth:`ClipScorer.scores` returns the unclamped pair scores and
:func:`clip_mean` their clamped mean, so that the value of any subset (a prompt category) is torchmetrics' too.
torchmetrics 1.9 itself cannot run on ``transformers`` 5 (``get_image_features`` returns an output object); the
embeddings here come from ``CLIPModel.forward`` (``image_embeds``, ``text_embeds``), which every CLIP has.

Images go through the folder's processor with its PIL backend (resize of the shortest edge, bicubic; center crop;
rescale; normalise): the slow ``CLIPImageProcessor`` that torchmetrics ran under ``transformers`` 4. Text goes
through its tokenizer without truncation, padded to the longest prompt of a batch; a prompt of more tokens
than the text model's positions (``max_position_embeddings``, 77 for OpenAI's CLIP) is cut to the first 77 tokens
as torchmetrics cuts it (its end-of-text token dropped too), with one warning that counts the prompts cut.

The model comes from a local folder in ``transformers``' layout (``save_pretrained`` of ``CLIPModel`` and
``CLIPProcessor``), e.g. a download of openai/clip-vit-large-patch14, the model the papers use. ``transformers``
is imported when a folder is loaded (the ``t2i`` extra).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from vgen.eval.evaluate import versions
from vgen.eval.weights import sha256_of
from vgen.models.text_encoder import WEIGHT_PATTERNS

CLIP_FOLDER_HINT = ("give a CLIP model in transformers' layout (config.json with model_type 'clip', the weights and "
                    "the processor files), e.g. `huggingface-cli download openai/clip-vit-large-patch14 --local-dir "
                    "DIR` on a machine with internet")
TOKENIZER_FILES = ("tokenizer.json", "vocab.json")
IMAGE_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


class PromptTruncatedWarning(UserWarning):
    """Prompts had more tokens than the CLIP text model's positions; they were cut to its length."""


def check_clip_folder(folder: str | Path) -> Path:
    """``folder`` as a Path, or a one-line ``FileNotFoundError`` / ``ValueError`` naming it and what is missing or
    wrong: no folder, no or unreadable config.json, a model other than CLIP, no weights, no processor files."""
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"no CLIP folder at {path}: {CLIP_FOLDER_HINT}")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{path} is not a CLIP model folder (no config.json): {CLIP_FOLDER_HINT}")
    try:
        kind = json.loads(config_file.read_text()).get("model_type")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        raise ValueError(f"{config_file} is not a model config (a JSON object with a model_type)") from None
    if kind != "clip":
        raise ValueError(f"{path} holds a {kind!r} model, not CLIP (its config.json needs model_type 'clip'): "
                         f"{CLIP_FOLDER_HINT}")
    if not any(any(path.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        raise FileNotFoundError(f"the CLIP folder {path} has no weights (*.safetensors or pytorch_model*.bin): "
                                f"{CLIP_FOLDER_HINT}")
    for files, what in ((TOKENIZER_FILES, "tokenizer"), (IMAGE_PROCESSOR_FILES, "image processor config")):
        if not any((path / name).is_file() for name in files):
            raise ValueError(f"the CLIP folder {path} has no {what} ({' or '.join(files)}): save the CLIPProcessor "
                             f"there too (processor.save_pretrained)")
    return path


def check_pairs(images: np.ndarray, prompts: Sequence[str], images_from: str = "", prompts_from: str = "") -> None:
    """A one-line ``ValueError`` unless ``images`` is uint8 [N, H, W, 3] and ``prompts`` holds N non-blank texts;
    ``images_from`` / ``prompts_from`` name where they were read, for the message."""
    def source(name: str) -> str:
        return f" in {name}" if name else ""

    if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
        raise ValueError(f"expected uint8 images [N, H, W, 3]{source(images_from)}, got {images.dtype} "
                         f"{images.shape}")
    if len(images) != len(prompts):
        raise ValueError(f"{len(images)} images{source(images_from)} but {len(prompts)} prompts"
                         f"{source(prompts_from)}: the CLIP score needs one prompt per image")
    if not len(prompts):
        raise ValueError("no images and prompts to score")
    blank = [i for i, p in enumerate(prompts) if not isinstance(p, str) or not p.strip()]
    if blank:
        raise ValueError(f"prompt {blank[0]}{source(prompts_from)} is empty ({len(blank)} empty in all): every image "
                         f"needs its prompt")


def clip_mean(scores: np.ndarray) -> float:
    """The CLIP score of a set from its pair scores (:meth:`ClipScorer.scores`): their mean, clamped at 0."""
    return max(float(np.mean(scores)), 0.0)


class ClipScorer:
    """A loaded CLIP model and processor (:func:`load_clip`) that scores (image, prompt) pairs."""

    def __init__(self, model: torch.nn.Module, processor: Any, folder: Path | None = None) -> None:
        self.model = model.eval()
        self.processor = processor
        self.folder = folder

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def max_tokens(self) -> int:
        """Tokens the text model takes (``max_position_embeddings``); longer prompts are cut to this many."""
        return self.model.config.text_config.max_position_embeddings

    def pixel_values(self, images: np.ndarray) -> torch.Tensor:
        """uint8 images [N, H, W, 3] -> the processor's ``pixel_values`` [N, 3, S, S] (float32, on the CPU)."""
        return self.processor(images=list(images), return_tensors="pt")["pixel_values"]

    def text_inputs(self, prompts: Sequence[str]) -> dict[str, torch.Tensor]:
        """``input_ids`` and ``attention_mask`` of ``prompts`` as torchmetrics makes them: tokenized without
        truncation, padded to the longest, then cut to :attr:`max_tokens` columns."""
        batch = self.processor(text=list(prompts), padding=True, return_tensors="pt", verbose=False)
        return {key: batch[key][:, :self.max_tokens] for key in ("input_ids", "attention_mask")}

    def truncated(self, prompts: Sequence[str]) -> int:
        """How many of ``prompts`` have more tokens (start and end tokens included) than :attr:`max_tokens`."""
        ids = self.processor(text=list(prompts), verbose=False)["input_ids"]
        return sum(len(row) > self.max_tokens for row in ids)

    def scores(self, images: np.ndarray, prompts: Sequence[str], batch_size: int = 64,
               progress: bool = False) -> np.ndarray:
        """float64 [N]: ``100 * cos`` of each image's and its prompt's CLIP embeddings, not clamped (the set's score
        is :func:`clip_mean` of these). Prompts over :attr:`max_tokens` tokens are cut, with one
        :class:`PromptTruncatedWarning` that counts them (:meth:`truncated`)."""
        images, prompts = np.asarray(images), list(prompts)
        check_pairs(images, prompts)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        cut = self.truncated(prompts)
        if cut:
            warnings.warn(f"{cut} of {len(prompts)} prompts have more than {self.max_tokens} tokens, CLIP's text "
                          f"length: they are cut to their first {self.max_tokens} tokens, as torchmetrics cuts them",
                          PromptTruncatedWarning, stacklevel=2)
        out = []
        for i in tqdm(range(0, len(images), batch_size), desc="clip", disable=not progress):
            text = self.text_inputs(prompts[i:i + batch_size])
            with torch.no_grad():
                output = self.model(pixel_values=self.pixel_values(images[i:i + batch_size]).to(self.device),
                                    **{key: value.to(self.device) for key, value in text.items()})
            out.append((100 * (output.image_embeds * output.text_embeds).sum(-1)).double().cpu().numpy())
        return np.concatenate(out)


def load_clip(folder: str | Path, device: str | torch.device = "cpu") -> ClipScorer:
    """The CLIP model and processor of a local folder in ``transformers``' layout (checked by
    :func:`check_clip_folder`), fp32 on ``device``."""
    path = check_clip_folder(folder)
    try:
        from transformers import CLIPModel, CLIPProcessor
    except ImportError as e:
        raise ImportError(f"the CLIP score needs transformers (pip install -e '.[t2i]'): {e}") from None
    model = CLIPModel.from_pretrained(path, local_files_only=True, dtype=torch.float32).to(device)
    processor = CLIPProcessor.from_pretrained(path, local_files_only=True, backend="pil")
    return ClipScorer(model, processor, path)


def weights_of(folder: Path) -> tuple[str, str | None]:
    """The weights file of a CLIP folder and its SHA-256 (sharded weights: their count and pattern, and None)."""
    for pattern in WEIGHT_PATTERNS:
        files = sorted(folder.glob(pattern))
        if len(files) == 1:
            return files[0].name, sha256_of(files[0])
        if files:
            return f"{len(files)} files {pattern}", None
    raise FileNotFoundError(f"the CLIP folder {folder} has no weights")


def clip_score(images: np.ndarray, prompts: Sequence[str], clip: ClipScorer | str | Path, batch_size: int = 64,
               device: str = "cpu", progress: bool = False) -> dict:
    """The CLIP score of ``images`` against ``prompts`` with ``clip`` (a :class:`ClipScorer` or a folder, loaded on
    ``device``), as a flat dict for JSON: ``clip_score``, ``count``, ``truncated``, the model folder, its weights'
    file and SHA-256, and ``warnings`` (the messages caught, also the truncation's)."""
    scorer = clip if isinstance(clip, ClipScorer) else load_clip(clip, device)
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        scores = scorer.scores(images, prompts, batch_size, progress)
    weights, sha256 = weights_of(scorer.folder) if scorer.folder is not None else (None, None)
    return {"clip_score": clip_mean(scores), "count": len(scores), "truncated": scorer.truncated(prompts),
            "max_tokens": scorer.max_tokens, "clip": None if scorer.folder is None else str(scorer.folder),
            "weights": weights, "weights_sha256": sha256,
            "versions": {**versions(), "transformers": version("transformers")},
            "warnings": [str(r.message) for r in records]}
