"""Long-video metrics: VDE by its formula, clarity that falls with blur, per-chunk class measures from the domain
classifier on real clips, the texture-collapse check on real and streamed frames, and FVD windows."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFilter

from vgen.data.clips import SHAPES_CLIPS, SHAPES_CLIPS_64, render_clips
from vgen.eval.drift import (
    TEXTURE_LEVEL,
    background_texture,
    chunk_measures,
    clarity,
    clip_collapse,
    drift_report,
    texture_frames,
    vde,
    windows,
)

STREAMED_FRAMES = Path(__file__).parent / "data" / "streamed_frames.png"  # how they were made: data/README.md


def test_vde_is_zero_without_drift_and_follows_the_weighted_formula() -> None:
    assert vde([2.0, 2.0, 2.0, 2.0]) == 0.0
    # N = 3: w_2 = 2, w_3 = 1 (linear); log(2), log(1) = 0 (log)
    assert vde([2.0, 1.0, 3.0]) == pytest.approx(2 * 0.5 + 1 * 0.5)
    assert vde([2.0, 1.0, 3.0], "log") == pytest.approx(math.log(2) * 0.5)
    with pytest.raises(ValueError, match="weighting"):
        vde([1.0, 2.0], "square")
    with pytest.raises(ValueError, match="at least 2 chunks"):
        vde([1.0])
    with pytest.raises(ValueError, match="undefined"):
        vde([0.0, 1.0])


def test_clarity_falls_when_frames_are_blurred() -> None:
    clips, _ = render_clips(11, 0, 1)
    sharp = clips[0]
    blurred = np.stack([np.asarray(Image.fromarray(f).filter(ImageFilter.GaussianBlur(1.5))) for f in sharp])
    assert clarity(blurred) < 0.6 * clarity(sharp)


def test_real_clips_are_recognised_chunk_by_chunk_and_a_blurred_ending_is_drift() -> None:
    clips, labels = render_clips(11, 0, 4)
    long = np.concatenate([clips, clips], axis=1)  # 32 frames, 4 chunks of 8
    report = drift_report(long, labels.tolist(), chunks=4)
    assert np.mean(report["accuracy"]["per_chunk"]) > 0.85
    assert report["clarity"]["vde_linear"] < 0.1  # different frames, same sharpness
    faded = long.copy()
    faded[:, 24:] = np.stack([[np.asarray(Image.fromarray(f).filter(ImageFilter.GaussianBlur(2))) for f in v[24:]]
                              for v in long])
    drifted = drift_report(faded, labels.tolist(), chunks=4)
    assert drifted["clarity"]["vde_linear"] > 0.3 + report["clarity"]["vde_linear"]
    with pytest.raises(ValueError, match="chunks"):
        chunk_measures(long[0], 0, chunks=40)


@pytest.mark.parametrize("clips", [SHAPES_CLIPS, SHAPES_CLIPS_64], ids=["32px", "64px"])
def test_no_real_frame_reads_as_texture_and_a_textured_background_does(clips) -> None:
    real, _ = render_clips(5, 0, 16, clips)
    frames = real.reshape(-1, *real.shape[2:])
    assert background_texture(frames).max() < TEXTURE_LEVEL / 4
    rng = np.random.default_rng(0)
    stripes = (np.arange(clips.frame_size) % 4 < 2)[None, None, :, None] * 60  # vertical bars, 4 px period
    noisy = np.clip(frames + stripes + rng.normal(0, 12, frames.shape), 0, 255).astype(np.uint8)
    assert texture_frames(noisy).all()
    assert not texture_frames(frames).any()


def test_streamed_frames_that_dissolved_into_texture_are_caught_and_sound_ones_pass() -> None:
    strip = np.asarray(Image.open(STREAMED_FRAMES).convert("RGB"))
    frames = np.stack(np.split(strip, strip.shape[1] // strip.shape[0], axis=1))
    assert texture_frames(frames).tolist() == [True] * 3 + [False] * 4


def test_a_video_collapses_when_half_of_a_chunk_is_texture() -> None:
    clips, labels = render_clips(11, 0, 2, SHAPES_CLIPS_64)
    long = np.concatenate([clips, clips], axis=1)  # 16 frames, 4 chunks of 4
    assert drift_report(long, labels.tolist(), chunks=4)["collapsed"] == 0.0
    broken = long.copy()
    broken[1, 12:14] = np.random.default_rng(1).integers(0, 256, broken[1, 12:14].shape)  # half the last chunk
    report = drift_report(broken, labels.tolist(), chunks=4)
    assert report["collapsed"] == 0.5  # one of the two videos
    assert report["texture"]["per_chunk"] == [0.0, 0.0, 0.0, 0.25]
    assert chunk_measures(broken[1], int(labels[1]), chunks=4)["texture"] == [0.0, 0.0, 0.0, 0.5]


def test_clips_judged_whole_collapse_by_8_frame_chunks() -> None:
    clips, _ = render_clips(3, 0, 4, SHAPES_CLIPS_64)
    clips = np.concatenate([clips, clips], axis=1)  # 16 frames: two chunks of 8
    assert clip_collapse(clips) == {"texture_frames": 0.0, "collapsed": 0.0}
    noise = np.random.default_rng(2).integers(0, 256, clips.shape, dtype=np.uint8)
    clips[0, 12:16] = noise[0, 12:16]  # half the second chunk: collapses
    clips[1, 5:8], clips[1, 8:11] = noise[1, 5:8], noise[1, 8:11]  # 6 frames, but 3 of 8 in each chunk: holds
    assert clip_collapse(clips) == {"texture_frames": 10 / 64, "collapsed": 0.25}
    assert clip_collapse(clips[:, 10:14])["collapsed"] == 0.25  # a 4-frame clip is one chunk: clip 0 is 2 of 4


def test_windows_cut_long_videos_into_training_length_clips() -> None:
    videos = np.arange(2 * 10).reshape(2, 10)[..., None, None, None].repeat(2, -1)
    cut = windows(videos, 4)
    assert cut.shape == (4, 4, 1, 1, 2)  # two windows per video: frames 0-3 and 4-7
    assert cut[:, 0, 0, 0, 0].tolist() == [0, 10, 4, 14]
    assert windows(videos, 4, stride=2).shape[0] == 2 * 4
    with pytest.raises(ValueError, match="cannot cut"):
        windows(videos, 11)
