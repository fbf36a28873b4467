"""The procedural data sets written to files, as evaluation reads them (``vgen data render``): class-conditional
images as PNGs, moving-shape clips as mp4 or GIF, captioned scenes as PNGs with their captions. Item ``i`` of a set
is the one the training caches hold at ``i`` for the same split (or seed) and rendering config."""

from __future__ import annotations

from pathlib import Path

from PIL import Image
from tqdm.auto import tqdm

from vgen.data import clips, scenes, shapes
from vgen.video_io import write_video

KINDS = ("images", "clips", "scenes")
SPLITS = tuple(shapes.SPLIT_SEEDS)
CLIP_FORMATS = (".mp4", ".gif")
CAPTIONS_FILE = "captions.txt"
"""A scene folder's captions, one a line in the order of its sorted image names: a text prompt set."""


def split_seed(kind: str, split: str) -> int:
    """The seed of a split of one kind of set (clips have seeds of their own)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    return (clips.SPLIT_SEEDS if kind == "clips" else shapes.SPLIT_SEEDS)[split]


def write_set(kind: str, num: int, out: str | Path, *, split: str = "val", seed: int | None = None,
              data: dict | None = None, clip_format: str = ".mp4", progress: bool = True) -> list[Path]:
    """Write items ``0 .. num-1`` of a set into the folder ``out`` (made if missing) and return their paths.

    ``seed`` (default: the seed of ``split``) picks the set; ``data`` is a rendering config (a pipeline's
    ``info.data``: :class:`~vgen.data.shapes.ShapesConfig` fields for images, :class:`~vgen.data.clips.ClipsConfig`
    fields for clips; the default config otherwise; scenes have one rendering). Images and clips are named
    ``<index>_<class>``, scenes ``<index>`` beside :data:`CAPTIONS_FILE`.
    """
    split_seed_ = split_seed(kind, split)
    seed = split_seed_ if seed is None else seed
    if isinstance(num, bool) or not isinstance(num, int) or num < 1:
        raise ValueError(f"num must be a whole number >= 1, got {num!r}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if clip_format not in CLIP_FORMATS:
        raise ValueError(f"clip_format must be one of {', '.join(CLIP_FORMATS)}, got {clip_format!r}")
    if data is not None and kind == "scenes":
        raise ValueError("scenes have one rendering: give no data config")
    try:
        image_cfg = shapes.ShapesConfig(**(data or {})) if kind == "images" else None
        clip_cfg = clips.ClipsConfig(**(data or {})) if kind == "clips" else None
    except TypeError as e:
        raise ValueError(f"data is not a rendering config of {kind}: {e}") from None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    digits = max(6, len(str(num - 1)))
    paths, captions = [], []
    for index in tqdm(range(num), desc=f"render {kind}", unit=kind[:-1], disable=not progress):
        stem = f"{index:0{digits}d}"
        if kind == "clips":
            frames, label = clips.sample_clip(seed, index, clip_cfg)
            paths.append(write_video(frames, out / f"{stem}_{shapes.CLASS_NAMES[label]}{clip_format}"))
            continue
        if kind == "images":
            image, label = shapes.sample_image(seed, index, image_cfg)
            paths.append(out / f"{stem}_{shapes.CLASS_NAMES[label]}.png")
        else:
            image, caption, _ = scenes.sample_scene(seed, index)
            captions.append(caption)
            paths.append(out / f"{stem}.png")
        Image.fromarray(image).save(paths[-1])
    if kind == "scenes":
        (out / CAPTIONS_FILE).write_text("".join(f"{c}\n" for c in captions), encoding="utf-8")
    return paths
