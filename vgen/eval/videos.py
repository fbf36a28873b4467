"""Video sets for FVD: uint8 RGB clips [N, T, H, W, 3].

A video set is a folder of ``.mp4`` / ``.gif`` files (sorted by name; read with imageio, whose ffmpeg binary ships
with imageio-ffmpeg), an ``.npz`` holding ``arr_0`` [N, T, H, W, 3] uint8, or an ``.npy`` of that array. With
``num_frames``, every clip is cut to its first ``num_frames`` frames (FVD's protocol uses 16); a shorter clip is an
error rather than a silently shorter evaluation.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vgen.eval.features import check_array, list_folder, load_array, same_shapes

VIDEO_SUFFIXES = (".mp4", ".gif")


def read_video(path: Path) -> np.ndarray:
    """uint8 [T, H, W, 3] frames of one file (a GIF's alpha channel is dropped)."""
    import imageio.v3 as iio

    try:
        frames = np.asarray(iio.imread(path, index=None))
    except Exception as e:  # imageio raises OSError, ValueError or plugin errors for broken files
        raise ValueError(f"cannot read video {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
    if frames.ndim == 3:  # a single-frame GIF or greyscale frames
        frames = frames[None] if frames.shape[-1] in (3, 4) else frames[..., None].repeat(3, -1)
    return check_array(frames[..., :3], 4, path, "frames [T, H, W, 3]")


def load_videos(path: str | Path, num_frames: int | None = None) -> np.ndarray:
    """uint8 videos [N, T, H, W, 3] from a folder of mp4/gif, an ``.npz`` (``arr_0``) or an ``.npy``."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"video set not found: {path}")
    if path.is_dir():
        files = list_folder(path, VIDEO_SUFFIXES, "videos")
        videos = [_cut(read_video(f), num_frames, f) for f in files]
        return same_shapes(videos, files, path, "videos")
    videos = load_array(path, 5, "videos [N, T, H, W, 3]")
    return videos if num_frames is None else _cut(videos.swapaxes(0, 1), num_frames, path).swapaxes(0, 1)


def _cut(frames: np.ndarray, num_frames: int | None, source: Path) -> np.ndarray:
    """The first ``num_frames`` of frames [T, ...]."""
    if num_frames is None:
        return frames
    if len(frames) < num_frames:
        raise ValueError(f"{source} has {len(frames)} frames; the evaluation needs {num_frames} per video")
    return frames[:num_frames]
