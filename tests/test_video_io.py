"""Video output: mp4, GIF and frame-grid PNG round-trip through the FVD reader; bad input is refused by name."""

from __future__ import annotations

import time

import numpy as np
import pytest
from PIL import Image

from vgen.data.clips import ClipsConfig, sample_clip
from vgen.eval.videos import read_video
from vgen.video_io import VIDEO_FORMATS, StreamingVideoWriter, check_video_path, frame_grid, write_video


@pytest.fixture(scope="module")
def clip():
    return sample_clip(0, 3, ClipsConfig(num_frames=6, frame_size=32))[0]


def test_gif_round_trips_frame_for_frame(tmp_path, clip):
    path = write_video(clip, tmp_path / "c.gif", fps=8)
    back = read_video(path)
    assert back.shape == clip.shape and back.dtype == np.uint8
    # GIF quantises each frame to a 256-colour palette: close, not bit-exact, on smooth gradients
    assert np.abs(back.astype(int) - clip.astype(int)).mean() < 3


def test_mp4_round_trips_with_the_same_frame_count_and_size(tmp_path, clip):
    path = write_video(clip, tmp_path / "sub" / "c.mp4", fps=8)
    back = read_video(path)
    assert back.shape == clip.shape
    assert np.abs(back.astype(int) - clip.astype(int)).mean() < 12  # lossy H.264 at 32 px, yet the same clip
    other = sample_clip(0, 4, ClipsConfig(num_frames=6, frame_size=32))[0]
    assert np.abs(back.astype(int) - other.astype(int)).mean() > 2 * np.abs(back.astype(int) - clip.astype(int)).mean()


def test_png_is_the_frame_grid_exactly(tmp_path, clip):
    path = write_video(clip, tmp_path / "c.png")
    grid = np.asarray(Image.open(path).convert("RGB"))
    assert grid.shape == (2 * 32, 3 * 32, 3)  # 6 frames -> ceil(sqrt(6)) = 3 columns, 2 rows
    for t in range(6):
        r, c = divmod(t, 3)
        np.testing.assert_array_equal(grid[32 * r:32 * r + 32, 32 * c:32 * c + 32], clip[t])
    np.testing.assert_array_equal(np.asarray(frame_grid(clip, cols=6))[:, 32:64], clip[1])


def test_unsupported_extension_names_the_supported_ones(tmp_path, clip):
    assert VIDEO_FORMATS == (".mp4", ".gif", ".png")
    with pytest.raises(ValueError, match=r"'c\.avi'.*\.mp4, \.gif, \.png"):
        write_video(clip, tmp_path / "c.avi")
    with pytest.raises(ValueError, match="extension must be one of"):
        check_video_path("clip")
    assert not (tmp_path / "c.avi").exists()


@pytest.mark.parametrize("frames, message", [
    (np.zeros((4, 8, 8, 3), np.float32), "uint8"),
    (np.zeros((8, 8, 3), np.uint8), r"\[T, H, W, 3\]"),
    (np.zeros((0, 8, 8, 3), np.uint8), "T >= 1"),
])
def test_bad_frames_raise(tmp_path, frames, message):
    with pytest.raises(ValueError, match=message):
        write_video(frames, tmp_path / "x.gif")


def test_mp4_with_odd_sides_and_bad_fps_raise(tmp_path):
    with pytest.raises(ValueError, match="mp4 needs even frame sides"):
        write_video(np.zeros((2, 9, 8, 3), np.uint8), tmp_path / "x.mp4")
    with pytest.raises(ValueError, match="fps must be > 0"):
        write_video(np.zeros((2, 8, 8, 3), np.uint8), tmp_path / "x.gif", fps=0)


@pytest.mark.parametrize("suffix", [".mp4", ".gif"])
def test_streaming_writer_appends_blocks_into_one_video(tmp_path, clip, suffix):
    path = tmp_path / f"s{suffix}"
    with StreamingVideoWriter(path, fps=8, keyframe_every=2) as writer:
        for start in range(0, len(clip), 2):
            writer.write(clip[start:start + 2])
    back = read_video(path)
    assert back.shape == clip.shape and writer.frames_written == len(clip)
    assert np.abs(back.astype(int) - clip.astype(int)).mean() < 8  # lossy codecs: close, not exact


def test_streaming_mp4_is_playable_before_it_is_closed(tmp_path, clip):
    path = tmp_path / "open.mp4"
    writer = StreamingVideoWriter(path, fps=8, keyframe_every=2)
    for _ in range(20):
        writer.write(clip)
    deadline = time.time() + 20
    while time.time() < deadline and path.stat().st_size < 2000:
        time.sleep(0.1)
    assert read_video(path).shape[0] > 0  # fragments already on disk play while the writer is still open
    writer.close()
    assert read_video(path).shape[0] == 20 * len(clip)


def test_streaming_writer_refuses_png_and_leaves_no_empty_file(tmp_path):
    with pytest.raises(ValueError, match=".mp4 or .gif"):
        StreamingVideoWriter(tmp_path / "x.png")
    with StreamingVideoWriter(tmp_path / "none.mp4"):
        pass
    assert not (tmp_path / "none.mp4").exists()
