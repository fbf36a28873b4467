"""Moving-shapes clips: seeded, class-cycling, uint8 [T, S, S, 3], the shape moves, bounces and stays in frame."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from vgen.data.clips import (
    CLIP_PRESETS,
    SHAPES_CLIPS,
    SHAPES_CLIPS_64,
    SHAPES_CLIPS_64_LONG,
    ClipsConfig,
    _fold,
    cached_clips,
    motion,
    recorded_clips_config,
    render_clip,
    render_clips,
    sample_clip,
    shape_masks,
)
from vgen.data.shapes import NUM_CLASSES, image_rng

SMALL = ClipsConfig(num_frames=6, frame_size=16, supersample=2)


def test_same_seed_and_index_give_the_same_clip_and_others_differ():
    a, la = sample_clip(0, 3, SMALL)
    b, lb = sample_clip(0, 3, SMALL)
    c, _ = sample_clip(1, 3, SMALL)
    d, _ = sample_clip(0, 3 + NUM_CLASSES, SMALL)
    assert la == lb == 3
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c) and not np.array_equal(a, d)


def test_default_clips_are_16_frames_of_32px_rgb_uint8_and_classes_cycle():
    clips, labels = render_clips(0, 5, NUM_CLASSES)
    assert clips.shape == (NUM_CLASSES, 16, 32, 32, 3) and clips.dtype == np.uint8
    assert clips.min() >= 0 and clips.max() <= 255 and clips.std() > 10
    np.testing.assert_array_equal(labels, (5 + np.arange(NUM_CLASSES)) % NUM_CLASSES)
    np.testing.assert_array_equal(clips[2], sample_clip(0, 7)[0])


def test_fold_is_an_elastic_bounce_between_the_walls():
    x = np.array([0.5, 1.0, 1.5, 2.0, 2.5, 3.0, -0.5])
    np.testing.assert_allclose(_fold(x, 0.0, 1.0), [0.5, 1.0, 0.5, 0.0, 0.5, 1.0, 0.5])


@pytest.mark.parametrize("index", range(NUM_CLASSES))
def test_the_shape_moves_and_stays_whole_in_frame(index):
    cfg = ClipsConfig()
    clip, label = sample_clip(4, index, cfg)
    fill, _ = shape_masks(label, motion(image_rng(4, index), cfg), cfg)  # the clip's own trajectory
    # nothing of the shape on the border pixels, and a constant area (never clipped by the frame)
    assert fill[:, 0].max() < 0.05 and fill[:, -1].max() < 0.05
    assert fill[:, :, 0].max() < 0.05 and fill[:, :, -1].max() < 0.05
    area = fill.sum((1, 2))
    assert area.min() > 0.85 * area.max()
    # it moves: every consecutive pair of frames differs where the shape is, and its centre of mass travels
    diffs = np.abs(np.diff(clip.astype(np.int16), axis=0)).mean((1, 2, 3))
    assert (diffs > 0.5).all()
    ys, xs = np.mgrid[0:cfg.frame_size, 0:cfg.frame_size]
    com = np.stack([(fill * xs).sum((1, 2)), (fill * ys).sum((1, 2))], 1) / area[:, None]
    assert np.linalg.norm(np.diff(com, axis=0), axis=1).sum() > 0.03 * cfg.frame_size * (cfg.num_frames - 1) * 0.8


def test_motion_bounces_off_the_borders():
    cfg = ClipsConfig(num_frames=64, min_speed=0.1, max_speed=0.1)
    mo = motion(np.random.default_rng(0), cfg)
    lo, hi = 1.15 * mo.radius + 1, cfg.frame_size - 1.15 * mo.radius - 1
    assert (mo.centres >= lo - 1e-9).all() and (mo.centres <= hi + 1e-9).all()
    step = np.diff(mo.centres, axis=0)
    # a constant speed of 3.2 px per frame over 64 frames must reverse direction on some axis
    assert ((np.sign(step[1:]) * np.sign(step[:-1])) < 0).any()
    np.testing.assert_allclose(np.diff(mo.angles, 2), 0, atol=1e-9)  # constant spin


def test_cached_clips_render_once_then_memory_map(tmp_path):
    a, la = cached_clips(tmp_path, "val", 3, SMALL)
    b, lb = cached_clips(tmp_path, "val", 2, SMALL)
    np.testing.assert_array_equal(a[:2], b)
    np.testing.assert_array_equal(la[:2], lb)
    assert isinstance(b, np.memmap) or isinstance(b.base, np.memmap)
    np.testing.assert_array_equal(a, render_clips(11, 0, 3, SMALL)[0])
    with pytest.raises(ValueError, match="holds clips rendered with"):
        cached_clips(tmp_path, "val", 2, ClipsConfig())
    with pytest.raises(ValueError, match="unknown split 'nope'"):
        cached_clips(tmp_path, "nope", 2, SMALL)


def test_a_cache_renders_in_parallel_the_clips_of_a_serial_render_with_progress(tmp_path, capsys):
    clips, labels = cached_clips(tmp_path, "val", 5, SMALL, workers=2, chunk=2)
    assert "render clips (val)" in capsys.readouterr().err
    serial_clips, serial_labels = render_clips(11, 0, 5, SMALL)
    np.testing.assert_array_equal(clips, serial_clips)
    np.testing.assert_array_equal(labels, serial_labels)


def test_a_folder_reports_the_config_its_clips_were_rendered_with(tmp_path):
    assert recorded_clips_config(tmp_path) == SHAPES_CLIPS
    assert recorded_clips_config(tmp_path, SMALL) == SMALL  # nothing rendered yet: the default asked for
    cached_clips(tmp_path, "val", 1, SMALL)
    assert recorded_clips_config(tmp_path) == SMALL


def test_the_presets_are_16_frames_of_32px_and_8_or_16_frames_of_64px():
    """The 64-px preset is the shapes images' frame (16 x 16 codes of the image tokenizer, 2,048 a clip)."""
    assert CLIP_PRESETS == {"32px": SHAPES_CLIPS, "64px": SHAPES_CLIPS_64, "64px-16f": SHAPES_CLIPS_64_LONG}
    assert replace(SHAPES_CLIPS_64, num_frames=16) == SHAPES_CLIPS_64_LONG
    assert (SHAPES_CLIPS.num_frames, SHAPES_CLIPS.frame_size) == (16, 32)
    assert (SHAPES_CLIPS_64.num_frames, SHAPES_CLIPS_64.frame_size) == (8, 64)
    clip, _ = sample_clip(0, 3, SHAPES_CLIPS_64)
    assert clip.shape == (8, 64, 64, 3)


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_frames=1), "num_frames must be >= 2"),
    (dict(frame_size=8), "frame_size must be >= 16"),
    (dict(max_scale=0.9), r"max_scale <= \(1 - 4 / frame_size\) / 1.15"),
    (dict(min_speed=0.0), "0 < min_speed <= max_speed"),
    (dict(max_spin=-1.0), "max_spin must be >= 0"),
    (dict(background="noise"), "background must be one of"),
])
def test_bad_config_raises_a_specific_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ClipsConfig(**kwargs)


def test_bad_class_index_or_range_raises():
    with pytest.raises(ValueError, match=r"class_id must be in \[0, 8\)"):
        render_clip(NUM_CLASSES, np.random.default_rng(0), SMALL)
    with pytest.raises(ValueError, match="index must be >= 0"):
        sample_clip(0, -1, SMALL)
    with pytest.raises(ValueError, match="start and count must be >= 0"):
        render_clips(0, 0, -2, SMALL)
