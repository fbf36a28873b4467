"""Switch measures: a clip that shows A then B switches at once, a hard cut spikes more than a crossfade and more
than real motion, frames that alternate flicker every pair, and the summary counts what it says."""

from __future__ import annotations

import numpy as np
import pytest

from vgen.data.moving_scenes import MovingScenesConfig, render_moving_scenes
from vgen.eval.classifier import load_scene_judge
from vgen.eval.switching import (
    attribute_values,
    chunk_accuracy,
    cut_spike,
    flicker,
    frame_changes,
    frame_hits,
    judge_frames,
    largest_spike,
    measure_switch,
    switch_latency,
    switch_summary,
)
from vgen.models.classifier import AttributeClassifier

S = 8  # the switch frame of the synthetic streams


@pytest.fixture(scope="module")
def two_scenes() -> tuple[np.ndarray, np.ndarray]:
    """Two real moving-scene clips (16 frames, 64 px) of another shape and colour, and their attributes [2, 7]."""
    clips, _, attrs = render_moving_scenes(22, 0, 6, MovingScenesConfig(supersample=2))
    j = next(j for j in range(1, 6) if attrs[j, 0] != attrs[0, 0] and attrs[j, 1] != attrs[0, 1])
    return clips[[0, j]], attrs[[0, j]]


def test_a_stream_that_shows_a_then_b_switches_at_the_switch_frame(two_scenes):
    (a, b), attrs = two_scenes
    stream = np.concatenate([a[:S], b[S:]])
    readings = judge_frames(load_scene_judge(), stream)
    assert readings.shape == (16, 2)
    np.testing.assert_array_equal(readings[:S], np.broadcast_to(attrs[0, :2], (S, 2)))  # the judge reads A, then B
    record = measure_switch(readings, stream, attrs[1, :2], S, flicker_from=2)
    assert record["latency"] == 0 and record["flicker"]["label"] == 0.0  # frames 10..15 all read B
    assert measure_switch(readings, stream, attrs[1, :2], S)["flicker"] is None  # no frames from s + 8 on
    assert switch_latency(frame_hits(readings, attrs[0, :2]), S) is None  # A never shows again


def test_latency_counts_from_the_switch_to_two_frames_in_a_row():
    judged = np.zeros(16, bool)
    judged[[9, 12, 13, 14]] = True  # a lone frame at 9 does not count
    assert switch_latency(judged, S) == 4
    assert switch_latency(np.ones(16, bool), S) == 0 and switch_latency(judged, 13) == 0
    assert switch_latency(np.r_[np.zeros(15, bool), True], S) is None  # the last frame alone never counts


def test_a_hard_cut_spikes_more_than_a_crossfade_and_more_than_real_motion(two_scenes):
    (a, b), _ = two_scenes
    cut = np.concatenate([a[:S], b[S:]])
    weights = np.clip((np.arange(16) - S + 1) / 5, 0, 1)[:, None, None, None]  # B fades in over 4 frames from S
    fade = np.rint((1 - weights) * a + weights * b).astype(np.uint8)
    assert cut_spike(cut, S) > 2 * cut_spike(fade, S) and cut_spike(fade, S) > 1.5
    assert cut_spike(cut, S) > 4 * max(largest_spike(a), largest_spike(b))
    still = np.repeat(a[:1], 16, axis=0)  # no change before the switch: the baseline is the floor, not zero
    assert np.isfinite(cut_spike(np.concatenate([still[:S], b[S:]]), S))


def test_frame_changes_are_mean_grey_level_differences():
    frames = np.zeros((3, 4, 4, 3), np.uint8)
    frames[1] = 10
    frames[2, :2] = 10  # half the pixels return to black
    d = frame_changes(frames)
    assert np.isnan(d[0]) and d[1:] == pytest.approx([10.0, 5.0], abs=1e-3)


def test_alternating_frames_flicker_every_pair_and_steady_motion_not_at_all():
    labels = np.array([[0, 1], [2, 3]] * 8)
    ramp = np.repeat(np.arange(16, dtype=np.uint8)[:, None, None, None] * 4, 8, axis=1).repeat(8, 2).repeat(3, 3)
    f = flicker(labels, ramp, 0, 16)
    # an even brightness ramp changes by the same amount every frame
    assert f == {"label": 1.0, "pixel": pytest.approx(0.0, abs=1e-9)}
    assert flicker(np.zeros((16, 2)), ramp, 4, 12)["label"] == 0.0
    jitter = ramp.copy()
    jitter[1::2] += 2
    assert flicker(np.zeros((16, 2)), jitter, 0, 16)["pixel"] == pytest.approx(4.0, abs=1e-3)  # d: 6, 2, 6, ...
    assert flicker(labels[:, 0], ramp, 2, 5)["label"] == 1.0  # one label per frame works too


def test_the_summary_counts_switches_within_the_window():
    records = [{"latency": 0, "spike": 1.0, "flicker": {"label": 0.0, "pixel": 1.0}},
               {"latency": 6, "spike": 3.0, "flicker": {"label": 0.5, "pixel": 3.0}},
               {"latency": 7, "spike": 5.0, "flicker": None},  # t + 1 = s + 8: too late
               {"latency": None, "spike": 7.0, "flicker": None}]
    summary = switch_summary(records)
    assert summary == {"streams": 4, "within_window": 0.5, "never": 0.25, "median_latency": 6.5, "mean_spike": 4.0,
                       "median_spike": 4.0, "label_flicker": 0.25, "pixel_flicker": 2.0}
    assert switch_summary(records[2:])["median_latency"] is None


def test_readings_are_matched_against_named_attributes_and_chunks_are_scored_apart():
    wanted = attribute_values({"shape": "star", "colour": "red", "motion": "bouncing"})
    assert wanted.tolist() == [3, 0]
    hits = frame_hits(np.array([[[3, 0], [3, 1]], [[3, 0], [3, 0]]]), wanted)
    assert hits.tolist() == [[True, False], [True, True]]
    assert chunk_accuracy(np.array([[1, 1, 0, 0], [1, 0, 0, 0]]), 2) == [0.75, 0.0]


def test_judge_frames_keeps_leading_dimensions_and_resizes(tiny_scene_judge: AttributeClassifier):
    frames = np.random.default_rng(0).integers(0, 256, (2, 3, 32, 32, 3), dtype=np.uint8)
    readings = judge_frames(tiny_scene_judge, frames, names=("colour", "shape", "size"))
    assert readings.shape == (2, 3, 3)
    flat = judge_frames(tiny_scene_judge, frames.reshape(6, 32, 32, 3), names=("colour", "shape", "size"))
    np.testing.assert_array_equal(readings.reshape(6, 3), flat)


@pytest.mark.parametrize("call, message", [
    (lambda: switch_latency(np.ones(8, bool), 8), "switch_frame 8 is outside the stream's 8 frames"),
    (lambda: cut_spike(np.zeros((8, 4, 4, 3), np.uint8), 1), r"switch_frame must be in \[2, 8\)"),
    (lambda: largest_spike(np.zeros((12, 4, 4, 3), np.uint8)), "need at least 13 frames"),
    (lambda: flicker(np.zeros((8, 2)), np.zeros((8, 4, 4, 3), np.uint8), 6, 8), r"start \+ 3 <= stop"),
    (lambda: flicker(np.zeros((7, 2)), np.zeros((8, 4, 4, 3), np.uint8), 0, 8), "7 judged frames for 8 frames"),
    (lambda: attribute_values({"shape": "star"}), "do not name a value for each of"),
    (lambda: attribute_values({"shape": "blob", "colour": "red"}), "do not name a value"),
    (lambda: switch_summary([]), "no switched streams"),
])
def test_bad_input_fails_in_one_line(call, message):
    with pytest.raises(ValueError, match=message) as error:
        call()
    assert "\n" not in str(error.value)


def test_judge_frames_refuses_an_attribute_the_judge_does_not_read(tiny_scene_judge):
    with pytest.raises(ValueError, match=r"not \['motion'\]"):
        judge_frames(tiny_scene_judge, np.zeros((1, 16, 16, 3), np.uint8), names=("shape", "motion"))
