"""The procedural data sets written to files, as evaluation reads them (``vgen data render``): class-conditional
images as PNGs, moving-shape clips as mp4 or GIF, captioned scenes as PNGs and moving captioned scenes as mp4 or GIF,
each with their captions. Item ``i`` of a set is the one the training caches hold at ``i`` for the same split (or
seed) and rendering config."""

from __future__ import annotations

from pathlib import Path

from PIL import Image
from tqdm.auto import tqdm

from vgen.data import clips, moving_scenes, scenes, shapes
from vgen.video_io import write_video

KINDS = ("images", "clips", "scenes", "moving-scenes")
SPLITS = tuple(shapes.SPLIT_SEEDS)
CLIP_FORMATS = (".mp4", ".gif")
CAPTIONS_FILE = "captions.txt"
"""A scene (or moving scene) folder's captions, one a line in the order of its sorted file names: a text prompt
set."""


def split_seed(kind: str, split: str) -> int:
    """The seed of a split of one kind of set (clips and moving scenes have seeds of their own)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    seeds = {"clips": clips.SPLIT_SEEDS, "moving-scenes": moving_scenes.SPLIT_SEEDS}.get(kind, shapes.SPLIT_SEEDS)
    return seeds[split]


def write_set(kind: str, num: int, out: str | Path, *, split: str = "val", seed: int | None = None,
              data: dict | None = None, clip_format: str = ".mp4", progress: bool = True) -> list[Path]:
    """Write items ``0 .. num-1`` of a set into the folder ``out`` (made if missing) and return their paths.

    ``seed`` (default: the seed of ``split``) picks the set; ``data`` is a rendering config (a pipeline's
    ``info.data``: :class:`~vgen.data.shapes.ShapesConfig` fields for images, :class:`~vgen.data.clips.ClipsConfig`
    fields for clips, :class:`~vgen.data.moving_scenes.MovingScenesConfig` fields for moving scenes; the default
    config otherwise; scenes have one rendering). Images and clips are named ``<index>_<class>``, scenes and moving
    scenes ``<index>`` beside :data:`CAPTIONS_FILE`.
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
        moving_cfg = moving_scenes.MovingScenesConfig(**(data or {})) if kind == "moving-scenes" else None
    except TypeError as e:
        raise ValueError(f"data is not a rendering config of {kind}: {e}") from None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    digits = max(6, len(str(num - 1)))
    paths, captions = [], []
    for index in tqdm(range(num), desc=f"render {kind}", unit=kind[:-1], disable=not progress):
        stem = f"{index:0{digits}d}"
        if kind == "moving-scenes":
            frames, caption, _ = moving_scenes.sample_moving_scene(seed, index, moving_cfg)
            captions.append(caption)
            paths.append(write_video(frames, out / f"{stem}{clip_format}"))
            continue
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
    if captions:
        (out / CAPTIONS_FILE).write_text("".join(f"{c}\n" for c in captions), encoding="utf-8")
    return paths
