"""Quality over long videos: per-chunk measures and their drift (LV-Bench's Video Drift Error), plus FVD of
fixed-length windows against real clips, all in vgen's offline domain features.

A long video is cut into ``N`` equal chunks (LV-Bench uses 10). For each chunk ``m_i`` is a quality measure and

    VDE = sum_{i=2..N} w_i * |m_i - m_1| / m_1,   w_i = N - i + 1 (linear) or log(N - i + 1) (log),

the weighted relative change from the first chunk (0 for a video whose quality never drifts). The measures here:

- ``clarity``: mean absolute Laplacian of the luma (sharpness; blur and washed-out frames lower it);
- ``subject``: the domain classifier's probability of the requested class, averaged over the chunk's frames (the
  shape keeps its identity);
- ``accuracy``: the fraction of the chunk's frames classified as the requested class;
- ``texture``: the fraction of the chunk's frames that have collapsed into texture (:func:`texture_frames`).

A video *collapses* when at least half the frames of one of its chunks are texture frames.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from vgen.eval.classifier import load_shapes_classifier
from vgen.eval.features import classifier_input

WEIGHTINGS = ("linear", "log")


def vde(values: Sequence[float], weighting: str = "linear") -> float:
    """Video Drift Error of per-chunk measures ``values`` (first chunk as the reference)."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    m = np.asarray(values, dtype=np.float64)
    if m.ndim != 1 or len(m) < 2:
        raise ValueError(f"need the measures of at least 2 chunks, got {m.shape}")
    if m[0] == 0:
        raise ValueError("the first chunk's measure is 0: drift relative to it is undefined")
    n = len(m)
    i = np.arange(2, n + 1)
    w = (n - i + 1).astype(np.float64) if weighting == "linear" else np.log(n - i + 1)
    return float(np.sum(w * np.abs(m[1:] - m[0]) / abs(m[0])))


TEXTURE_LEVEL = 8.0  # grey levels; the real clips stay below 1.0 at 64 px and 1.7 at 32 px
COLLAPSED_SHARE = 0.5  # of one chunk's frames
CLIP_CHUNK_FRAMES = 8  # chunk length for clips judged whole (vgen quality): one second at 8 fps


def luma_laplacian(frames: np.ndarray) -> np.ndarray:
    """Absolute 4-neighbour Laplacian [T, H - 2, W - 2] of the luma of uint8 frames [T, H, W, 3], in grey levels."""
    luma = frames.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    return np.abs(4 * luma[:, 1:-1, 1:-1] - luma[:, :-2, 1:-1] - luma[:, 2:, 1:-1] - luma[:, 1:-1, :-2]
                  - luma[:, 1:-1, 2:])


def clarity(frames: np.ndarray) -> float:
    """Mean absolute 4-neighbour Laplacian of the luma of uint8 frames [T, H, W, 3] (in grey levels)."""
    return float(luma_laplacian(frames).mean())


def background_texture(frames: np.ndarray) -> np.ndarray:
    """Per frame of uint8 frames [T, H, W, 3]: the median absolute Laplacian of the luma over the outer ring of
    the frame (``H // 16`` pixels wide, at least 2). The data's backgrounds are smooth gradients and its shape
    covers at most part of the ring, so the median reads the background alone: about 0.6 grey levels on real
    frames, 1-7 on a blurry but sound generated frame, 10-24 on a frame that has dissolved into stripes or
    noise."""
    lap = luma_laplacian(frames)
    width = max(2, frames.shape[1] // 16) - 1  # the Laplacian drops the outermost pixel
    ring = np.zeros(lap.shape[1:], dtype=bool)
    ring[:width], ring[-width:], ring[:, :width], ring[:, -width:] = True, True, True, True
    return np.median(lap[:, ring], axis=1)


def texture_frames(frames: np.ndarray, level: float = TEXTURE_LEVEL) -> np.ndarray:
    """Which of uint8 frames [T, H, W, 3] have collapsed into texture: background texture above ``level``."""
    return background_texture(frames) > level


@torch.no_grad()
def class_probabilities(frames: np.ndarray, batch_size: int = 256) -> np.ndarray:
    """The shipped domain classifier's class probabilities [T, C] of uint8 frames [T, H, W, 3] (resized to its
    input size; on the moving-shapes clips' 32-px frames it is 95.7% accurate, see docs/streaming.md)."""
    classifier = load_shapes_classifier().eval()
    out = [classifier(classifier_input(frames[i:i + batch_size], classifier)).softmax(-1).numpy()
           for i in range(0, len(frames), batch_size)]
    return np.concatenate(out)


def chunk_bounds(frames: int, chunks: int) -> list[tuple[int, int]]:
    """(start, stop) of ``chunks`` equal chunks of ``frames`` frames (lengths differ by at most one)."""
    if chunks < 1 or frames < chunks:
        raise ValueError(f"need 1 <= chunks <= frames, got {chunks} chunks of a {frames}-frame video")
    bounds = [round(k * frames / chunks) for k in range(chunks + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def collapses(texture_per_chunk: np.ndarray) -> np.ndarray:
    """Which videos collapse, from their shares of texture frames per chunk [..., chunks]."""
    return (np.asarray(texture_per_chunk) >= COLLAPSED_SHARE).any(-1)


def clip_collapse(videos: np.ndarray) -> dict[str, float]:
    """``texture_frames`` (share of all frames) and ``collapsed`` (share of clips) of clips uint8 [N, T, H, W, 3],
    in chunks of :data:`CLIP_CHUNK_FRAMES` (a shorter clip is one chunk)."""
    n, t = videos.shape[:2]
    texture = texture_frames(np.ascontiguousarray(videos).reshape(n * t, *videos.shape[2:])).reshape(n, t)
    bounds = chunk_bounds(t, max(1, t // CLIP_CHUNK_FRAMES))
    per_chunk = np.stack([texture[:, a:b].mean(1) for a, b in bounds], 1)
    return {"texture_frames": float(texture.mean()), "collapsed": float(collapses(per_chunk).mean())}


def chunk_measures(video: np.ndarray, class_id: int, chunks: int = 10) -> dict[str, list[float]]:
    """``clarity``, ``subject``, ``accuracy`` and ``texture`` of each of ``chunks`` equal chunks of one video
    [T, H, W, 3]."""
    bounds = chunk_bounds(len(video), chunks)
    probs = class_probabilities(video)
    texture = texture_frames(video)
    out: dict[str, list[float]] = {"clarity": [], "subject": [], "accuracy": [], "texture": []}
    for a, b in bounds:
        out["clarity"].append(clarity(video[a:b]))
        out["subject"].append(float(probs[a:b, class_id].mean()))
        out["accuracy"].append(float((probs[a:b].argmax(-1) == class_id).mean()))
        out["texture"].append(float(texture[a:b].mean()))
    return out


def drift_report(videos: np.ndarray, class_ids: Sequence[int], chunks: int = 10) -> dict:
    """Per-chunk means over ``videos`` [N, T, H, W, 3], the mean VDE (linear and log) of each quality measure,
    the per-chunk share of texture frames and the share of videos that collapse."""
    per_video = [chunk_measures(v, int(c), chunks) for v, c in zip(videos, class_ids)]
    report: dict = {"chunks": chunks, "frames": int(videos.shape[1]), "videos": len(videos)}
    for name in ("clarity", "subject", "accuracy"):
        rows = np.array([m[name] for m in per_video])
        report[name] = {"per_chunk": rows.mean(0).tolist(),
                        **{f"vde_{w}": float(np.mean([vde(r, w) if r[0] else math.nan for r in rows]))
                           for w in WEIGHTINGS}}
    texture = np.array([m["texture"] for m in per_video])
    report["texture"] = {"per_chunk": texture.mean(0).tolist()}
    report["collapsed"] = float(collapses(texture).mean())
    return report


def windows(videos: np.ndarray, length: int, stride: int | None = None) -> np.ndarray:
    """Every ``length``-frame window (``stride`` apart, default ``length``) of videos [N, T, ...] -> [M, length, ...]:
    long streams become clips that FVD compares with real ones of the training length."""
    stride = stride or length
    if length < 1 or stride < 1 or videos.shape[1] < length:
        raise ValueError(f"cannot cut {length}-frame windows (stride {stride}) from {videos.shape[1]}-frame videos")
    starts = range(0, videos.shape[1] - length + 1, stride)
    return np.concatenate([videos[:, s:s + length] for s in starts])
