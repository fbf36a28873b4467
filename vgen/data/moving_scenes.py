"""Moving captioned scenes: a scene of :mod:`vgen.data.scenes` whose object moves, and may grow or shrink, over a
static background; the clips a prompt-conditioned video model learns from.

The object keeps the scene's shape, colour and background and moves in one of six ways (``MOTIONS``): it drifts
in a straight line (right, left, up or down) without touching the frame's edges, bounces off an edge at least once
on a diagonal course, or circles around one place. Half the clips keep their size; a quarter grow from small to
large and a quarter shrink from large to small (the sizes are the scenes' sizes). The whole object stays in frame
in every frame: its centre keeps ``EXTENT`` radii (plus one pixel of outline) from each edge at its largest.

Clip-level attributes (``ATTRIBUTES``) are the scene's, read at the start, plus the motion and the size change:
``size`` is the first frame's size, ``position`` the place on the scenes' 3 x 3 grid nearest the first frame's
centre (nearest the circle's centre for a circling object). A caption states the shape, the colour and the motion
("moving right", "bouncing", "circling"), any size change ("growing and ..."), and, as the scenes do, the size and
background unless left out (one time in ten); it states the place only for a circling object, which stays there.
Clip ``i`` of a split, its frames and its caption are a pure function of ``(seed, i)``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from vgen.data import scenes
from vgen.data.clips import EXTENT, ClipsConfig, Motion, _fold, shape_masks
from vgen.data.scenes import (
    COLOUR_NAMES,
    DIAMETER,
    GRID,
    SIZES,
    Scene,
    caption,
    draw_scene,
    paint_shape,
)
from vgen.data.shapes import CLASS_NAMES, image_rng

MOTIONS: tuple[str, ...] = ("moving right", "moving left", "moving up", "moving down", "bouncing", "circling")
DRIFTS: dict[str, tuple[int, int]] = {"moving right": (1, 0), "moving left": (-1, 0), "moving up": (0, -1),
                                      "moving down": (0, 1)}  # unit steps in (x, y) pixels, y down
GROWTHS: tuple[str, ...] = ("steady", "growing", "shrinking")
ATTRIBUTES: tuple[str, ...] = scenes.ATTRIBUTES + ("motion", "growth")
ATTRIBUTE_VALUES: dict[str, tuple[str, ...]] = {**scenes.ATTRIBUTE_VALUES, "motion": MOTIONS, "growth": GROWTHS}
SPLIT_SEEDS = {"train": 20, "val": 21, "test": 22}  # distinct from the images' and the clips' seeds

# The caption grammar's words for each motion and size change; "{}" takes a drift's direction word.
MOTION_WORDS: dict[str, tuple[str, ...]] = {
    "drift": ("moving {}", "drifting {}"), "bouncing": ("bouncing", "bouncing around"),
    "circling": ("circling", "orbiting", "circling around")}
DIRECTION_WORDS: dict[str, str] = {"moving right": "right", "moving left": "left", "moving up": "up",
                                   "moving down": "down"}
GROWTH_WORDS: dict[str, tuple[str, ...]] = {"growing": ("growing",), "shrinking": ("shrinking",)}
JOINING_WORDS = ("and", "while")


@dataclass(frozen=True)
class MovingScenesConfig:
    """Clip geometry and motion: speeds in frame sides per frame, the circling period in frames, the spin in
    radians per frame. A drift is slowed where needed to cross at most the room it has in ``num_frames``."""

    num_frames: int = 16
    frame_size: int = 64
    min_speed: float = 0.02
    max_speed: float = 0.05
    min_period: float = 8.0
    max_period: float = 16.0
    max_spin: float = 0.15
    supersample: int = 4

    def __post_init__(self) -> None:
        if self.num_frames < 2:
            raise ValueError(f"num_frames must be >= 2 (a clip moves), got {self.num_frames}")
        if self.frame_size < 16:
            raise ValueError(f"frame_size must be >= 16 pixels, got {self.frame_size}")
        if not 0 < self.min_speed <= self.max_speed:
            raise ValueError(f"need 0 < min_speed <= max_speed, got {self.min_speed}, {self.max_speed}")
        if not 2 <= self.min_period <= self.max_period:
            raise ValueError(f"need 2 <= min_period <= max_period, got {self.min_period}, {self.max_period}")
        if not self.max_spin >= 0:
            raise ValueError(f"max_spin must be >= 0, got {self.max_spin}")
        if self.supersample < 1:
            raise ValueError(f"supersample must be >= 1, got {self.supersample}")


@dataclass(frozen=True)
class MovingScene:
    """A clip's attributes: its scene (read at the first frame, with the attributes its caption states), and the
    motion and size change by index into ``MOTIONS`` and ``GROWTHS``."""

    scene: Scene
    motion: int
    growth: int

    def names(self) -> dict[str, str]:
        """Attribute -> name, e.g. ``{"shape": "star", ..., "motion": "bouncing", "growth": "steady"}``."""
        return {**self.scene.names(), "motion": MOTIONS[self.motion], "growth": GROWTHS[self.growth]}

    def attributes(self) -> list[int]:
        """The value indices in ``ATTRIBUTES`` order."""
        s = self.scene
        return [s.shape, s.colour, s.size, s.position, s.background, self.motion, self.growth]


def draw_moving_scene(rng: np.random.Generator) -> MovingScene:
    """A scene (:func:`~vgen.data.scenes.draw_scene`: its position is where the object aims to start or circle),
    a uniform motion, and a size change (steady 1/2, growing 1/4 from small, shrinking 1/4 from large)."""
    scene = draw_scene(rng)
    motion = int(rng.integers(len(MOTIONS)))
    growth = int(rng.choice(len(GROWTHS), p=[0.5, 0.25, 0.25]))
    if growth:
        scene = replace(scene, size=SIZES.index("small" if GROWTHS[growth] == "growing" else "large"))
    return MovingScene(scene, motion, growth)


def _aim(place: int, size_name: str, frame_size: int) -> np.ndarray:
    """The (x, y) pixel centre of a place on the grid of objects of this size."""
    row, col = divmod(place, 3)
    return frame_size * np.array([GRID[size_name][col], GRID[size_name][row]])


def nearest_place(centre: np.ndarray, size_name: str, frame_size: int) -> int:
    """The place on the 3 x 3 grid of objects of this size whose centre is nearest ``centre`` (x, y pixels)."""
    grid = np.asarray(GRID[size_name]) * frame_size
    col, row = (int(np.abs(grid - c).argmin()) for c in centre)
    return 3 * row + col


def trajectory(ms: MovingScene, rng: np.random.Generator,
               cfg: MovingScenesConfig = MovingScenesConfig()) -> tuple[Motion, np.ndarray]:
    """The object's centres, angles and radii over the clip, in pixels (radii one a frame), and its anchor: the
    first centre, or the centre of the circle it goes round."""
    size, frames = cfg.frame_size, cfg.num_frames
    start_size = SIZES[ms.scene.size]
    end_size = {"steady": start_size, "growing": "large", "shrinking": "small"}[GROWTHS[ms.growth]]
    r0 = 0.5 * size * rng.uniform(*DIAMETER[start_size])
    r1 = r0 if end_size == start_size else 0.5 * size * rng.uniform(*DIAMETER[end_size])
    t = np.arange(frames, dtype=np.float64)
    radii = r0 + (r1 - r0) * t / (frames - 1)
    reach = EXTENT * max(r0, r1) + 1
    lo, hi = reach, size - reach
    aim = _aim(ms.scene.position, start_size, size) + rng.uniform(-1, 1, 2) * size * scenes.JITTER[start_size]
    speed = size * rng.uniform(cfg.min_speed, cfg.max_speed)
    name = MOTIONS[ms.motion]
    if name in DRIFTS:
        step = np.array(DRIFTS[name], np.float64)
        speed = min(speed, (hi - lo) / (frames - 1))
        start = np.clip(aim, lo, hi)
        axis = int(np.abs(step).argmax())  # the start along the path leaves room for the whole drift
        start[axis] = np.clip(start[axis], lo, hi - speed * (frames - 1)) if step[axis] > 0 else \
            np.clip(start[axis], lo + speed * (frames - 1), hi)
        centres = anchor = start + t[:, None] * speed * step
    elif name == "bouncing":
        heading = rng.choice([1, 3, 5, 7]) * math.pi / 4 + rng.uniform(-0.3, 0.3)
        velocity = speed * np.array([math.cos(heading), math.sin(heading)])
        axis = int(rng.integers(2))  # the axis whose wall the object reaches at frame ``hit``
        hit = int(rng.integers(1, frames - 1))
        velocity[axis] = math.copysign(min(abs(velocity[axis]), (hi - lo) / hit), velocity[axis])
        start = np.clip(aim, lo, hi)
        start[axis] = (hi if velocity[axis] > 0 else lo) - velocity[axis] * hit
        centres = anchor = _fold(start + t[:, None] * velocity, lo, hi)
    else:
        radius = min(0.12 * size, 0.5 * (hi - lo))
        centre = np.clip(aim, lo + radius, hi - radius)
        omega = rng.choice([-1, 1]) * 2 * math.pi / rng.uniform(cfg.min_period, cfg.max_period)
        phase = rng.uniform(0, 2 * math.pi) + omega * t
        centres = centre + radius * np.stack([np.cos(phase), np.sin(phase)], 1)
        anchor = centre[None]
    angles = rng.uniform(0, 2 * math.pi) + rng.uniform(-cfg.max_spin, cfg.max_spin) * t
    return Motion(centres, angles, radii), anchor[0]


def motion_phrase(ms: MovingScene, rng: np.random.Generator) -> str:
    """What the object does, e.g. "drifting up" or "growing and bouncing"."""
    name = MOTIONS[ms.motion]
    if name in DRIFTS:
        action = scenes._pick(rng, MOTION_WORDS["drift"]).format(DIRECTION_WORDS[name])
    else:
        action = scenes._pick(rng, MOTION_WORDS[name])
    growth = GROWTHS[ms.growth]
    if growth == "steady":
        return action
    grow = scenes._pick(rng, GROWTH_WORDS[growth])
    return f"{grow} and {action}" if rng.random() < 0.5 else f"{action} while {grow}"


def moving_caption(ms: MovingScene, rng: np.random.Generator) -> str:
    """A sentence stating the clip's stated attributes and its motion (the place only for a circling object)."""
    scene = ms.scene
    if MOTIONS[ms.motion] != "circling":
        scene = replace(scene, stated=tuple(a for a in scene.stated if a != "position"))
    return caption(scene, rng, motion_phrase(ms, rng))


def drawn_trajectory(rng: np.random.Generator, cfg: MovingScenesConfig = MovingScenesConfig()
                     ) -> tuple[MovingScene, Motion]:
    """A clip's attributes and trajectory drawn from ``rng``, its position read from the trajectory."""
    ms = draw_moving_scene(rng)
    mo, anchor = trajectory(ms, rng, cfg)
    place = nearest_place(anchor, SIZES[ms.scene.size], cfg.frame_size)
    return replace(ms, scene=replace(ms.scene, position=place)), mo


def sample_trajectory(seed: int, index: int, cfg: MovingScenesConfig = MovingScenesConfig()
                      ) -> tuple[MovingScene, Motion, np.random.Generator]:
    """Clip ``index``'s attributes (its position read from the trajectory) and trajectory, and the random stream
    left for its caption and pixels."""
    if index < 0:
        raise ValueError(f"index must be >= 0, got {index}")
    rng = image_rng(seed, index)
    ms, mo = drawn_trajectory(rng, cfg)
    return ms, mo, rng


def sample_moving_scene(seed: int, index: int, cfg: MovingScenesConfig = MovingScenesConfig()
                        ) -> tuple[np.ndarray, str, MovingScene]:
    """The (clip uint8 [T, S, S, 3], caption, attributes) at ``index`` of the set with this ``seed``."""
    ms, mo, rng = sample_trajectory(seed, index, cfg)
    text = moving_caption(ms, rng)
    bg = scenes._scene_background(ms.scene.background, rng, cfg.frame_size)
    masks = ClipsConfig(num_frames=cfg.num_frames, frame_size=cfg.frame_size, supersample=cfg.supersample)
    fill_a, outline_a = shape_masks(ms.scene.shape, mo, masks)
    return paint_shape(bg, fill_a, outline_a, ms.scene.colour, rng), text, ms


def render_moving_scenes(seed: int, start: int, count: int, cfg: MovingScenesConfig = MovingScenesConfig()
                         ) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Clips ``start .. start+count-1``: uint8 [N, T, S, S, 3], captions, and attributes [N, 7] (int64, in
    ``ATTRIBUTES`` order)."""
    if count < 0 or start < 0:
        raise ValueError(f"start and count must be >= 0, got {start}, {count}")
    items = [sample_moving_scene(seed, i, cfg) for i in range(start, start + count)]
    shape = (0, cfg.num_frames, cfg.frame_size, cfg.frame_size, 3)
    clips = np.stack([c for c, _, _ in items]) if items else np.empty(shape, np.uint8)
    attrs = np.array([m.attributes() for _, _, m in items], np.int64).reshape(-1, len(ATTRIBUTES))
    return clips, [t for _, t, _ in items], attrs


# ---------------------------------------------------------------------------------------------------------------
# Prompt sets: what a prompt-conditioned stream is asked for when it is measured.


def stated_attributes(ms: MovingScene) -> dict[str, str]:
    """Attribute -> name for every attribute a full caption of ``ms`` states: all but the place of an object that
    leaves it (every motion but circling). A steady size is stated by naming no size change."""
    names = ms.names()
    if names["motion"] != "circling":
        del names["position"]
    return names


def _full_caption(ms: MovingScene, rng: np.random.Generator) -> tuple[str, dict[str, str]]:
    full = replace(ms, scene=replace(ms.scene, stated=scenes.ATTRIBUTES))
    return moving_caption(full, rng), stated_attributes(full)


def _prompt_draws(count: int, split: str, seed: int) -> Iterator[tuple[MovingScene, np.random.Generator]]:
    """The attributes (trajectory-read, as a clip's) of prompt ``0 .. count-1`` of a set, and the random stream
    left for its words: a pure function of ``(split, seed, index)``, so a shorter set is a longer one's start."""
    if split not in SPLIT_SEEDS:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(SPLIT_SEEDS)}")
    if count < 0 or seed < 0:
        raise ValueError(f"count and seed must be >= 0, got {count}, {seed}")
    for index in range(count):
        rng = np.random.default_rng([SPLIT_SEEDS[split], seed, index])
        yield drawn_trajectory(rng)[0], rng


def evaluation_prompts(count: int, split: str = "test", seed: int = 0) -> list[tuple[str, dict[str, str]]]:
    """``count`` prompts drawn as ``split``'s clips are, each captioned in full (every attribute the grammar
    states, see :func:`stated_attributes`), with those attributes by name: the prompts a stream's faithfulness
    is measured on. Each ``seed`` gives a set of its own."""
    return [_full_caption(ms, rng) for ms, rng in _prompt_draws(count, split, seed)]


def switch_pairs(count: int, split: str = "test", seed: int = 0
                 ) -> list[tuple[tuple[str, dict[str, str]], tuple[str, dict[str, str]]]]:
    """``count`` (first, second) prompts with their attributes, for streams switched from one to the other: the
    first is :func:`evaluation_prompts`' prompt of the same index, the second asks for another shape in another
    colour (never the colour of a plain background) with every other attribute kept (size, place, background,
    motion, size change), in words drawn afresh."""
    pairs = []
    for ms, rng in _prompt_draws(count, split, seed):
        first = _full_caption(ms, rng)
        shapes_left = [s for s in range(len(CLASS_NAMES)) if s != ms.scene.shape]
        background = scenes.BACKGROUND_NAMES[ms.scene.background]
        colours_left = [c for c in range(len(COLOUR_NAMES)) if c != ms.scene.colour and COLOUR_NAMES[c] != background]
        scene = replace(ms.scene, shape=int(rng.choice(shapes_left)), colour=int(rng.choice(colours_left)))
        pairs.append((first, _full_caption(replace(ms, scene=scene), rng)))
    return pairs


def caption_vocabulary() -> tuple[str, ...]:
    """Every word the moving scenes' grammar can produce (the scenes' words and the motion words), sorted."""
    words = set(scenes.caption_vocabulary()) | set(JOINING_WORDS) | set(DIRECTION_WORDS.values())
    for table in (MOTION_WORDS, GROWTH_WORDS):
        for options in table.values():
            for option in options:
                words.update(scenes.caption_words(option.format("")))
    return tuple(sorted(words))


def words_by_attribute(words: Iterable[str]) -> dict[str, list[str]]:
    """``words`` by attribute as :func:`vgen.data.scenes.words_by_attribute` lists them, with the motion's and the
    size change's words after the scene's; a word counts once ("right" and "left" under position, "and" with the
    joining words). Words the grammar does not produce are left out."""
    words = set(words) & set(caption_vocabulary())
    groups = scenes.words_by_attribute(words)
    motion = {w for options in MOTION_WORDS.values() for o in options for w in scenes.caption_words(o.format(""))}
    owners = {**{w: "motion" for w in motion | set(DIRECTION_WORDS.values())},
              **{w: "growth" for options in GROWTH_WORDS.values() for w in options},
              **{w: scenes.JOINING for w in JOINING_WORDS}}
    taken = {w for group in groups.values() for w in group}
    extra: dict[str, list[str]] = {}
    for word in sorted(words - taken):
        extra.setdefault(owners[word], []).append(word)
    joining = sorted(groups.pop(scenes.JOINING, []) + extra.pop(scenes.JOINING, []))
    ordered = {**groups, **{a: extra[a] for a in ("motion", "growth") if a in extra}}
    return {**ordered, scenes.JOINING: joining} if joining else ordered


MOVING_SCENES_CONFIG = "moving_scenes.json"


def cached_moving_scenes(cache_dir: str | Path, split: str, count: int,
                         cfg: MovingScenesConfig = MovingScenesConfig(), workers: int = 2,
                         chunk: int = 64) -> tuple[np.ndarray, list[str], np.ndarray]:
    """The first ``count`` clips of a split (clips, captions, attributes), rendered once into ``cache_dir`` by
    ``workers`` processes and memory-mapped after that; the folder records its config (``moving_scenes.json``),
    and asking it for clips of another config is an error."""
    from concurrent.futures import ProcessPoolExecutor

    from tqdm.auto import tqdm

    if split not in SPLIT_SEEDS:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(SPLIT_SEEDS)}")
    cache_dir = Path(cache_dir)
    recorded = cache_dir / MOVING_SCENES_CONFIG
    if recorded.exists() and MovingScenesConfig(**json.loads(recorded.read_text())) != cfg:
        raise ValueError(f"{cache_dir} holds moving scenes rendered with {recorded.read_text().strip()}; use "
                         f"another folder for {cfg}")
    paths = [cache_dir / f"moving_{split}_{part}" for part in ("clips.npy", "captions.json", "attributes.npy")]
    if all(p.exists() for p in paths):
        clips = np.load(paths[0], mmap_mode="r")
        if len(clips) >= count:
            return clips[:count], json.loads(paths[1].read_text())[:count], np.load(paths[2])[:count]
    jobs = [(SPLIT_SEEDS[split], s, min(chunk, count - s), cfg) for s in range(0, count, chunk)]
    parts = []
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool, \
            tqdm(total=count, desc=f"render moving scenes ({split})", unit="clip") as bar:
        for part in pool.map(_render_chunk, jobs):
            parts.append(part)
            bar.update(len(part[1]))
    cache_dir.mkdir(parents=True, exist_ok=True)
    recorded.write_text(json.dumps(asdict(cfg), indent=1))
    np.save(paths[0], np.concatenate([p[0] for p in parts]))
    paths[1].write_text(json.dumps([t for p in parts for t in p[1]]))
    np.save(paths[2], np.concatenate([p[2] for p in parts]))
    return cached_moving_scenes(cache_dir, split, count, cfg, workers, chunk)


def _render_chunk(args: tuple[int, int, int, MovingScenesConfig]) -> tuple[np.ndarray, list[str], np.ndarray]:
    return render_moving_scenes(*args)
