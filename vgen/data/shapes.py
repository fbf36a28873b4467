"""Procedural class-conditional shapes: one large anti-aliased shape on a rich textured background.

The class is the shape's outline. Colour, size, rotation, position and the background (one of several procedural
texture families at random scales and palettes) vary freely, so that an image tokenizer sees real-looking texture
statistics: next-token distributions over the background are broad, as they are for natural images, while the
shape itself stays recognisable at 16x16 tokens. Every image is a pure function of ``(seed, index)``.
"""

from __future__ import annotations

import colorsys
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFilter

CLASS_NAMES: tuple[str, ...] = ("circle", "square", "triangle", "star", "cross", "ring", "crescent", "heart")
NUM_CLASSES = len(CLASS_NAMES)


@dataclass(frozen=True)
class ShapesConfig:
    """Rendering parameters. ``scale`` is the shape's outer diameter as a fraction of the image side.

    ``background`` is ``"textured"`` (the procedural texture families below) or ``"smooth"`` (a two-colour linear
    gradient with faint low-frequency variation and no grain), which leaves the shape as most of an image's
    information.
    """

    image_size: int = 64
    min_scale: float = 0.45
    max_scale: float = 0.8
    supersample: int = 4
    background: str = "textured"

    def __post_init__(self) -> None:
        if self.background not in BACKGROUND_KINDS:
            raise ValueError(f"background must be one of {BACKGROUND_KINDS}, got {self.background!r}")
        if self.image_size < 16:
            raise ValueError(f"image_size must be >= 16, got {self.image_size}")
        if not 0.1 <= self.min_scale <= self.max_scale <= 1.0:
            raise ValueError(f"need 0.1 <= min_scale <= max_scale <= 1, got {self.min_scale}, {self.max_scale}")


# ---------------------------------------------------------------------------------------------------------------
# Backgrounds: each returns a float field in [0, 1] of shape [S, S]; a palette turns it into colour.


def _smooth_noise(rng: np.random.Generator, size: int, cells: int) -> np.ndarray:
    """Bicubic-interpolated value noise with ``cells`` lattice cells across the image."""
    lattice = rng.random((cells + 3, cells + 3)).astype(np.float32)
    img = Image.fromarray(lattice, mode="F").resize((size * (cells + 3) // cells,) * 2, Image.BICUBIC)
    field = np.asarray(img)
    off = size // cells
    return field[off:off + size, off:off + size]


def _fractal(rng: np.random.Generator, size: int) -> np.ndarray:
    base = int(rng.integers(2, 6))
    octaves = int(rng.integers(2, 5))
    persistence = rng.uniform(0.4, 0.75)
    out, amp, total = np.zeros((size, size), np.float32), 1.0, 0.0
    for o in range(octaves):
        out += amp * _smooth_noise(rng, size, min(base * 2**o, size // 2))
        total += amp
        amp *= persistence
    return out / total


def _coords(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixel coordinates in [0, 1), rotated by a random angle."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    a = rng.uniform(0, math.pi)
    return x * math.cos(a) - y * math.sin(a), x * math.sin(a) + y * math.cos(a)


def _stripes(rng, size):
    u, _ = _coords(rng, size)
    warp = _fractal(rng, size) * rng.uniform(0.0, 3.0)
    return 0.5 + 0.5 * np.sin(2 * math.pi * (u * rng.uniform(2, 9) + warp))


def _checker(rng, size):
    u, v = _coords(rng, size)
    f = rng.uniform(2, 7)
    hard = (np.floor(u * f) + np.floor(v * f)) % 2
    return 0.7 * hard + 0.3 * _fractal(rng, size)


def _rings(rng, size):
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    cx, cy = rng.uniform(-0.3, 1.3, 2)
    r = np.hypot(x - cx, y - cy)
    return 0.5 + 0.5 * np.sin(2 * math.pi * (r * rng.uniform(3, 12) + 1.5 * _fractal(rng, size)))


def _marble(rng, size):
    u, v = _coords(rng, size)
    return 0.5 + 0.5 * np.sin(2 * math.pi * (u * rng.uniform(1, 4)) + rng.uniform(3, 9) * _fractal(rng, size))


def _cells(rng, size):
    n = int(rng.integers(6, 24))
    pts = rng.random((n, 2)).astype(np.float32)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    d = np.sqrt((x[..., None] - pts[:, 0]) ** 2 + (y[..., None] - pts[:, 1]) ** 2)
    d.sort(axis=-1)
    edge = d[..., 1] - d[..., 0]
    return np.clip(edge * math.sqrt(n) * rng.uniform(1.0, 2.5), 0, 1)


def _dots(rng, size):
    u, v = _coords(rng, size)
    f = rng.uniform(3, 8)
    du, dv = (u * f) % 1 - 0.5, (v * f) % 1 - 0.5
    dots = (np.hypot(du, dv) < rng.uniform(0.15, 0.4)).astype(np.float32)
    return 0.65 * dots + 0.35 * _fractal(rng, size)


def _plaid(rng, size):
    u, v = _coords(rng, size)
    a = 0.5 + 0.5 * np.sin(2 * math.pi * u * rng.uniform(2, 8))
    b = 0.5 + 0.5 * np.sin(2 * math.pi * v * rng.uniform(2, 8))
    return 0.4 * a + 0.4 * b + 0.2 * _fractal(rng, size)


BACKGROUNDS = (_fractal, _stripes, _checker, _rings, _marble, _cells, _dots, _plaid)
BACKGROUND_KINDS = ("textured", "smooth")


def _random_rgb(rng: np.random.Generator, sat: tuple[float, float], val: tuple[float, float]) -> np.ndarray:
    return np.array(colorsys.hsv_to_rgb(rng.random(), rng.uniform(*sat), rng.uniform(*val)), np.float32)


def _smooth_background(rng: np.random.Generator, size: int) -> np.ndarray:
    """A two-colour linear gradient in a random direction, with faint large-scale variation: [S, S, 3] in [0, 1]."""
    u, _ = _coords(rng, size)
    field = (u - u.min()) / max(float(np.ptp(u)), 1e-6)
    field = np.clip(0.85 * field + 0.15 * _smooth_noise(rng, size, 2), 0, 1)[..., None]
    c0, c1 = (_random_rgb(rng, (0.1, 0.7), (0.15, 0.95)) for _ in range(2))
    return c0 + (c1 - c0) * field


def _background(rng: np.random.Generator, size: int, kind: str = "textured") -> np.ndarray:
    """An RGB background in [0, 1], [S, S, 3]: smooth, or a texture field mapped through a random 3-colour ramp."""
    if kind == "smooth":
        return _smooth_background(rng, size)
    field = BACKGROUNDS[int(rng.integers(len(BACKGROUNDS)))](rng, size)
    field = (field - field.min()) / max(float(np.ptp(field)), 1e-6)
    c0, c1, c2 = (_random_rgb(rng, (0.1, 0.8), (0.15, 0.95)) for _ in range(3))
    f = field[..., None]
    rgb = np.where(f < 0.5, c0 + (c1 - c0) * (2 * f), c1 + (c2 - c1) * (2 * f - 1))
    grain = rng.normal(0, rng.uniform(0.0, 0.06), rgb.shape).astype(np.float32)
    return np.clip(rgb + grain, 0, 1)


# ---------------------------------------------------------------------------------------------------------------
# Shapes: each draws a white mask on a black supersampled canvas, centred at (cx, cy) with outer radius r.


def _rotated(points: list[tuple[float, float]], cx: float, cy: float, r: float, angle: float):
    c, s = math.cos(angle), math.sin(angle)
    return [(cx + r * (x * c - y * s), cy + r * (x * s + y * c)) for x, y in points]


def _polygon(n: int, inner: float | None = None) -> list[tuple[float, float]]:
    """Unit regular polygon (or star with the given inner radius), first vertex pointing up."""
    pts = []
    for k in range(n * (2 if inner else 1)):
        rad = inner if inner and k % 2 else 1.0
        a = -math.pi / 2 + k * math.pi * (1 if inner else 2) / n
        pts.append((rad * math.cos(a), rad * math.sin(a)))
    return pts


def _circle_pts(n: int = 64, cx: float = 0.0, cy: float = 0.0, rad: float = 1.0):
    return [(cx + rad * math.cos(2 * math.pi * k / n), cy + rad * math.sin(2 * math.pi * k / n)) for k in range(n)]


def _heart_pts(n: int = 96):
    pts = []
    for k in range(n):
        t = 2 * math.pi * k / n
        x = 16 * math.sin(t) ** 3
        y = -(13 * math.cos(t) - 5 * math.cos(2 * t) - 2 * math.cos(3 * t) - math.cos(4 * t))
        pts.append((x / 17.0, (y + 2.5) / 17.0))
    return pts


_CROSS = [(-0.35, -1), (0.35, -1), (0.35, -0.35), (1, -0.35), (1, 0.35), (0.35, 0.35), (0.35, 1), (-0.35, 1),
          (-0.35, 0.35), (-1, 0.35), (-1, -0.35), (-0.35, -0.35)]


def _draw_shape(draw: ImageDraw.ImageDraw, name: str, cx: float, cy: float, r: float, angle: float) -> None:
    fill = lambda pts, v=255: draw.polygon(_rotated(pts, cx, cy, r, angle), fill=v)
    if name == "circle":
        fill(_circle_pts())
    elif name == "square":
        fill([(-0.72, -0.72), (0.72, -0.72), (0.72, 0.72), (-0.72, 0.72)])
    elif name == "triangle":
        fill([(x, y + 0.15) for x, y in _polygon(3)])
    elif name == "star":
        fill(_polygon(5, inner=0.42))
    elif name == "cross":
        fill(_CROSS)
    elif name == "ring":
        fill(_circle_pts())
        fill(_circle_pts(rad=0.52), 0)
    elif name == "crescent":
        fill(_circle_pts())
        fill(_circle_pts(cx=0.45, cy=-0.1, rad=0.82), 0)
    elif name == "heart":
        fill(_heart_pts())
    else:
        raise ValueError(f"unknown shape {name!r}; expected one of {CLASS_NAMES}")


def shape_alpha(name: str, cx: float, cy: float, r: float, angle: float, size: int,
                supersample: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """(fill alpha, outline alpha) of one shape, each float [S, S] in [0, 1], anti-aliased by supersampling.

    ``cx``, ``cy`` and the outer radius ``r`` are in pixels of the ``size``-pixel image.
    """
    big = size * supersample
    canvas = Image.new("L", (big, big), 0)
    _draw_shape(ImageDraw.Draw(canvas), name, cx * supersample, cy * supersample, r * supersample, angle)
    outline = canvas.filter(ImageFilter.MaxFilter(2 * supersample + 1))
    down = lambda im: np.asarray(im.resize((size,) * 2, Image.BOX), np.float32) / 255.0
    return down(canvas), down(outline)


def _shape_mask(name: str, rng: np.random.Generator, cfg: ShapesConfig) -> tuple[np.ndarray, np.ndarray]:
    """A shape of random size, position and rotation: (fill alpha, outline alpha)."""
    size = cfg.image_size
    r = 0.5 * size * rng.uniform(cfg.min_scale, cfg.max_scale)
    margin = 0.85 * r
    cx, cy = rng.uniform(margin, size - margin, 2)
    return shape_alpha(name, cx, cy, r, rng.uniform(0, 2 * math.pi), size, cfg.supersample)


def _luma(rgb: np.ndarray) -> np.ndarray:
    return rgb @ np.array([0.299, 0.587, 0.114], np.float32)


def render(class_id: int, rng: np.random.Generator, cfg: ShapesConfig = ShapesConfig()) -> np.ndarray:
    """One image of class ``class_id`` as uint8 [S, S, 3]."""
    if not 0 <= class_id < NUM_CLASSES:
        raise ValueError(f"class_id must be in [0, {NUM_CLASSES}), got {class_id}")
    size = cfg.image_size
    bg = _background(rng, size, cfg.background)
    fill_a, outline_a = _shape_mask(CLASS_NAMES[class_id], rng, cfg)
    bg_luma = float(_luma(bg).mean())
    for _ in range(8):  # pick a saturated colour that stands out from the background's mean brightness
        color = _random_rgb(rng, (0.55, 1.0), (0.35, 1.0))
        if abs(float(_luma(color)) - bg_luma) > 0.25:
            break
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    a = rng.uniform(0, 2 * math.pi)
    shade = 1.0 + 0.25 * ((x - 0.5) * math.cos(a) + (y - 0.5) * math.sin(a))
    shape_rgb = np.clip(color * shade[..., None], 0, 1)
    edge = np.zeros(3, np.float32) if float(_luma(color)) > 0.45 else np.ones(3, np.float32)
    img = bg * (1 - outline_a[..., None]) + edge * outline_a[..., None]
    img = img * (1 - fill_a[..., None]) + shape_rgb * fill_a[..., None]
    return (np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8)


def image_rng(seed: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, index])


def sample_image(seed: int, index: int, cfg: ShapesConfig = ShapesConfig()) -> tuple[np.ndarray, int]:
    """The (image, class) pair at ``index`` of the data set with this ``seed``; classes cycle evenly."""
    class_id = index % NUM_CLASSES
    return render(class_id, image_rng(seed, index), cfg), class_id


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 [..., H, W, 3] -> float [..., 3, H, W] in [-1, 1]."""
    t = torch.from_numpy(np.array(images, dtype=np.uint8)).float().div(127.5).sub(1.0)  # copies (mmaps are read-only)
    return t.movedim(-1, -3)


class ShapesDataset(torch.utils.data.Dataset):
    """``length`` seeded images; item i is ``(image in [-1, 1] as [3, S, S], class id)``."""

    def __init__(self, length: int, seed: int = 0, cfg: ShapesConfig = ShapesConfig()) -> None:
        self.length, self.seed, self.cfg = length, seed, cfg

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < self.length:
            raise IndexError(index)
        image, label = sample_image(self.seed, index, self.cfg)
        return to_tensor(image), label


def render_batch(seed: int, start: int, count: int,
                 cfg: ShapesConfig = ShapesConfig()) -> tuple[np.ndarray, np.ndarray]:
    """Images ``start .. start+count-1`` as uint8 [N, S, S, 3] and their labels [N]."""
    pairs = [sample_image(seed, i, cfg) for i in range(start, start + count)]
    return np.stack([p[0] for p in pairs]), np.array([p[1] for p in pairs], np.int64)


def _render_chunk(args: tuple[int, int, int, ShapesConfig]) -> tuple[np.ndarray, np.ndarray]:
    return render_batch(*args)


def render_to_arrays(seed: int, count: int, cfg: ShapesConfig = ShapesConfig(), workers: int = 1,
                     chunk: int = 512, progress: bool = True, first: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Render images ``first .. first+count-1`` (uint8 [N, S, S, 3]) and labels with a process pool; used to
    cache training sets."""
    from concurrent.futures import ProcessPoolExecutor

    from tqdm.auto import tqdm

    jobs = [(seed, first + s, min(chunk, count - s), cfg) for s in range(0, count, chunk)]
    images = np.empty((count, cfg.image_size, cfg.image_size, 3), np.uint8)
    labels = np.empty(count, np.int64)
    bar = tqdm(total=count, desc=f"render shapes seed={seed}", unit="img", disable=not progress)
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
        for (_, start, n, _), (imgs, labs) in zip(jobs, pool.map(_render_chunk, jobs)):
            images[start - first:start - first + n], labels[start - first:start - first + n] = imgs, labs
            bar.update(n)
    bar.close()
    return images, labels


SPLIT_SEEDS = {"train": 0, "val": 1, "test": 2}
DATA_CONFIG = "shapes.json"


def data_config(cache_dir: str | Path) -> ShapesConfig:
    """The rendering config of a data cache folder (the default config where the folder records none)."""
    path = Path(cache_dir) / DATA_CONFIG
    return ShapesConfig(**json.loads(path.read_text())) if path.exists() else ShapesConfig()


def set_data_config(cache_dir: str | Path, cfg: ShapesConfig) -> None:
    """Record ``cfg`` as the rendering config of a data cache folder; refuse to change the config of rendered data."""
    cache_dir = Path(cache_dir)
    current = data_config(cache_dir)
    rendered = any(cache_dir.glob("*_images.npy"))
    if rendered and current != cfg:
        raise ValueError(f"{cache_dir} already holds images rendered with {current}; use another data folder "
                         f"for {cfg}")
    cache_dir.mkdir(parents=True, exist_ok=True)
    (cache_dir / DATA_CONFIG).write_text(json.dumps(asdict(cfg), indent=1))


def cached_split(cache_dir: str | Path, split: str, count: int, workers: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """The first ``count`` images of a split, rendered once into ``cache_dir`` and memory-mapped after that.

    Images are rendered with the folder's recorded config (``set_data_config``), the default one otherwise. A
    smaller cache is extended: only the images it lacks are rendered.
    """
    if split not in SPLIT_SEEDS:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(SPLIT_SEEDS)}")
    cache_dir = Path(cache_dir)
    img_path, lab_path = cache_dir / f"{split}_images.npy", cache_dir / f"{split}_labels.npy"
    done_images = np.zeros((0, 0, 0, 3), np.uint8)
    done_labels = np.zeros(0, np.int64)
    if img_path.exists() and lab_path.exists():
        done_images, done_labels = np.load(img_path, mmap_mode="r"), np.load(lab_path)
        if len(done_images) >= count:
            return done_images[:count], done_labels[:count]
    done = len(done_images)
    images, labels = render_to_arrays(SPLIT_SEEDS[split], count - done, data_config(cache_dir), workers=workers,
                                      first=done)
    if done:
        images, labels = np.concatenate([done_images, images]), np.concatenate([done_labels, labels])
    cache_dir.mkdir(parents=True, exist_ok=True)
    np.save(img_path, images)
    np.save(lab_path, labels)
    return images, labels
