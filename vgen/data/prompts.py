"""Prompt sets of text-to-image evaluations, read from local files: plain text, MS-COCO captions, PartiPrompts,
GenEval.

Formats (:data:`FORMATS`), detected from the file's suffix (``.txt``, ``.json``, ``.tsv``, ``.jsonl``) and, for any
other suffix, from its content; ``format=`` overrides the detection:

- ``text``: one prompt a line, blank lines skipped; a prompt's id is its line number.
- ``coco``: MS-COCO caption annotations (``captions_val2014.json``, ``captions_val2017.json``: a JSON object whose
  ``"annotations"`` list holds ``{"image_id", "id", "caption"}``, about five captions per image). A prompt's id is
  its image id. The papers draw one caption per image, and so does this reader: the set is one caption of each
  image, chosen with ``seed``, every image without ``subset`` (images in the order they first appear among the
  annotations), ``subset`` of them with it (COCO-10k, COCO-30k).
- ``parti``: PartiPrompts' TSV (header ``Prompt\\tCategory\\tChallenge\\tNote``; quoted fields as a spreadsheet
  writes them); its Category and Challenge columns are kept, and a prompt's id is its row number (the header not
  counted).
- ``geneval``: GenEval's ``evaluation_metadata.jsonl`` (one JSON object a line with at least ``"prompt"`` and
  ``"tag"``); the tags are kept as categories, and a prompt's id is its line number.

In every format a prompt's surrounding spaces are stripped and each run of whitespace inside it (a tab, a line break
in a caption) becomes one space, as CLIP's tokenizer cleans text. Ids count from 1.

**Subsets** (:meth:`PromptSet.subset`) are seeded and deterministic: numpy's ``default_rng(seed)`` permutes the set's
distinct ids and keeps the first ``n``, then draws one prompt of every id (the set's only one, except for COCO's
captions), and the chosen prompts keep the set's order. The caption of an image does not depend on ``n``, and the
first ``n`` of a permutation are among its first ``m > n``, so with one seed a smaller subset is part of a larger one
(COCO-10k within COCO-30k).

Every mistake (a missing, unreadable or non-UTF-8 file, a file of another format, an empty prompt, a subset larger
than the set) is one ValueError that names the file and, where it helps, the line, row or annotation.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

FORMATS = ("text", "coco", "parti", "geneval")
SUFFIXES = {".txt": "text", ".json": "coco", ".tsv": "parti", ".jsonl": "geneval"}
PARTI_HEADER = "Prompt\tCategory\tChallenge\tNote"


@dataclass(frozen=True)
class PromptSet:
    """Prompts with, per prompt, the source's id (COCO image id; otherwise the 1-based line or row number), and
    PartiPrompts' Category and Challenge or GenEval's tag (as the category) where the format has them.
    ``subset_size`` and ``subset_seed`` record the draw that made the set from its file: the size of a subset (None:
    every prompt, for COCO every image) and its seed (also the seed of COCO's caption per image)."""

    prompts: tuple[str, ...]
    ids: tuple[str, ...]
    categories: tuple[str, ...] | None
    challenges: tuple[str, ...] | None
    format: str
    source: str
    subset_size: int | None = None
    subset_seed: int | None = None

    def __post_init__(self) -> None:
        check_format(self.format)
        columns = {"ids": self.ids, "categories": self.categories, "challenges": self.challenges}
        for name, column in columns.items():
            if column is not None and len(column) != len(self.prompts):
                raise ValueError(f"a prompt set's {name} must be one per prompt: {len(column)} for "
                                 f"{len(self.prompts)} prompts")

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def unit(self) -> str:
        """What the set's ids count: COCO's images, the other formats' prompts."""
        return "images" if self.format == "coco" else "prompts"

    def subset(self, n: int, seed: int = 0) -> PromptSet:
        """``n`` distinct ids drawn with ``seed`` and one prompt of each, in the set's order (the module docstring
        says how); a ValueError naming the source when ``n`` is not in [1, number of distinct ids]."""
        size = len(dict.fromkeys(self.ids))
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= size:
            raise ValueError(f"prompt file {self.source}: a subset of {n!r} cannot be drawn from its {size} "
                             f"{self.unit} (give 1 to {size})")
        return self.draw(int(n), seed)

    def draw(self, n: int, seed: int) -> PromptSet:
        """The first ``n`` of a seeded permutation of the distinct ids, each with one of its prompts."""
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"a subset seed must be a non-negative integer, got {seed!r}")
        positions: dict[str, list[int]] = {}
        for i, key in enumerate(self.ids):
            positions.setdefault(key, []).append(i)
        groups = list(positions.values())
        rng = np.random.default_rng(int(seed))
        chosen = np.sort(rng.permutation(len(groups))[:n])
        picks = rng.integers(0, [len(g) for g in groups])  # every id's prompt, drawn for all ids: independent of n
        keep = [groups[j][picks[j]] for j in chosen]

        def take(column: tuple[str, ...] | None) -> tuple[str, ...] | None:
            return None if column is None else tuple(column[i] for i in keep)

        return replace(self, prompts=take(self.prompts), ids=take(self.ids), categories=take(self.categories),
                       challenges=take(self.challenges), subset_size=n, subset_seed=int(seed))


def check_format(format: str) -> None:
    if format not in FORMATS:
        raise ValueError(f"unknown prompt file format {format!r}: use one of {', '.join(FORMATS)}")


def read_prompt_set(path: str | Path, format: str | None = None, subset: int | None = None,
                    seed: int = 0) -> PromptSet:
    """The prompts of ``path`` in ``format`` (None: detected), all of them or a seeded ``subset`` (COCO: one
    caption per image, chosen with ``seed``); a ValueError naming the file for every mistake."""
    if format is not None:
        check_format(format)
    text = read_text(path)
    format = format or detect_format(Path(path), text)
    full = READERS[format](text, str(path))
    if subset is not None:
        return full.subset(subset, seed)
    if format == "coco":
        return replace(full.draw(len(dict.fromkeys(full.ids)), seed), subset_size=None)
    return full


def read_text(path: str | Path) -> str:
    """A prompt file's UTF-8 text (a byte-order mark dropped)."""
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"prompt file {path} is not UTF-8 text (byte {e.start}): save it as UTF-8") from None
    except OSError as e:
        raise ValueError(f"cannot read prompt file {path}: {e.strerror or e}") from None


def detect_format(path: Path, text: str) -> str:
    """The format of a prompt file: by its suffix, otherwise by its content (a JSON object with "annotations": COCO;
    a first line that is a JSON object: GenEval; a tab-separated header with a Prompt column: PartiPrompts; any
    other text: one prompt a line)."""
    if path.suffix.lower() in SUFFIXES:
        return SUFFIXES[path.suffix.lower()]
    first = next((line for line in text.splitlines() if line.strip()), "")
    if first.lstrip().startswith("{"):
        try:
            whole = json.loads(text)
            return "coco" if isinstance(whole, dict) and "annotations" in whole else "geneval"
        except json.JSONDecodeError:
            return "geneval"
    if "Prompt" in (field.strip() for field in first.split("\t")):
        return "parti"
    return "text"


def clean(prompt: str) -> str:
    """A prompt stripped, each run of whitespace in it one space."""
    return " ".join(prompt.split())


def read_text_prompts(text: str, source: str) -> PromptSet:
    prompts, ids = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            prompts.append(clean(line))
            ids.append(str(number))
    if not prompts:
        raise ValueError(f"prompt file {source} holds no prompts: write one prompt a line")
    return PromptSet(tuple(prompts), tuple(ids), None, None, "text", source)


def read_coco(text: str, source: str) -> PromptSet:
    """Every caption of a COCO caption file, with its image id (:func:`read_prompt_set` keeps one per image)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"prompt file {source} is not JSON ({e.msg}, line {e.lineno}): a COCO caption file is a "
                         f"JSON object with an \"annotations\" list") from None
    annotations = data.get("annotations") if isinstance(data, dict) else None
    if not isinstance(annotations, list):
        raise ValueError(f"prompt file {source} is not a COCO caption file: it has no \"annotations\" list")
    if not annotations:
        raise ValueError(f"prompt file {source} holds no captions: its \"annotations\" list is empty")
    prompts, ids = [], []
    for number, a in enumerate(annotations, 1):
        if not isinstance(a, dict) or "caption" not in a or "image_id" not in a:
            missing = "an object" if not isinstance(a, dict) else "caption" if "caption" not in a else "image_id"
            raise ValueError(f"prompt file {source} is not a COCO caption file: annotation {number} has no "
                             f"{missing} (object detection or keypoint annotations have no captions)")
        caption = clean(a["caption"]) if isinstance(a["caption"], str) else ""
        if not caption:
            raise ValueError(f"prompt file {source}: annotation {number} (id {a.get('id')}, image "
                             f"{a['image_id']}) has an empty caption")
        prompts.append(caption)
        ids.append(str(a["image_id"]))
    return PromptSet(tuple(prompts), tuple(ids), None, None, "coco", source)


def read_parti(text: str, source: str) -> PromptSet:
    """PartiPrompts' rows (blank rows skipped), with the Category and Challenge columns where the header has them."""
    try:
        rows = [row for row in csv.reader(io.StringIO(text), delimiter="\t") if any(f.strip() for f in row)]
    except csv.Error as e:
        raise ValueError(f"prompt file {source} is not a tab-separated table: {e}") from None
    header = [field.strip() for field in rows[0]] if rows else []
    if "Prompt" not in header:
        raise ValueError(f"prompt file {source} is not a PartiPrompts table: its header has no Prompt column "
                         f"(PartiPrompts' TSV starts with {PARTI_HEADER!r})")
    if len(rows) == 1:
        raise ValueError(f"prompt file {source} holds no prompts: it has only its header")

    def column(name: str) -> tuple[str, ...] | None:
        if name not in header:
            return None
        k = header.index(name)
        return tuple(clean(row[k]) if k < len(row) else "" for row in rows[1:])

    prompts = column("Prompt")
    empty = next((number for number, prompt in enumerate(prompts, 1) if not prompt), None)
    if empty is not None:
        raise ValueError(f"prompt file {source}: row {empty} has an empty prompt")
    ids = tuple(str(number) for number in range(1, len(prompts) + 1))
    return PromptSet(prompts, ids, column("Category"), column("Challenge"), "parti", source)


def read_geneval(text: str, source: str) -> PromptSet:
    """GenEval's metadata lines (blank lines skipped), each prompt with its tag as its category."""
    prompts, ids, tags = [], [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"prompt file {source}: line {number} is not JSON ({e.msg}): GenEval's metadata is one "
                             f"JSON object a line") from None
        for key in ("prompt", "tag"):
            if not isinstance(record, dict) or key not in record:
                raise ValueError(f"prompt file {source} is not GenEval metadata: line {number} has no {key!r}")
        prompt = clean(record["prompt"]) if isinstance(record["prompt"], str) else ""
        if not prompt:
            raise ValueError(f"prompt file {source}: line {number} has an empty prompt")
        prompts.append(prompt)
        ids.append(str(number))
        tags.append(str(record["tag"]))
    if not prompts:
        raise ValueError(f"prompt file {source} holds no prompts: write one JSON object a line")
    return PromptSet(tuple(prompts), tuple(ids), tuple(tags), None, "geneval", source)


READERS: dict[str, Callable[[str, str], PromptSet]] = {
    "text": read_text_prompts, "coco": read_coco, "parti": read_parti, "geneval": read_geneval}
