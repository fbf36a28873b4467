"""Video sets: folders of mp4 / gif, .npz (arr_0) and .npy, cut to the first frames; bad input is named."""

from __future__ import annotations

import imageio.v3 as iio
import numpy as np
import pytest

from vgen.eval.videos import load_videos


def clips(n: int = 3, t: int = 6) -> np.ndarray:
    """Blocky clips of a few flat colours (GIF's palette and mp4's codec keep them nearly exact)."""
    colours = np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 0]], np.uint8)
    out = np.zeros((n, t, 32, 48, 3), np.uint8)
    for i in range(n):
        for f in range(t):  # a bar that grows each frame (GIF writers drop repeated frames)
            out[i, f, :, : 16 + 4 * f] = colours[i % len(colours)]
    return out


def test_every_layout_loads_the_same_clips(tmp_path) -> None:
    v = clips()
    (tmp_path / "gif").mkdir(), (tmp_path / "mp4").mkdir()
    for i, clip in enumerate(v):
        iio.imwrite(tmp_path / "gif" / f"{i}.gif", clip, duration=100, loop=0)
        iio.imwrite(tmp_path / "mp4" / f"{i}.mp4", clip, fps=8)
    np.savez(tmp_path / "v.npz", arr_0=v)
    np.save(tmp_path / "v.npy", v)
    assert np.array_equal(load_videos(tmp_path / "v.npz"), v) and np.array_equal(load_videos(tmp_path / "v.npy"), v)
    assert np.array_equal(load_videos(tmp_path / "gif"), v)
    mp4 = load_videos(tmp_path / "mp4")
    assert mp4.shape == v.shape and mp4.dtype == np.uint8
    assert np.abs(mp4.astype(int) - v).mean() < 8  # lossy codec, same content
    assert np.array_equal(load_videos(tmp_path / "v.npz", num_frames=4), v[:, :4])
    assert np.array_equal(load_videos(tmp_path / "gif", num_frames=4), v[:, :4])


def test_bad_video_sets_are_named(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="video set not found"):
        load_videos(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no videos here")
    with pytest.raises(ValueError, match=r"no videos \(.mp4, .gif\) in"):
        load_videos(tmp_path / "empty")
    np.savez(tmp_path / "k.npz", videos=clips())
    with pytest.raises(ValueError, match=r"holds no 'arr_0' array of videos .*\(keys: \['videos'\]\)"):
        load_videos(tmp_path / "k.npz")
    np.save(tmp_path / "images.npy", clips()[:, 0])
    with pytest.raises(ValueError, match=r"expected uint8 videos \[N, T, H, W, 3\], got uint8 \(3, 32, 48, 3\)"):
        load_videos(tmp_path / "images.npy")
    np.savez(tmp_path / "six.npz", arr_0=clips())
    with pytest.raises(ValueError, match="six.npz has 6 frames; the evaluation needs 16 per video"):
        load_videos(tmp_path / "six.npz", num_frames=16)
    (tmp_path / "mixed").mkdir()
    iio.imwrite(tmp_path / "mixed" / "a.gif", clips(1)[0], duration=100)
    iio.imwrite(tmp_path / "mixed" / "b.gif", clips(1, t=5)[0], duration=100)
    with pytest.raises(ValueError, match=r"videos in .*mixed differ in size: 5x32x48x3 \(b.gif\), 6x32x48x3 \(a.gif\)"):
        load_videos(tmp_path / "mixed")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "x.mp4").write_bytes(b"\x00\x01 not a video")
    with pytest.raises(ValueError, match="cannot read video .*x.mp4"):
        load_videos(tmp_path / "broken")
