"""Writing videos: uint8 frames [T, H, W, 3] as ``.mp4`` (H.264 through the ffmpeg binary that imageio-ffmpeg
ships), ``.gif`` (looping) or a frame-grid ``.png`` (frames tiled row-major with :func:`vgen.images.image_grid`).
:func:`vgen.eval.videos.read_video` reads the first two back.

:class:`StreamingVideoWriter` appends frames as they arrive. Its mp4 is fragmented (an empty ``moov`` up front,
then a fragment per keyframe interval), so a file cut short by Ctrl-C, a crash or a kill is still playable up to
its last complete fragment; a GIF is written when the writer closes, which ``with`` does on any exception."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from PIL import Image

from vgen.images import image_grid

VIDEO_FORMATS = (".mp4", ".gif", ".png")


def check_video_path(path: str | Path) -> Path:
    """``path`` as a Path if its extension is a supported video output, else a ValueError naming the formats."""
    path = Path(path)
    if path.suffix.lower() not in VIDEO_FORMATS:
        raise ValueError(f"unsupported video output {path.name!r}: the extension must be one of "
                         f"{', '.join(VIDEO_FORMATS)}")
    return path


def frame_grid(frames: np.ndarray, cols: int | None = None) -> Image.Image:
    """The frames tiled row-major into one picture, ``cols`` per row (about square by default)."""
    frames = _check_frames(frames)
    cols = cols or math.ceil(math.sqrt(len(frames)))
    if cols < 1:
        raise ValueError(f"cols must be >= 1, got {cols}")
    return image_grid([Image.fromarray(f) for f in frames], cols)


def write_video(frames: np.ndarray, path: str | Path, fps: int = 8) -> Path:
    """Write ``frames`` (uint8 [T, H, W, 3]) to ``path``; its extension picks the format. Returns the path.

    mp4 frames must have even sides (yuv420p); mp4 is lossy, GIF is exact below 256 colours per frame.
    """
    path = check_video_path(path)
    frames = _check_frames(frames)
    if not fps > 0:
        raise ValueError(f"fps must be > 0, got {fps}")
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix.lower()
    if suffix == ".png":
        frame_grid(frames).save(path)
        return path
    import imageio.v3 as iio

    if suffix == ".gif":
        iio.imwrite(path, frames, extension=".gif", duration=1000 / fps, loop=0)
    else:
        if frames.shape[1] % 2 or frames.shape[2] % 2:
            raise ValueError(f"mp4 needs even frame sides, got {frames.shape[2]}x{frames.shape[1]}; "
                             f"write a .gif or .png instead")
        # macro_block_size 1: keep the frame size (imageio would otherwise resize to multiples of 16)
        iio.imwrite(path, frames, extension=".mp4", fps=fps, macro_block_size=1)
    return path


class StreamingVideoWriter:
    """Append uint8 frames [T, H, W, 3] to an ``.mp4`` (fragmented, flushed every ``keyframe_every`` frames) or a
    ``.gif`` (written on :meth:`close`). Use it as a context manager so that an interrupted stream still closes it.
    """

    def __init__(self, path: str | Path, fps: int = 8, keyframe_every: int | None = None) -> None:
        self.path = check_video_path(path)
        if self.path.suffix.lower() == ".png":
            raise ValueError("a stream is written to .mp4 or .gif, not to a frame-grid .png")
        if not fps > 0:
            raise ValueError(f"fps must be > 0, got {fps}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "ab"):  # fail now, with the path, if it cannot be written
            pass
        self.fps, self.keyframe_every = fps, keyframe_every or fps
        self.frames_written = 0
        self._ffmpeg = None
        self._gif_frames: list[np.ndarray] = []

    def write(self, frames: np.ndarray) -> None:
        frames = _check_frames(frames)
        if self.path.suffix.lower() == ".gif":
            self._gif_frames.extend(frames)
        else:
            if self._ffmpeg is None:
                self._ffmpeg = self._open_mp4(frames.shape[2], frames.shape[1])
            for frame in frames:
                self._ffmpeg.send(np.ascontiguousarray(frame))
        self.frames_written += len(frames)

    def _open_mp4(self, width: int, height: int):
        import imageio_ffmpeg

        if width % 2 or height % 2:
            raise ValueError(f"mp4 needs even frame sides, got {width}x{height}; write a .gif instead")
        writer = imageio_ffmpeg.write_frames(
            str(self.path), (width, height), fps=self.fps, codec="libx264", pix_fmt_out="yuv420p",
            macro_block_size=1, ffmpeg_log_level="error",
            # zerolatency: no look-ahead or B-frames, so ffmpeg holds no frames back that a kill would lose
            output_params=["-tune", "zerolatency", "-g", str(self.keyframe_every),
                           "-movflags", "frag_keyframe+empty_moov+default_base_moof", "-flush_packets", "1"])
        writer.send(None)  # start ffmpeg
        return writer

    def close(self) -> None:
        if self._ffmpeg is not None:
            self._ffmpeg.close()
            self._ffmpeg = None
        if self._gif_frames:
            write_video(np.stack(self._gif_frames), self.path, self.fps)
            self._gif_frames = []
        if self.frames_written == 0 and self.path.is_file() and self.path.stat().st_size == 0:
            self.path.unlink()  # nothing was generated: leave no empty, unplayable file behind

    def __enter__(self) -> StreamingVideoWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_frames(frames: np.ndarray) -> np.ndarray:
    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or len(frames) < 1:
        raise ValueError(f"frames must be uint8 [T, H, W, 3] with T >= 1, got {frames.dtype} of shape "
                         f"{tuple(frames.shape)}")
    return frames
