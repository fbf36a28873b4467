"""Local checkpoints: vgen's own format (``config.json`` + ``model.safetensors``) and LlamaGen ``.pt`` files.

Nothing is downloaded: every loader takes a local path and, when the file is not there, says where to put it.
Pickled checkpoints are read with ``torch.load(weights_only=True)``; vgen writes safetensors only. A state dict
that does not fit the model fails with :class:`CheckpointError`, naming the missing and unexpected keys and the
shapes that differ. A folder's ``config.json`` names its model class by a name of :data:`MODEL_CLASSES`. The models
shipped inside the package lie under :data:`ASSETS`, where evaluation and training find them without a pipeline.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from vgen.models.blockdiff import BlockDiffConfig, BlockDiffusionTransformer
from vgen.models.classifier import (
    AttributeClassifier,
    AttributeClassifierConfig,
    ClassifierConfig,
    ShapesClassifier,
    ShapesVideoClassifier,
    VideoClassifierConfig,
)
from vgen.models.draft_head import DraftHead, DraftHeadConfig
from vgen.models.llamagen import GPTConfig, LlamaGenGPT
from vgen.models.mar import ContinuousAR, MARConfig
from vgen.models.nar import NARConfig, NARTransformer
from vgen.models.nbp import NBPConfig, NBPTransformer
from vgen.models.word_encoder import WordEncoderConfig, WordTextEncoder
from vgen.tokenizers.kl import KLConfig, KLTokenizer
from vgen.tokenizers.vq import VQConfig, VQModel

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
ASSETS = Path(__file__).parent / "assets"
"""The embedded models and judges shipped inside the package, one folder each."""
PIPELINE_CONFIG = "pipeline.json"
"""The file that makes a folder a pipeline folder (names, image size, defaults), beside its model folders."""


class CheckpointError(ValueError):
    """A checkpoint is missing, unreadable, or does not match the model it is loaded into."""


MODEL_CLASSES: dict[str, tuple[type[nn.Module], type]] = {
    "LlamaGenGPT": (LlamaGenGPT, GPTConfig), "VQModel": (VQModel, VQConfig),
    "ShapesClassifier": (ShapesClassifier, ClassifierConfig),
    "ShapesVideoClassifier": (ShapesVideoClassifier, VideoClassifierConfig),
    "DraftHead": (DraftHead, DraftHeadConfig),
    "NARTransformer": (NARTransformer, NARConfig), "NBPTransformer": (NBPTransformer, NBPConfig),
    "ContinuousAR": (ContinuousAR, MARConfig),
    "KLTokenizer": (KLTokenizer, KLConfig),
    "BlockDiffusionTransformer": (BlockDiffusionTransformer, BlockDiffConfig),
    "WordTextEncoder": (WordTextEncoder, WordEncoderConfig),
    "AttributeClassifier": (AttributeClassifier, AttributeClassifierConfig)}
"""The model classes a ``config.json`` may name, by the name it records."""


def register_model_class(name: str, model_cls: type[nn.Module], config_cls: type) -> None:
    """Let :func:`from_pretrained` build ``model_cls`` from a folder whose config names ``name``."""
    MODEL_CLASSES[name] = (model_cls, config_cls)


def save_pretrained(model: nn.Module, path: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write ``model`` (which must have a ``config`` with ``to_dict``) as ``path/config.json`` + safetensors."""
    name = type(model).__name__
    if name not in MODEL_CLASSES:
        raise TypeError(f"{name} is not a registered vgen model class")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for k, v in model.state_dict().items():
        v = v.detach().cpu().contiguous()
        tensors[k] = v.to(dtype) if dtype is not None and v.dtype.is_floating_point else v
    save_file(tensors, str(path / WEIGHTS_NAME))
    (path / CONFIG_NAME).write_text(json.dumps({"class": name, "config": model.config.to_dict()}, indent=1))
    return path


def read_config(path: str | Path) -> dict:
    path = Path(path)
    cfg_path = path / CONFIG_NAME
    if not cfg_path.is_file():
        raise CheckpointError(f"no {CONFIG_NAME} in {path}: expected a folder written by save_pretrained")
    try:
        return json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfg_path} is not valid JSON: {e}") from None


def from_pretrained(path: str | Path, map_location: str | torch.device = "cpu") -> nn.Module:
    """Build and load a model saved with :func:`save_pretrained`."""
    path = Path(path)
    meta = read_config(path)
    if meta.get("class") not in MODEL_CLASSES:
        raise CheckpointError(f"{path / CONFIG_NAME} names model class {meta.get('class')!r}; "
                              f"known: {sorted(MODEL_CLASSES)}")
    model_cls, config_cls = MODEL_CLASSES[meta["class"]]
    try:
        config = config_cls.from_dict(meta["config"])
    except (TypeError, ValueError, KeyError) as e:
        raise CheckpointError(f"bad model config in {path / CONFIG_NAME}: {e}") from None
    model = model_cls(config)
    load_weights(model, read_safetensors(path / WEIGHTS_NAME), source=str(path / WEIGHTS_NAME))
    return model.to(map_location).eval()


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"weights file not found: {path}")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {path} as safetensors ({e}); the file is corrupt or truncated") from None


def describe_mismatch(model: nn.Module, state: dict[str, torch.Tensor], ignore: tuple[str, ...] = ()) -> str:
    """Empty when ``state`` fits ``model`` exactly; else a message naming every difference."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state.items() if not k.startswith(ignore)}
    missing = sorted(set(expected) - set(got))
    unexpected = sorted(set(got) - set(expected))
    shapes = [f"{k}: checkpoint {got[k]} vs model {expected[k]}" for k in sorted(set(got) & set(expected))
              if got[k] != expected[k]]

    def clip(items: list[str]) -> str:
        return ", ".join(items[:8]) + (f", ... ({len(items)} in all)" if len(items) > 8 else "")

    parts = []
    if missing:
        parts.append(f"missing keys: {clip(missing)}")
    if unexpected:
        parts.append(f"unexpected keys: {clip(unexpected)}")
    if shapes:
        parts.append(f"shape mismatches: {clip(shapes)}")
    return "; ".join(parts)


def load_weights(model: nn.Module, state: dict[str, torch.Tensor], source: str = "checkpoint",
                 ignore: tuple[str, ...] = ()) -> None:
    """Strictly load ``state`` into ``model``, or raise :class:`CheckpointError` describing the mismatch."""
    problem = describe_mismatch(model, state, ignore)
    if problem:
        raise CheckpointError(f"{source} does not match {type(model).__name__}: {problem}")
    model.load_state_dict({k: v for k, v in state.items() if not k.startswith(ignore)}, strict=True)


# --------------------------------------------------------------------------------------------------------------
# LlamaGen .pt checkpoints


def read_torch_checkpoint(path: str | Path, what: str) -> dict[str, torch.Tensor]:
    """The state dict inside a LlamaGen ``.pt``: under ``model``, ``ema``, ``module``, ``state_dict`` (first found,
    in that order, as LlamaGen's sample scripts look) or the raw state dict of an FSDP ``consolidated.pth``."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{what} checkpoint not found: {path}. Download it from LlamaGen's release "
                              f"(e.g. the Hugging Face repo FoundationVision/LlamaGen) and pass its local path")
    try:
        # LlamaGen's trainers pickle their argparse options next to the weights ("args"): allow that class
        with torch.serialization.safe_globals([argparse.Namespace]):
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for truncated zips, pickles, or disallowed globals
        raise CheckpointError(f"cannot read {what} checkpoint {path}: {type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else 'unreadable'}") from None
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{what} checkpoint {path} holds a {type(ckpt).__name__}, not a state dict")
    for key in ("model", "ema", "module", "state_dict"):
        if isinstance(ckpt.get(key), dict):
            ckpt = ckpt[key]
            break
    state = {k.removeprefix("module.").removeprefix("_orig_mod."): v for k, v in ckpt.items()
             if isinstance(v, torch.Tensor)}
    if not state:
        raise CheckpointError(f"{what} checkpoint {path} holds no tensors")
    return state
