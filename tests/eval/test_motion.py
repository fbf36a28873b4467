"""Motion readout: the object is found by its colour, its track reads drifts by direction, bounces, circles and
size changes on real moving-scene clips, and a frame without the object reads nothing."""

from __future__ import annotations

import numpy as np
import pytest

from vgen.data.moving_scenes import GROWTHS, MOTIONS, SPLIT_SEEDS, MovingScenesConfig, render_moving_scenes
from vgen.data.scenes import COLOUR_NAMES
from vgen.eval.motion import colour_mask, motion_of, object_track, read_motion


def _disc_clip(centres: np.ndarray, radii: np.ndarray, rgb=(230, 20, 20), size: int = 48) -> np.ndarray:
    """Frames of a disc of colour ``rgb`` at ``centres`` (x, y) with ``radii`` over a dull grey-blue background."""
    rows, cols = np.mgrid[:size, :size]
    frames = np.empty((len(centres), size, size, 3), np.uint8)
    frames[:] = (110, 120, 140)
    for frame, (x, y), r in zip(frames, centres, radii):
        frame[(cols - x) ** 2 + (rows - y) ** 2 <= r ** 2] = rgb
    return frames


def test_real_clips_read_their_motion_and_size_change():
    clips, _, attrs = render_moving_scenes(SPLIT_SEEDS["val"], 0, 36, MovingScenesConfig(supersample=2))
    assert {MOTIONS[a[5]] for a in attrs} == set(MOTIONS) and {GROWTHS[a[6]] for a in attrs} == set(GROWTHS)
    reads = [motion_of(c, COLOUR_NAMES[a[1]]) for c, a in zip(clips, attrs)]
    assert sum(m == MOTIONS[a[5]] for (m, _), a in zip(reads, attrs)) >= 34  # 35 of 36 when written
    assert [g for _, g in reads] == [GROWTHS[a[6]] for a in attrs]


def test_the_track_is_the_centre_and_area_of_the_coloured_pixels():
    t = np.arange(12.0)
    centres = np.stack([10 + 2 * t, np.full(12, 20.0)], 1)
    clip = _disc_clip(centres, np.full(12, 5.0))
    found, area = object_track(clip, "red")
    np.testing.assert_allclose(found, centres, atol=1e-9)  # a disc centred on a pixel is symmetric about it
    assert (area == area[0]).all() and area[0] > 60
    assert not colour_mask(clip, "green").any() and not colour_mask(clip[:, :5, :5], "red").any()


@pytest.mark.parametrize("path, radii, expected", [
    (lambda t: (10 + 2 * t, 24 + 0 * t), 6 + 0 * np.arange(12.0), ("moving right", "steady")),
    (lambda t: (24 + 0 * t, 38 - 2 * t), 4 + 0.4 * np.arange(12.0), ("moving up", "growing")),
    (lambda t: (24 + 9 * np.cos(2 * np.pi * t / 10), 24 + 9 * np.sin(2 * np.pi * t / 10)), 5 + 0 * np.arange(12.0),
     ("circling", "steady")),
    (lambda t: (10 + 2 * t, 38 - 3 * np.minimum(t, 12 - t)), 9 - 0.4 * np.arange(12.0), ("bouncing", "shrinking")),
])
def test_drawn_tracks_read_as_drawn(path, radii, expected):
    t = np.arange(12.0)
    assert motion_of(_disc_clip(np.stack(path(t), 1), radii), "red") == expected


def test_no_object_or_no_movement_reads_nothing():
    still = _disc_clip(np.full((8, 2), 20.0), np.full(8, 5.0))
    assert motion_of(still, "red") == (None, None)
    moving = _disc_clip(np.stack([10 + 2 * np.arange(8.0), np.full(8, 20.0)], 1), np.full(8, 5.0))
    moving[3] = 110
    assert motion_of(moving, "red") == (None, None)  # the object is missing from a frame


@pytest.mark.parametrize("call, message", [
    (lambda: colour_mask(np.zeros((2, 8, 8, 3), np.uint8), "teal"), "unknown colour 'teal'"),
    (lambda: read_motion(np.zeros((2, 2)), np.ones(2)), "need a track of at least 3 frames, got 2"),
])
def test_bad_input_fails_in_one_line(call, message):
    with pytest.raises(ValueError, match=message):
        call()
