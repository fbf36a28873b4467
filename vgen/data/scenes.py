"""Procedural captioned scenes: one shape described by a sentence (shape, colour, size, position, background).

A scene is drawn from five attributes: the shape (the 8 classes of ``vgen.data.shapes``), its colour (8 named
hues), its size (small or large), its place on a 3 x 3 grid, and the background (white, grey, black, a pale form
of one of the other 7 colours, or one of 8 named textures). Its caption is generated from a small grammar with
synonyms and several word orders, and now and then leaves out the size, the place or the background, so that a
prompt is a sentence rather than a fixed template. Scene ``i`` of a split, its image and its caption are a pure
function of ``(seed, i)``.
"""

from __future__ import annotations

import colorsys
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vgen.data.shapes import (
    BACKGROUNDS,
    CLASS_NAMES,
    NUM_CLASSES,
    SPLIT_SEEDS,
    _luma,
    _smooth_noise,
    image_rng,
    shape_alpha,
)

# Named shape colours: hue in degrees, drawn saturated and bright so that they stand apart from the muted
# backgrounds.
COLOURS: dict[str, float] = {"red": 0.0, "orange": 28.0, "yellow": 55.0, "green": 120.0, "cyan": 182.0,
                             "blue": 225.0, "purple": 272.0, "pink": 322.0}
COLOUR_NAMES: tuple[str, ...] = tuple(COLOURS)
SIZES: tuple[str, ...] = ("small", "large")
# The 3 x 3 grid, row-major from the top left.
POSITIONS: tuple[str, ...] = ("top left", "top", "top right", "left", "centre", "right",
                              "bottom left", "bottom", "bottom right")
TONES: tuple[str, ...] = ("white", "grey", "black")
# Plain backgrounds: three tones, and each shape colour in a paler, duller form (never the shape's own colour).
PLAIN_BACKGROUNDS: tuple[str, ...] = TONES + COLOUR_NAMES
# Texture names, in the order of ``vgen.data.shapes.BACKGROUNDS`` (the field each one draws).
TEXTURES: tuple[str, ...] = ("speckled", "striped", "checkered", "rippled", "marbled", "mosaic", "dotted",
                             "plaid")
BACKGROUND_NAMES: tuple[str, ...] = PLAIN_BACKGROUNDS + TEXTURES

# Outer diameter as a fraction of the image side, and the grid's centre coordinates, per size.
DIAMETER = {"small": (0.26, 0.34), "large": (0.56, 0.66)}
GRID = {"small": (0.2, 0.5, 0.8), "large": (0.34, 0.5, 0.66)}
JITTER = {"small": 0.04, "large": 0.015}

ATTRIBUTES: tuple[str, ...] = ("shape", "colour", "size", "position", "background")
ATTRIBUTE_VALUES: dict[str, tuple[str, ...]] = dict(zip(ATTRIBUTES, (CLASS_NAMES, COLOUR_NAMES, SIZES, POSITIONS,
                                                                    BACKGROUND_NAMES)))
EXAMPLE_PROMPTS: tuple[str, ...] = (
    "a large blue ring on a yellow background",
    "a small red star in the top left corner on a white background",
    "a big green heart at the bottom right over a striped backdrop",
    "a tiny purple triangle on the left against a black background",
    "a large orange crescent moon in the centre on a checkered background",
    "a small cyan cross at the top right over a marbled backdrop",
    "a huge pink square on a dotted background",
    "in the lower left corner, a little yellow circle on a grey background")
# How often a caption leaves an optional attribute out.
OMIT_PROBABILITY = 0.1


@dataclass(frozen=True)
class Scene:
    """The attributes of one scene, by index into their name tuples, and which ones its caption states."""

    shape: int
    colour: int
    size: int
    position: int
    background: int
    stated: tuple[str, ...] = ATTRIBUTES

    def names(self) -> dict[str, str]:
        """Attribute -> name, e.g. ``{"shape": "star", "colour": "red", ...}``."""
        return {"shape": CLASS_NAMES[self.shape], "colour": COLOUR_NAMES[self.colour], "size": SIZES[self.size],
                "position": POSITIONS[self.position], "background": BACKGROUND_NAMES[self.background]}


# ---------------------------------------------------------------------------------------------------------------
# The caption grammar.

SHAPE_WORDS: dict[str, tuple[str, ...]] = {
    "circle": ("circle", "disc", "round disc"), "square": ("square", "box"), "triangle": ("triangle",),
    "star": ("star", "five-pointed star"), "cross": ("cross", "plus sign"), "ring": ("ring", "donut", "hoop"),
    "crescent": ("crescent", "crescent moon", "moon"), "heart": ("heart",)}
COLOUR_WORDS: dict[str, tuple[str, ...]] = {
    "red": ("red", "scarlet"), "orange": ("orange",), "yellow": ("yellow", "golden"), "green": ("green",),
    "cyan": ("cyan", "turquoise"), "blue": ("blue",), "purple": ("purple", "violet"), "pink": ("pink", "magenta")}
SIZE_WORDS: dict[str, tuple[str, ...]] = {"small": ("small", "little", "tiny"), "large": ("large", "big", "huge")}
ROW_WORDS = (("top", "upper"), ("middle",), ("bottom", "lower"))
COLUMN_WORDS = (("left",), ("centre", "center", "middle"), ("right",))
BACKGROUND_NOUNS = ("background", "backdrop")


def _pick(rng: np.random.Generator, words: tuple[str, ...]) -> str:
    return words[int(rng.integers(len(words)))]


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _place_phrase(position: int, rng: np.random.Generator) -> str:
    """A phrase naming one of the nine places, e.g. "in the upper left corner" or "on the right"."""
    row, col = divmod(position, 3)
    if row == 1 and col == 1:
        return _pick(rng, ("in the centre", "in the center", "in the middle", "at the centre"))
    if row == 1:
        side = COLUMN_WORDS[col][0]
        return _pick(rng, (f"on the {side}", f"at the {side}", f"on the {side} side", f"at the middle {side}"))
    vertical = _pick(rng, ROW_WORDS[row])
    if col == 1:
        return _pick(rng, (f"at the {ROW_WORDS[row][0]}", f"at the {vertical} centre", f"near the {vertical} edge"))
    corner = f"{vertical} {COLUMN_WORDS[col][0]}"
    return _pick(rng, (f"in the {corner} corner", f"at the {corner}", f"in the {corner}"))


def _background_phrase(background: int, rng: np.random.Generator) -> str:
    """A noun phrase for the background, e.g. "a striped backdrop"."""
    word = BACKGROUND_NAMES[background]
    return f"{_article(word)} {word} {_pick(rng, BACKGROUND_NOUNS)}"


def caption(scene: Scene, rng: np.random.Generator, action: str = "") -> str:
    """A sentence stating the scene's stated attributes, in one of several word orders; ``action`` (what the
    object does, e.g. "moving right") follows the object's noun."""
    names = scene.names()
    colour = _pick(rng, COLOUR_WORDS[names["colour"]])
    shape = _pick(rng, SHAPE_WORDS[names["shape"]])
    size = _pick(rng, SIZE_WORDS[names["size"]]) if "size" in scene.stated else ""
    place = _place_phrase(scene.position, rng) if "position" in scene.stated else ""
    ground = _background_phrase(scene.background, rng) if "background" in scene.stated else ""
    noun = " ".join(w for w in (size, colour, shape) if w)
    thing = " ".join(w for w in (_article(noun), noun, action) if w)
    on = f"{_pick(rng, ('on', 'against', 'over'))} {ground}" if ground else ""
    order = int(rng.integers(4))
    if order == 0:
        parts = [thing, place, on]
    elif order == 1:
        parts = [f"{place}," if place else "", thing, on]
    elif order == 2 and ground:
        parts = [ground, "with", thing, place]
    else:
        parts = [thing, on, f", {place}" if place else ""]
    text = " ".join(p for p in parts if p)
    return re.sub(r"\s+,", ",", text).strip(" ,")


# ---------------------------------------------------------------------------------------------------------------
# Rendering.


def _hsv(h: float, s: float, v: float) -> np.ndarray:
    return np.array(colorsys.hsv_to_rgb((h / 360.0) % 1.0, s, v), np.float32)


def _plain_tone(name: str, rng: np.random.Generator) -> np.ndarray:
    hue = rng.uniform(0, 360)
    if name == "white":
        return _hsv(hue, rng.uniform(0, 0.06), rng.uniform(0.88, 1.0))
    if name == "grey":
        return _hsv(hue, rng.uniform(0, 0.06), rng.uniform(0.42, 0.62))
    if name == "black":
        return _hsv(hue, rng.uniform(0, 0.1), rng.uniform(0.04, 0.16))
    return _hsv(COLOURS[name] + rng.uniform(-6, 6), rng.uniform(0.3, 0.5), rng.uniform(0.72, 0.9))


def _scene_background(background: int, rng: np.random.Generator, size: int) -> np.ndarray:
    """[S, S, 3] in [0, 1]: a plain tone with faint shading, or a named texture in two muted colours."""
    name = BACKGROUND_NAMES[background]
    if name in PLAIN_BACKGROUNDS:
        tone = _plain_tone(name, rng)
        shade = 1.0 + 0.08 * (_smooth_noise(rng, size, 2) - 0.5)
        return np.clip(tone * shade[..., None], 0, 1)
    field = BACKGROUNDS[TEXTURES.index(name)](rng, size)
    field = ((field - field.min()) / max(float(np.ptp(field)), 1e-6))[..., None]
    dark = _hsv(rng.uniform(0, 360), rng.uniform(0.05, 0.35), rng.uniform(0.15, 0.4))
    light = _hsv(rng.uniform(0, 360), rng.uniform(0.05, 0.3), rng.uniform(0.65, 0.92))
    return dark + (light - dark) * field


def shape_geometry(scene: Scene, rng: np.random.Generator, size: int) -> tuple[float, float, float, float]:
    """(cx, cy, outer radius, angle) in pixels for the scene's size and place."""
    size_name = SIZES[scene.size]
    r = 0.5 * size * rng.uniform(*DIAMETER[size_name])
    row, col = divmod(scene.position, 3)
    grid, jitter = GRID[size_name], JITTER[size_name]
    cx = size * (grid[col] + rng.uniform(-jitter, jitter))
    cy = size * (grid[row] + rng.uniform(-jitter, jitter))
    return cx, cy, r, rng.uniform(0, 2 * math.pi)


def render_scene(scene: Scene, rng: np.random.Generator, image_size: int = 64) -> np.ndarray:
    """The scene as uint8 [S, S, 3]."""
    bg = _scene_background(scene.background, rng, image_size)
    cx, cy, r, angle = shape_geometry(scene, rng, image_size)
    fill_a, outline_a = shape_alpha(CLASS_NAMES[scene.shape], cx, cy, r, angle, image_size)
    return paint_shape(bg, fill_a, outline_a, scene.colour, rng)


def paint_shape(bg: np.ndarray, fill_a: np.ndarray, outline_a: np.ndarray, colour: int,
                rng: np.random.Generator) -> np.ndarray:
    """uint8 [..., S, S, 3]: a shape of colour ``colour`` (hue jittered, lightly shaded across the image) with its
    outline over the background ``bg`` [S, S, 3]; ``fill_a`` and ``outline_a`` are alphas [..., S, S] (a scene's
    one image, or the frames of a clip)."""
    image_size = bg.shape[0]
    color = _hsv(COLOURS[COLOUR_NAMES[colour]] + rng.uniform(-7, 7), rng.uniform(0.72, 1.0),
                 rng.uniform(0.78, 1.0))
    y, x = np.mgrid[0:image_size, 0:image_size].astype(np.float32) / image_size
    a = rng.uniform(0, 2 * math.pi)
    shade = 1.0 + 0.15 * ((x - 0.5) * math.cos(a) + (y - 0.5) * math.sin(a))
    shape_rgb = np.clip(color * shade[..., None], 0, 1)
    edge = np.zeros(3, np.float32) if float(_luma(bg).mean()) > 0.5 else np.ones(3, np.float32)
    img = bg * (1 - outline_a[..., None]) + edge * outline_a[..., None]
    img = img * (1 - fill_a[..., None]) + shape_rgb * fill_a[..., None]
    return (np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8)


def draw_scene(rng: np.random.Generator) -> Scene:
    """Uniform attributes; each optional attribute left out of the caption with ``OMIT_PROBABILITY``."""
    shape = int(rng.integers(NUM_CLASSES))
    colour = int(rng.integers(len(COLOURS)))
    size = int(rng.integers(len(SIZES)))
    position = int(rng.integers(len(POSITIONS)))
    background = int(rng.integers(len(BACKGROUND_NAMES) - 1))
    if background >= len(TONES) + colour:  # every background but the shape's own colour
        background += 1
    stated = ("shape", "colour") + tuple(a for a in ("size", "position", "background")
                                         if rng.random() >= OMIT_PROBABILITY)
    return Scene(shape, colour, size, position, background, stated)


def evaluation_prompts(count: int, split: str = "test") -> tuple[list[str], np.ndarray]:
    """``count`` held-out prompts that state every attribute, and their attributes [N, 5]: the prompts a model's
    faithfulness is measured on (the scenes of ``split``, captioned in full)."""
    captions, attributes = [], []
    for index in range(count):
        rng = image_rng(SPLIT_SEEDS[split], index)
        scene = draw_scene(rng)
        captions.append(caption(Scene(scene.shape, scene.colour, scene.size, scene.position, scene.background), rng))
        attributes.append([scene.shape, scene.colour, scene.size, scene.position, scene.background])
    return captions, np.array(attributes, np.int64).reshape(-1, len(ATTRIBUTES))


def sample_scene(seed: int, index: int, image_size: int = 64) -> tuple[np.ndarray, str, Scene]:
    """The (image, caption, scene) at ``index`` of the data set with this ``seed``."""
    rng = image_rng(seed, index)
    scene = draw_scene(rng)
    text = caption(scene, rng)
    return render_scene(scene, rng, image_size), text, scene


def render_scenes(seed: int, start: int, count: int,
                  image_size: int = 64) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Scenes ``start .. start+count-1``: uint8 images [N, S, S, 3], captions, and attributes [N, 5] (int64,
    in ``ATTRIBUTES`` order)."""
    items = [sample_scene(seed, i, image_size) for i in range(start, start + count)]
    attrs = np.array([[s.shape, s.colour, s.size, s.position, s.background] for _, _, s in items], np.int64)
    return np.stack([im for im, _, _ in items]), [t for _, t, _ in items], attrs


def caption_words(text: str) -> list[str]:
    """The lower-case words of a caption (hyphenated words split), the unit a word-level text encoder reads."""
    return re.findall(r"[a-z]+", text.lower())


def caption_vocabulary() -> tuple[str, ...]:
    """Every word the caption grammar can produce, sorted."""
    words: set[str] = {"a", "an", "with", "on", "against", "over", "the", "in", "at", "near", "side", "corner",
                       "edge"}
    for table in (SHAPE_WORDS, COLOUR_WORDS, SIZE_WORDS):
        for options in table.values():
            for option in options:
                words.update(caption_words(option))
    for options in ROW_WORDS + COLUMN_WORDS:
        words.update(options)
    words.update(BACKGROUND_NAMES + BACKGROUND_NOUNS)
    return tuple(sorted(words))


# The words of each attribute in the grammar; a word no attribute uses is a joining word ("a", "on", "the").
PLACE_NOUNS = ("corner", "edge", "side")
JOINING = "other words"


def words_by_attribute(words: Iterable[str]) -> dict[str, list[str]]:
    """``words`` (a text encoder's vocabulary) by the attribute the caption grammar uses them for (``ATTRIBUTES``
    order, then :data:`JOINING`), each list sorted; a colour word counts once, under colour (backgrounds take the
    colours too). Words the grammar does not produce are left out."""
    grammar = caption_vocabulary()
    named = {"shape": SHAPE_WORDS, "colour": COLOUR_WORDS, "size": SIZE_WORDS}
    owners = {w: attribute for attribute, table in named.items() for options in table.values()
              for option in options for w in caption_words(option)}
    owners.update({w: "position" for w in (*sum(ROW_WORDS + COLUMN_WORDS, ()), *PLACE_NOUNS)})
    owners.update({w: "background" for w in BACKGROUND_NAMES + BACKGROUND_NOUNS if w not in owners})
    groups: dict[str, list[str]] = {name: [] for name in (*ATTRIBUTES, JOINING)}
    for word in sorted(set(words) & set(grammar)):
        groups[owners.get(word, JOINING)].append(word)
    return {name: group for name, group in groups.items() if group}


def _render_chunk(args: tuple[int, int, int]) -> tuple[np.ndarray, list[str], np.ndarray]:
    return render_scenes(*args)


def cached_scenes(cache_dir: str | Path, split: str, count: int, workers: int = 2,
                  chunk: int = 512) -> tuple[np.ndarray, list[str], np.ndarray]:
    """The first ``count`` scenes of a split (images, captions, attributes), rendered once into ``cache_dir`` with a
    process pool and memory-mapped after that; a smaller cache is extended."""
    from concurrent.futures import ProcessPoolExecutor

    from tqdm.auto import tqdm

    if split not in SPLIT_SEEDS:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(SPLIT_SEEDS)}")
    cache_dir = Path(cache_dir)
    paths = [cache_dir / f"scenes_{split}_{part}" for part in ("images.npy", "captions.json", "attributes.npy")]
    done_images, done_captions, done_attrs = np.zeros((0, 64, 64, 3), np.uint8), [], np.zeros((0, 5), np.int64)
    if all(p.exists() for p in paths):
        done_images = np.load(paths[0], mmap_mode="r")
        done_captions, done_attrs = json.loads(paths[1].read_text()), np.load(paths[2])
        if len(done_images) >= count:
            return done_images[:count], done_captions[:count], done_attrs[:count]
    first = len(done_images)
    jobs = [(SPLIT_SEEDS[split], s, min(chunk, count - s)) for s in range(first, count, chunk)]
    images, captions, attrs = [np.asarray(done_images)], list(done_captions), [done_attrs]
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool, \
            tqdm(total=count - first, desc=f"render scenes ({split})", unit="img") as bar:
        for imgs, texts, attributes in pool.map(_render_chunk, jobs):
            images.append(imgs)
            captions.extend(texts)
            attrs.append(attributes)
            bar.update(len(imgs))
    cache_dir.mkdir(parents=True, exist_ok=True)
    np.save(paths[0], np.concatenate(images))
    paths[1].write_text(json.dumps(captions))
    np.save(paths[2], np.concatenate(attrs))
    return cached_scenes(cache_dir, split, count, workers, chunk)
