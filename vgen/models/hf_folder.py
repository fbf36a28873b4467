"""Folders written by ``transformers``' ``save_pretrained`` (a model and its processor), told apart by the
``model_type`` of their ``config.json`` and checked before anything is loaded, each problem in one line."""

from __future__ import annotations

import json
from pathlib import Path


def model_type(folder: str | Path) -> str | None:
    """The ``model_type`` that ``folder/config.json`` records, or None when there is no readable one."""
    config_file = Path(folder) / "config.json"
    try:
        kind = json.loads(config_file.read_text()).get("model_type") if config_file.is_file() else None
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return None
    return kind if isinstance(kind, str) else None


def check_model_folder(folder: str | Path, kind: str, family: str, hint: str, other_layouts: str = "") -> Path:
    """``folder`` as a Path, or a one-line ValueError if it is missing, has no readable ``config.json``, holds a
    model whose ``model_type`` is not ``kind`` (``other_layouts`` then says which layouts are not read) or has no
    tokenizer. ``family`` names the model in the messages; ``hint`` (with ``{folder}``) says how to get one."""
    path = Path(folder)
    hint = hint.format(folder=path)
    a = "an" if family[0] in "AEIOU" else "a"
    if not path.is_dir():
        raise ValueError(f"{family} folder {str(path)!r} does not exist; {hint}")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{str(path)!r} is not {a} {family} checkpoint (no config.json); {hint}")
    try:
        found = json.loads(config_file.read_text()).get("model_type")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise ValueError(f"{str(config_file)!r} is not a readable config: {e}") from None
    if found != kind:
        raise ValueError(f"{str(path)!r} holds a {found!r} model, not {family} (model_type {kind!r}); "
                         f"{other_layouts}{hint}")
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer.model")):
        raise ValueError(f"{str(path)!r} has {a} {family} model but no tokenizer (tokenizer.json); save the processor "
                         f"there too (processor.save_pretrained)")
    return path
