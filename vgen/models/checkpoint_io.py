"""Reading weight files safely: safetensors headers and tensors, ``torch.load(weights_only=True)`` for pickled
checkpoints (LlamaGen's ``.pt``, taming's ``.ckpt``), strict loading with a message naming every mismatch, and
:class:`CheckpointError` for all of it. Model loaders of every layer read their files through these."""

from __future__ import annotations

import argparse
import errno
import os
import warnings
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from torch import nn


class CheckpointError(ValueError):
    """A checkpoint is missing, unreadable, or does not match the model it is loaded into."""



def local_path(value: object, what: str) -> Path:
    """``value`` as a Path, or a TypeError / ValueError naming the argument ``what`` when it is not a non-empty
    str or Path that the file system can look up (no NUL character, not too long)."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{what} must be a str or Path, got {type(value).__name__}")
    if str(value) == "":
        raise ValueError(f"{what} is an empty string")
    if "\x00" in str(value):
        raise ValueError(f"{what} holds a NUL character")
    try:
        os.stat(value)
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:
            raise ValueError(f"{what} is too long for a path ({len(str(value))} characters)") from None
    return Path(value)



def safetensors_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the tensors in a safetensors file, from its header alone (no tensor data is read)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"weights file not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            names = f.keys()
            return {k: tuple(f.get_slice(k).get_shape()) for k in names}
    except (SafetensorError, OSError, ValueError):
        raise CheckpointError(f"cannot read {path}: the file is corrupt or not a safetensors checkpoint") from None



def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"weights file not found: {path}")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError):
        raise CheckpointError(f"cannot read {path}: the file is corrupt or not a safetensors checkpoint") from None



def describe_mismatch(expected: dict[str, tuple[int, ...]], got: dict[str, tuple[int, ...]]) -> str:
    """Empty when the tensor shapes ``got`` are exactly the ``expected`` ones; else a message naming every
    difference."""
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
    problem = describe_mismatch({k: tuple(v.shape) for k, v in model.state_dict().items()},
                                {k: tuple(v.shape) for k, v in state.items() if not k.startswith(ignore)})
    if problem:
        raise CheckpointError(f"{source} does not match {type(model).__name__}: {problem}")
    model.load_state_dict({k: v for k, v in state.items() if not k.startswith(ignore)}, strict=True)


def copy_shared_tensors(module: nn.Module, source: nn.Module) -> list[str]:
    """Copy every tensor of ``source`` whose name and shape ``module`` shares (a warm start across model kinds, e.g.
    a class model into a text model); returns the names of ``module``'s tensors left as initialised."""
    own, theirs = module.state_dict(), source.state_dict()
    shared = {k: v for k, v in theirs.items() if k in own and own[k].shape == v.shape}
    module.load_state_dict(shared, strict=False)
    return sorted(set(own) - set(shared))


def read_torch_checkpoint(path: str | Path, what: str) -> dict[str, torch.Tensor]:
    """The state dict inside a LlamaGen ``.pt``: under ``model``, ``ema``, ``module``, ``state_dict`` (first found,
    in that order, as LlamaGen's sample scripts look) or the raw state dict of an FSDP ``consolidated.pth``."""
    path = local_path(path, f"the {what} checkpoint")
    if not path.is_file():
        raise CheckpointError(f"{what} checkpoint not found: {path}. Download it from LlamaGen's release "
                              f"(e.g. the Hugging Face repo FoundationVision/LlamaGen) and pass its local path")
    ckpt = torch_load(path, f"{what} checkpoint")
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



def torch_load(path: str | Path, what: str = "checkpoint") -> object:
    """``torch.load(weights_only=True)`` on the CPU: tensors and plain containers (and the argparse options that
    LlamaGen's trainers pickle beside the weights), never code. A file torch cannot read that way is a
    :class:`CheckpointError` saying it is corrupt or not a checkpoint, and no more."""
    try:
        with torch.serialization.safe_globals([argparse.Namespace]), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "'torch.load' received a zip file that looks like a TorchScript")
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # truncated zips, foreign pickles, disallowed globals, TorchScript archives: torch varies
        raise CheckpointError(f"cannot read {what} {path}: the file is corrupt or not a checkpoint") from None
