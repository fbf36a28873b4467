"""Local weight files for the reference feature extractors: where they are looked for, how they are checked.

vgen never downloads. A file is taken from the path given on the command line (``--weights``), else from the
folder named by ``$VGEN_WEIGHTS_DIR``, else from ``~/.cache/vgen``, under one of the file names the reference
implementations publish it under. Where the reference SHA-256 is known the file must match it (a different file
would give numbers that are not comparable with published ones); otherwise its hash is recorded with the results.
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from vgen.hub import CheckpointError, read_safetensors, torch_load

WEIGHTS_ENV = "VGEN_WEIGHTS_DIR"
CACHE_DIR = Path.home() / ".cache" / "vgen"


class WeightsError(ValueError):
    """A weights file is missing, is not the reference file, or does not fit the architecture."""


@dataclass(frozen=True)
class WeightsSpec:
    """A reference weights file: what it is, the names it is published under, its SHA-256 if known, and where."""

    title: str
    filenames: tuple[str, ...]
    sha256: str | None
    source: str


def search_dirs() -> list[Path]:
    env = os.environ.get(WEIGHTS_ENV)
    return ([Path(env).expanduser()] if env else []) + [CACHE_DIR]


def find_weights(spec: WeightsSpec, path: str | Path | None = None) -> Path:
    """The file given as ``path``, else the first of ``spec.filenames`` in :func:`search_dirs`."""
    if path is not None:
        path = Path(path).expanduser()
        if not path.is_file():
            raise WeightsError(f"weights file not found: {path} (expected {spec.title}{_hash_hint(spec)})")
        return path
    for folder in search_dirs():
        for name in spec.filenames:
            if (folder / name).is_file():
                return folder / name
    env = os.environ.get(WEIGHTS_ENV)
    looked = f"${WEIGHTS_ENV} ({env or 'unset'}) and {CACHE_DIR}"
    raise WeightsError(f"{spec.title} not found: looked for {' or '.join(spec.filenames)} in {looked}; put the file "
                       f"there or pass --weights PATH{_hash_hint(spec)}; it is published at {spec.source}")


def _hash_hint(spec: WeightsSpec) -> str:
    return f", SHA-256 {spec.sha256}" if spec.sha256 else ""


_HASHES: dict[tuple[str, int, int], str] = {}


def sha256_of(path: str | Path) -> str:
    """Hex SHA-256 of a file (remembered per path, size and modification time)."""
    p = Path(path).resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        digest = hashlib.sha256()
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        _HASHES[key] = digest.hexdigest()
    return _HASHES[key]


def check_hash(spec: WeightsSpec, path: Path, verify: bool = True) -> tuple[str, bool | None]:
    """(sha256, verified): verified is None when no reference hash is known, False when ``verify`` is off and the
    file differs; a differing file with ``verify`` on is an error."""
    digest = sha256_of(path)
    if spec.sha256 is None:
        return digest, None
    if digest == spec.sha256:
        return digest, True
    if verify:
        raise WeightsError(f"{path} is not the reference {spec.title}: its SHA-256 is {digest}, expected "
                           f"{spec.sha256} (pass --no-verify-weights to use it anyway; results then carry its hash)")
    return digest, False


def is_torchscript(path: str | Path) -> bool:
    """TorchScript archives are zip files holding a ``code/`` folder; state dicts saved by torch.save are not."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as z:
        return any("/code/" in name for name in z.namelist())


def load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of a ``.safetensors`` file or of a ``torch.save``-d state dict (loaded with ``weights_only=True``)."""
    path = Path(path)
    if is_torchscript(path):
        raise WeightsError(f"{path} is a TorchScript archive, not a state dict of the reference layout")
    try:
        state = read_safetensors(path) if path.suffix == ".safetensors" else torch_load(path, "weights file")
    except CheckpointError as e:
        raise WeightsError(str(e)) from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightsError(f"{path} does not hold a state dict of tensors")
    return state


def load_into(module: nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    """Load ``state`` strictly into ``module``, naming missing, unexpected and misshapen keys.

    BatchNorm's ``num_batches_tracked`` counters are optional (files converted from TensorFlow lack them); they
    play no part in evaluation.
    """
    expected = module.state_dict()
    state = dict(state)
    for key, value in expected.items():
        if key.endswith("num_batches_tracked"):
            state.setdefault(key, value)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = sorted(k for k in set(expected) & set(state) if tuple(expected[k].shape) != tuple(state[k].shape))
    if missing or unexpected or shapes:
        parts = [f"{label} {len(keys)} ({', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''})"
                 for label, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", shapes))
                 if keys]
        raise WeightsError(f"the weights do not fit {what}: {'; '.join(parts)}")
    module.load_state_dict(state)
