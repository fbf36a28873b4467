"""Moving captioned scenes: seeded, the caption names the clip's attributes and its motion, the object moves the
way the caption says and stays whole in frame, splits are disjoint, every word is listed by attribute."""

from __future__ import annotations

import numpy as np
import pytest

from vgen.data import clips, moving_scenes, scenes, shapes
from vgen.data.clips import EXTENT, ClipsConfig, shape_masks
from vgen.data.moving_scenes import (
    ATTRIBUTES,
    GROWTHS,
    MOTIONS,
    SPLIT_SEEDS,
    MovingScenesConfig,
    cached_moving_scenes,
    caption_vocabulary,
    evaluation_prompts,
    moving_caption,
    render_moving_scenes,
    sample_moving_scene,
    sample_trajectory,
    switch_pairs,
    words_by_attribute,
)
from vgen.data.scenes import COLOUR_WORDS, DIAMETER, PLAIN_BACKGROUNDS, SHAPE_WORDS, SIZE_WORDS, SIZES

SMALL = MovingScenesConfig(num_frames=6, frame_size=32, supersample=2)
CFG = MovingScenesConfig()
# The trajectories and captions of 240 clips (no pixels drawn): every motion and size change many times.
DRAWN = [sample_trajectory(5, i, CFG) for i in range(240)]
# What each drift means on screen: (x, y) steps in pixels, rows counted down.
ON_SCREEN = {"moving right": (1, 0), "moving left": (-1, 0), "moving up": (0, -1), "moving down": (0, 1)}
PLACE_WORDS = {"top": {"top", "upper"}, "bottom": {"bottom", "lower"}, "left": {"left"}, "right": {"right"},
               "centre": {"centre", "center", "middle"}}


def _words(text: str) -> set[str]:
    return set(scenes.caption_words(text))


def _circle(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The least-squares circle through points [T, 2]: its centre and each point's distance from it."""
    a = np.concatenate([2 * points, np.ones((len(points), 1))], 1)
    solution = np.linalg.lstsq(a, (points ** 2).sum(1), rcond=None)[0]
    return solution[:2], np.linalg.norm(points - solution[:2], axis=1)


def _start(ms: moving_scenes.MovingScene, mo: clips.Motion) -> np.ndarray:
    return _circle(mo.centres)[0] if MOTIONS[ms.motion] == "circling" else mo.centres[0]


def test_a_clip_is_a_pure_function_of_seed_and_index():
    a, a_text, a_ms = sample_moving_scene(0, 7, SMALL)
    b, b_text, b_ms = sample_moving_scene(0, 7, SMALL)
    c, _, _ = sample_moving_scene(1, 7, SMALL)
    np.testing.assert_array_equal(a, b)
    assert (a_text, a_ms) == (b_text, b_ms) and not np.array_equal(a, c)
    assert a.shape == (6, 32, 32, 3) and a.dtype == np.uint8
    batch, captions, attrs = render_moving_scenes(0, 6, 2, SMALL)
    np.testing.assert_array_equal(batch[1], a)
    assert captions[1] == a_text and attrs[1].tolist() == a_ms.attributes() and attrs.shape == (2, len(ATTRIBUTES))


def test_every_motion_and_size_change_occurs():
    assert {MOTIONS[ms.motion] for ms, _, _ in DRAWN} == set(MOTIONS)
    assert {GROWTHS[ms.growth] for ms, _, _ in DRAWN} == set(GROWTHS)


def test_captions_name_the_clip_s_attributes_and_motion():
    for ms, _, rng in DRAWN:
        text, names = moving_caption(ms, rng), ms.names()
        words = _words(text)
        assert any(w in text for w in SHAPE_WORDS[names["shape"]]), text
        assert words & set(COLOUR_WORDS[names["colour"]]), text
        if "size" in ms.scene.stated:
            assert words & set(SIZE_WORDS[names["size"]]), text
        if "background" in ms.scene.stated:
            assert names["background"] in words, text
        motion = names["motion"]
        if motion in ON_SCREEN:
            assert words & {"moving", "drifting"} and motion.split()[-1] in words, text
        else:
            assert words & {"bouncing"} if motion == "bouncing" else words & {"circling", "orbiting"}, text
        assert ({"growing", "shrinking"} & words) == ({names["growth"]} - {"steady"}), text
        # the place only for an object that stays there
        assert not words & {"top", "upper", "bottom", "lower", "corner", "centre", "middle"} or \
            motion == "circling", text


def test_the_object_moves_as_the_caption_says():
    for ms, mo, _ in DRAWN:
        motion, step = MOTIONS[ms.motion], np.diff(mo.centres, axis=0)
        if motion in ON_SCREEN:  # a straight line in the named direction, never turning back
            direction = np.array(ON_SCREEN[motion])
            along = step @ direction
            assert (along > 0).all() and along.sum() >= 4, (motion, mo.centres)
            np.testing.assert_allclose(step @ direction[::-1], 0, atol=1e-9)
        elif motion == "bouncing":  # turns back at least once, and only next to an edge
            reach = EXTENT * mo.radius.max() + 1
            turns = [(t, a) for t in range(len(step) - 1) for a in range(2) if step[t, a] * step[t + 1, a] < 0]
            assert turns, mo.centres
            for t, a in turns:
                gap = min(mo.centres[t + 1, a] - reach, CFG.frame_size - reach - mo.centres[t + 1, a])
                assert gap <= np.abs(step[:, a]).max() + 1e-9, (gap, mo.centres)  # within a frame's travel
        else:  # a circle about one point, a good part of a turn
            centre, radii = _circle(mo.centres)
            assert radii.min() > 2 and np.ptp(radii) < 1e-6, radii
            turn = np.abs(np.diff(np.unwrap(np.arctan2(*(mo.centres - centre).T[::-1])))).sum()
            assert turn >= np.pi, turn


def test_the_size_changes_as_stated_and_the_object_stays_in_frame():
    for ms, mo, _ in DRAWN:
        growth, radii, size = GROWTHS[ms.growth], mo.radius, CFG.frame_size
        lo, hi = DIAMETER[SIZES[ms.scene.size]]
        assert lo * size / 2 <= radii[0] <= hi * size / 2  # the size attribute is the first frame's
        change = np.diff(radii)
        assert {"steady": (change == 0).all(), "growing": (change > 0).all() and radii[-1] >= 0.28 * size,
                "shrinking": (change < 0).all() and radii[-1] <= 0.17 * size}[growth]
        reach = EXTENT * radii[:, None] + 1
        assert (mo.centres - reach >= -1e-9).all() and (mo.centres + reach <= size + 1e-9).all()


@pytest.mark.parametrize("motion", list(ON_SCREEN))
def test_the_drawn_object_moves_the_way_its_caption_says_on_screen(motion):
    symmetric = {shapes.CLASS_NAMES.index(n) for n in ("circle", "square", "cross", "star", "ring")}
    ms, mo, _ = next(d for d in DRAWN if MOTIONS[d[0].motion] == motion and d[0].scene.shape in symmetric)
    fill, _ = shape_masks(ms.scene.shape, mo, ClipsConfig(num_frames=16, frame_size=64, supersample=1))
    rows, cols = np.mgrid[0:64, 0:64]
    centroid = np.stack([(fill * cols).sum((1, 2)), (fill * rows).sum((1, 2))], 1) / fill.sum((1, 2))[:, None]
    assert (centroid[-1] - centroid[0]) @ np.array(ON_SCREEN[motion]) >= 4


@pytest.mark.parametrize("index", [i for i, (ms, _, _) in enumerate(DRAWN) if ms.growth][:4])
def test_no_pixel_of_a_growing_or_shrinking_object_reaches_the_border(index):
    ms, mo, _ = DRAWN[index]
    fill, _ = shape_masks(ms.scene.shape, mo, ClipsConfig(num_frames=16, frame_size=64, supersample=1))
    border = np.concatenate([fill[:, 0], fill[:, -1], fill[:, :, 0], fill[:, :, -1]], 1)
    assert border.max() < 0.05


def test_the_position_is_the_place_nearest_the_start():
    for ms, mo, _ in DRAWN[:60]:
        start = _start(ms, mo)
        grid = np.asarray(scenes.GRID[SIZES[ms.scene.size]]) * CFG.frame_size
        row, col = divmod(ms.scene.position, 3)
        assert np.abs(grid - start[0]).argmin() == col and np.abs(grid - start[1]).argmin() == row


def test_splits_are_disjoint_and_seeded_apart_from_the_other_sets():
    assert len({*SPLIT_SEEDS.values(), *shapes.SPLIT_SEEDS.values(), *clips.SPLIT_SEEDS.values()}) == 9
    trajectories = {split: {sample_trajectory(seed, i, CFG)[1].centres.tobytes() for i in range(40)}
                    for split, seed in SPLIT_SEEDS.items()}
    assert not trajectories["train"] & trajectories["val"] and not trajectories["train"] & trajectories["test"]
    assert not trajectories["val"] & trajectories["test"]


def test_every_caption_word_is_listed_by_attribute_and_scene_words_stay_where_they_were():
    vocabulary = set(caption_vocabulary())
    for ms, _, rng in DRAWN:
        assert set(scenes.caption_words(moving_caption(ms, rng))) <= vocabulary
    groups = words_by_attribute([*vocabulary, "zebra"])
    assert sorted(w for g in groups.values() for w in g) == sorted(vocabulary)
    assert groups["motion"] == ["around", "bouncing", "circling", "down", "drifting", "moving", "orbiting", "up"]
    assert groups["growth"] == ["growing", "shrinking"] and {"and", "while"} <= set(groups[scenes.JOINING])
    assert "right" in groups["position"] and list(groups)[-1] == scenes.JOINING
    for attribute, words in scenes.words_by_attribute(vocabulary).items():
        assert set(words) <= set(groups[attribute])
    assert words_by_attribute(["red", "up"]) == {"colour": ["red"], "motion": ["up"]}


def test_the_cache_renders_once_and_keeps_to_its_config(tmp_path):
    clips_, captions, attrs = cached_moving_scenes(tmp_path, "val", 3, SMALL, workers=1)
    expected = render_moving_scenes(SPLIT_SEEDS["val"], 0, 3, SMALL)
    np.testing.assert_array_equal(clips_, expected[0])
    assert captions == expected[1] and np.array_equal(attrs, expected[2])
    again, _, _ = cached_moving_scenes(tmp_path, "val", 2, SMALL, workers=1)
    assert isinstance(again, np.memmap) and len(again) == 2
    with pytest.raises(ValueError, match="holds moving scenes rendered with"):
        cached_moving_scenes(tmp_path, "val", 2, CFG, workers=1)
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        cached_moving_scenes(tmp_path, "dev", 2, SMALL)



def _states(text: str, attributes: dict[str, str]) -> None:
    """The prompt names each attribute in ``attributes`` with one of the grammar's words for it, and no other."""
    words = _words(text)
    assert any(w in text for w in SHAPE_WORDS[attributes["shape"]]), text
    assert words & set(COLOUR_WORDS[attributes["colour"]]), text
    assert words & set(SIZE_WORDS[attributes["size"]]), text
    assert attributes["background"] in words and words & {"background", "backdrop"}, text
    motion = attributes["motion"]
    if motion in ON_SCREEN:
        assert words & {"moving", "drifting"} and motion.split()[-1] in words, text
    else:
        assert words & ({"bouncing"} if motion == "bouncing" else {"circling", "orbiting"}), text
    assert ({"growing", "shrinking"} & words) == ({attributes["growth"]} - {"steady"}), text
    assert ("position" in attributes) == (motion == "circling")  # the place only where the object stays
    for part in attributes.get("position", "").split():
        assert words & PLACE_WORDS[part], text


def test_evaluation_prompts_state_every_attribute_and_are_reproducible_by_seed():
    prompts = evaluation_prompts(60)
    assert prompts == evaluation_prompts(60) and evaluation_prompts(10) == prompts[:10]
    assert evaluation_prompts(10, seed=1) != prompts[:10] and evaluation_prompts(10, "val") != prompts[:10]
    assert len({text for text, _ in prompts}) == 60
    for text, attributes in prompts:
        assert set(attributes) <= set(ATTRIBUTES) and set(ATTRIBUTES) - set(attributes) <= {"position"}
        assert all(value in moving_scenes.ATTRIBUTE_VALUES[a] for a, value in attributes.items())
        _states(text, attributes)
    assert {a["motion"] for _, a in prompts} == set(MOTIONS)
    assert set(caption_vocabulary()) >= {w for text, _ in prompts for w in _words(text)}


def test_switch_pairs_change_the_shape_and_the_colour_only():
    pairs = switch_pairs(60, seed=3)
    assert pairs == switch_pairs(60, seed=3) and switch_pairs(5, seed=3) == pairs[:5]
    assert [first for first, _ in pairs] == evaluation_prompts(60, seed=3)
    for (_, before), (text, after) in pairs:
        _states(text, after)
        assert after["shape"] != before["shape"] and after["colour"] != before["colour"]
        assert {a: v for a, v in after.items() if a not in ("shape", "colour")} == \
            {a: v for a, v in before.items() if a not in ("shape", "colour")}
        assert after["colour"] != after["background"] or after["background"] not in PLAIN_BACKGROUNDS


@pytest.mark.parametrize("call, message", [
    (lambda: evaluation_prompts(3, "dev"), "unknown split 'dev'"),
    (lambda: switch_pairs(3, seed=-1), "count and seed must be >= 0, got 3, -1"),
    (lambda: evaluation_prompts(-2), "count and seed must be >= 0, got -2, 0"),
])
def test_bad_prompt_set_arguments_fail_in_one_line(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("kwargs, message", [
    ({"num_frames": 1}, "num_frames must be >= 2"),
    ({"frame_size": 8}, "frame_size must be >= 16 pixels, got 8"),
    ({"min_speed": 0.1, "max_speed": 0.05}, "need 0 < min_speed <= max_speed"),
    ({"min_period": 1}, "need 2 <= min_period <= max_period"),
])
def test_bad_configs_fail_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as error:
        MovingScenesConfig(**kwargs)
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="index must be >= 0"):
        moving_scenes.sample_moving_scene(0, -1)
