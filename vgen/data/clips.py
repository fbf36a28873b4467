"""Procedural class-conditional moving-shapes clips: one shape of :mod:`vgen.data.shapes` glides over a static
background, bounces off the frame borders and rotates.

The class is the shape's outline (``CLASS_NAMES`` of the shapes data set), not the motion: start position,
velocity, angular velocity, size, colour and background vary freely within a class. The shape is drawn with the
shapes renderer's primitives (outline and fill), so a frame looks like a shapes image at ``frame_size``.

Motion. The centre moves at a constant velocity and is folded back into ``[e, size - e]`` on each axis (``e`` the
farthest any shape reaches from its centre, ``EXTENT`` times its radius, plus one pixel of outline), which is an
elastic bounce off the borders: the whole shape stays in frame in every frame.
The angle grows linearly. Every clip is a pure function of ``(seed, index)``; classes cycle with the index.

Default size: 16 frames of 32x32 pixels, i.e. 16 x 8 x 8 = 1024 tokens per clip with a per-frame VQ of
downsample factor 4 (about 1k tokens, small enough to train and sample on a CPU).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from vgen.data.shapes import (
    BACKGROUND_KINDS,
    CLASS_NAMES,
    NUM_CLASSES,
    _background,
    _draw_shape,
    _luma,
    _random_rgb,
    image_rng,
)

EXTENT = 1.15  # the triangle's centroid shift makes it reach 1.15 radii from the centre (the others reach 1)


@dataclass(frozen=True)
class ClipsConfig:
    """Clip geometry and motion. ``scale`` is the shape's outer diameter as a fraction of the frame side;
    ``max_speed`` is in frame sides per frame, ``max_spin`` in radians per frame."""

    num_frames: int = 16
    frame_size: int = 32
    min_scale: float = 0.35
    max_scale: float = 0.55
    min_speed: float = 0.03
    max_speed: float = 0.08
    max_spin: float = 0.3
    supersample: int = 4
    background: str = "smooth"

    def __post_init__(self) -> None:
        if self.num_frames < 2:
            raise ValueError(f"num_frames must be >= 2 (a clip moves), got {self.num_frames}")
        if self.frame_size < 16:
            raise ValueError(f"frame_size must be >= 16 pixels, got {self.frame_size}")
        if not 0.1 <= self.min_scale <= self.max_scale <= (1.0 - 4.0 / self.frame_size) / EXTENT:
            raise ValueError(f"need 0.1 <= min_scale <= max_scale <= (1 - 4 / frame_size) / 1.15 (room to move), "
                             f"got {self.min_scale}, {self.max_scale}")
        if not 0 < self.min_speed <= self.max_speed:
            raise ValueError(f"need 0 < min_speed <= max_speed, got {self.min_speed}, {self.max_speed}")
        if not self.max_spin >= 0:
            raise ValueError(f"max_spin must be >= 0, got {self.max_spin}")
        if self.supersample < 1:
            raise ValueError(f"supersample must be >= 1, got {self.supersample}")
        if self.background not in BACKGROUND_KINDS:
            raise ValueError(f"background must be one of {BACKGROUND_KINDS}, got {self.background!r}")


@dataclass(frozen=True)
class Motion:
    """A clip's trajectory in pixels: centres [T, 2] (x, y), angles [T] in radians and the outer radius (one for
    the clip, or one a frame [T] for a shape that changes size)."""

    centres: np.ndarray
    angles: np.ndarray
    radius: float | np.ndarray


def _fold(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Reflect ``x`` into [lo, hi] (a point bouncing elastically between two walls)."""
    span = hi - lo
    t = np.mod(x - lo, 2 * span)
    return lo + np.where(t > span, 2 * span - t, t)


def motion(rng: np.random.Generator, cfg: ClipsConfig = ClipsConfig()) -> Motion:
    """Draw a trajectory: random radius, start, direction, speed and spin; bounces keep the shape in frame."""
    size = cfg.frame_size
    r = 0.5 * size * rng.uniform(cfg.min_scale, cfg.max_scale)
    reach = EXTENT * r + 1  # the farthest a shape's outline reaches from its centre, in pixels
    lo, hi = reach, size - reach
    start = rng.uniform(lo, hi, 2)
    heading = rng.uniform(0, 2 * math.pi)
    speed = size * rng.uniform(cfg.min_speed, cfg.max_speed)
    t = np.arange(cfg.num_frames, dtype=np.float64)[:, None]
    raw = start + t * speed * np.array([math.cos(heading), math.sin(heading)])
    centres = _fold(raw, lo, hi)
    angles = rng.uniform(0, 2 * math.pi) + rng.uniform(-cfg.max_spin, cfg.max_spin) * t[:, 0]
    return Motion(centres, angles, r)


def shape_masks(class_id: int, mo: Motion, cfg: ClipsConfig = ClipsConfig()) -> tuple[np.ndarray, np.ndarray]:
    """(fill alpha, outline alpha) of every frame, float [T, S, S] in [0, 1], anti-aliased by supersampling."""
    k, big = cfg.supersample, cfg.frame_size * cfg.supersample
    fills, outlines = [], []
    for (cx, cy), angle, r in zip(mo.centres, mo.angles, np.broadcast_to(mo.radius, mo.angles.shape)):
        canvas = Image.new("L", (big, big), 0)
        _draw_shape(ImageDraw.Draw(canvas), CLASS_NAMES[class_id], cx * k, cy * k, float(r) * k, float(angle))
        outline = canvas.filter(ImageFilter.MaxFilter(2 * k + 1))
        for im, out in ((canvas, fills), (outline, outlines)):
            out.append(np.asarray(im.resize((cfg.frame_size,) * 2, Image.BOX), np.float32) / 255.0)
    return np.stack(fills), np.stack(outlines)


def render_clip(class_id: int, rng: np.random.Generator, cfg: ClipsConfig = ClipsConfig()) -> np.ndarray:
    """One clip of class ``class_id`` as uint8 [T, S, S, 3]."""
    if not 0 <= class_id < NUM_CLASSES:
        raise ValueError(f"class_id must be in [0, {NUM_CLASSES}), got {class_id}")
    mo = motion(rng, cfg)  # drawn first, so that motion(image_rng(seed, index)) is the clip's trajectory
    bg = _background(rng, cfg.frame_size, cfg.background)
    fill_a, outline_a = shape_masks(class_id, mo, cfg)
    bg_luma = float(_luma(bg).mean())
    for _ in range(8):  # a saturated colour that stands out from the background's mean brightness
        color = _random_rgb(rng, (0.55, 1.0), (0.35, 1.0))
        if abs(float(_luma(color)) - bg_luma) > 0.25:
            break
    edge = np.zeros(3, np.float32) if float(_luma(color)) > 0.45 else np.ones(3, np.float32)
    clip = bg[None] * (1 - outline_a[..., None]) + edge * outline_a[..., None]
    clip = clip * (1 - fill_a[..., None]) + color * fill_a[..., None]
    return (np.clip(clip, 0, 1) * 255 + 0.5).astype(np.uint8)


def clip_classes(index: int | np.ndarray) -> int | np.ndarray:
    """The class of the clip (or clips) at ``index`` of any clip set: classes cycle evenly."""
    return index % NUM_CLASSES


def sample_clip(seed: int, index: int, cfg: ClipsConfig = ClipsConfig()) -> tuple[np.ndarray, int]:
    """The (clip, class) pair at ``index`` of the clip set with this ``seed``; classes cycle evenly."""
    if index < 0:
        raise ValueError(f"index must be >= 0, got {index}")
    class_id = clip_classes(index)
    return render_clip(class_id, image_rng(seed, index), cfg), class_id


def render_clips(seed: int, start: int, count: int, cfg: ClipsConfig = ClipsConfig()) -> tuple[np.ndarray, np.ndarray]:
    """Clips ``start .. start+count-1`` as uint8 [N, T, S, S, 3] and their labels [N]."""
    if count < 0 or start < 0:
        raise ValueError(f"start and count must be >= 0, got {start}, {count}")
    pairs = [sample_clip(seed, i, cfg) for i in range(start, start + count)]
    shape = (0, cfg.num_frames, cfg.frame_size, cfg.frame_size, 3)
    clips = np.stack([p[0] for p in pairs]) if pairs else np.empty(shape, np.uint8)
    return clips, np.array([p[1] for p in pairs], np.int64)


SHAPES_CLIPS = ClipsConfig()  # the recipes' clips: 16 frames of 32 x 32 pixels
# 8 frames of 64 x 64 pixels, the shapes images' frame: tokenised by the image tokenizer (16 x 16 codes a
# frame, 2,048 a clip), so that a video model can start from the image model. Shapes span 45-65% of the side (the
# images 45-80%, which leaves a large shape no room to move)
SHAPES_CLIPS_64 = ClipsConfig(num_frames=8, frame_size=64, min_scale=0.45, max_scale=0.65)
# the same clips twice as long: long-horizon training of the streaming model (its frames are KL latents)
SHAPES_CLIPS_64_LONG = replace(SHAPES_CLIPS_64, num_frames=16)
CLIP_PRESETS = {"32px": SHAPES_CLIPS, "64px": SHAPES_CLIPS_64, "64px-16f": SHAPES_CLIPS_64_LONG}
SPLIT_SEEDS = {"train": 10, "val": 11, "test": 12}  # distinct from the image splits' seeds
CLIPS_CONFIG = "clips.json"


def recorded_clips_config(cache_dir: str | Path, default: ClipsConfig = SHAPES_CLIPS) -> ClipsConfig:
    """The config a clip folder was rendered with (its ``clips.json``), or ``default`` for a new folder."""
    recorded = Path(cache_dir) / CLIPS_CONFIG
    return ClipsConfig(**json.loads(recorded.read_text())) if recorded.exists() else default


def _render_chunk(args: tuple[int, int, int, ClipsConfig]) -> tuple[np.ndarray, np.ndarray]:
    return render_clips(*args)


def cached_clips(cache_dir: str | Path, split: str, count: int, cfg: ClipsConfig = ClipsConfig(),
                 workers: int | None = None, chunk: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """The first ``count`` clips of a split, rendered once into ``cache_dir`` by ``workers`` processes (default:
    one per core; 3,000 clips of 64 px take about 7 min on one) and memory-mapped after that.

    The folder records its config (``clips.json``); asking it for clips of another config is an error.
    """
    from concurrent.futures import ProcessPoolExecutor

    from tqdm.auto import tqdm

    if split not in SPLIT_SEEDS:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(SPLIT_SEEDS)}")
    cache_dir = Path(cache_dir)
    recorded = cache_dir / CLIPS_CONFIG
    if recorded.exists() and ClipsConfig(**json.loads(recorded.read_text())) != cfg:
        raise ValueError(f"{cache_dir} holds clips rendered with {recorded.read_text().strip()}; use another "
                         f"folder for {cfg}")
    clip_path, lab_path = cache_dir / f"{split}_clips.npy", cache_dir / f"{split}_labels.npy"
    if clip_path.exists() and lab_path.exists():
        clips, labels = np.load(clip_path, mmap_mode="r"), np.load(lab_path)
        if len(clips) >= count:
            return clips[:count], labels[:count]
    jobs = [(SPLIT_SEEDS[split], start, min(chunk, count - start), cfg) for start in range(0, count, chunk)]
    clips = np.empty((count, cfg.num_frames, cfg.frame_size, cfg.frame_size, 3), np.uint8)
    labels = np.empty(count, np.int64)
    with ProcessPoolExecutor(max_workers=max(1, workers or os.cpu_count() or 1)) as pool, \
            tqdm(total=count, desc=f"render clips ({split})", unit="clip") as bar:
        for (_, start, n, _), (part, part_labels) in zip(jobs, pool.map(_render_chunk, jobs)):
            clips[start:start + n], labels[start:start + n] = part, part_labels
            bar.update(n)
    cache_dir.mkdir(parents=True, exist_ok=True)
    recorded.write_text(json.dumps(asdict(cfg), indent=1))
    np.save(clip_path, clips)
    np.save(lab_path, labels)
    return clips, labels
