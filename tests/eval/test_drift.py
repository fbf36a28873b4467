"""Long-video metrics: VDE by its formula, clarity that falls with blur, per-chunk class measures from the domain
classifier on real clips, and FVD windows."""

from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image, ImageFilter

from vgen.data.clips import render_clips
from vgen.eval.drift import chunk_measures, clarity, drift_report, vde, windows


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


def test_windows_cut_long_videos_into_training_length_clips() -> None:
    videos = np.arange(2 * 10).reshape(2, 10)[..., None, None, None].repeat(2, -1)
    cut = windows(videos, 4)
    assert cut.shape == (4, 4, 1, 1, 2)  # two windows per video: frames 0-3 and 4-7
    assert cut[:, 0, 0, 0, 0].tolist() == [0, 10, 4, 14]
    assert windows(videos, 4, stride=2).shape[0] == 2 * 4
    with pytest.raises(ValueError, match="cannot cut"):
        windows(videos, 11)
