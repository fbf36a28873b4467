"""Quality over long videos: per-chunk measures and their drift (LV-Bench's Video Drift Error), plus FVD of
fixed-length windows against real clips, all in vgen's offline domain features.

A long video is cut into ``N`` equal chunks (LV-Bench uses 10). For each chunk ``m_i`` is a quality measure and

    VDE = sum_{i=2..N} w_i * |m_i - m_1| / m_1,   w_i = N - i + 1 (linear) or log(N - i + 1) (log),

the weighted relative change from the first chunk (0 for a video whose quality never drifts). The measures here:

- ``clarity``: mean absolute Laplacian of the luma (sharpness; blur and washed-out frames lower it);
- ``subject``: the domain classifier's probability of the requested class, averaged over the chunk's frames (the
  shape keeps its identity);
- ``accuracy``: the fraction of the chunk's frames classified as the requested class.
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


def clarity(frames: np.ndarray) -> float:
    """Mean absolute 4-neighbour Laplacian of the luma of uint8 frames [T, H, W, 3] (in grey levels)."""
    luma = frames.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    lap = (4 * luma[:, 1:-1, 1:-1] - luma[:, :-2, 1:-1] - luma[:, 2:, 1:-1] - luma[:, 1:-1, :-2] - luma[:, 1:-1, 2:])
    return float(np.abs(lap).mean())


@torch.no_grad()
def class_probabilities(frames: np.ndarray, batch_size: int = 256) -> np.ndarray:
    """The shipped domain classifier's class probabilities [T, C] of uint8 frames [T, H, W, 3] (resized to its
    input size; on the moving-shapes clips' 32-px frames it is 95.7% accurate, see docs/streaming.md)."""
    classifier = load_shapes_classifier().eval()
    out = [classifier(classifier_input(frames[i:i + batch_size], classifier)).softmax(-1).numpy()
           for i in range(0, len(frames), batch_size)]
    return np.concatenate(out)


def chunk_measures(video: np.ndarray, class_id: int, chunks: int = 10) -> dict[str, list[float]]:
    """``clarity``, ``subject`` and ``accuracy`` of each of ``chunks`` equal chunks of one video [T, H, W, 3]."""
    if chunks < 2 or len(video) < chunks:
        raise ValueError(f"need 2 <= chunks <= frames, got {chunks} chunks of a {len(video)}-frame video")
    probs = class_probabilities(video)
    bounds = [round(k * len(video) / chunks) for k in range(chunks + 1)]
    out: dict[str, list[float]] = {"clarity": [], "subject": [], "accuracy": []}
    for a, b in zip(bounds[:-1], bounds[1:]):
        out["clarity"].append(clarity(video[a:b]))
        out["subject"].append(float(probs[a:b, class_id].mean()))
        out["accuracy"].append(float((probs[a:b].argmax(-1) == class_id).mean()))
    return out


def drift_report(videos: np.ndarray, class_ids: Sequence[int], chunks: int = 10) -> dict:
    """Per-chunk means over ``videos`` [N, T, H, W, 3] and the mean VDE (linear and log) of each measure."""
    per_video = [chunk_measures(v, int(c), chunks) for v, c in zip(videos, class_ids)]
    report: dict = {"chunks": chunks, "frames": int(videos.shape[1]), "videos": len(videos)}
    for name in ("clarity", "subject", "accuracy"):
        rows = np.array([m[name] for m in per_video])
        report[name] = {"per_chunk": rows.mean(0).tolist(),
                        **{f"vde_{w}": float(np.mean([vde(r, w) if r[0] else math.nan for r in rows]))
                           for w in WEIGHTINGS}}
    return report


def windows(videos: np.ndarray, length: int, stride: int | None = None) -> np.ndarray:
    """Every ``length``-frame window (``stride`` apart, default ``length``) of videos [N, T, ...] -> [M, length, ...]:
    long streams become clips that FVD compares with real ones of the training length."""
    stride = stride or length
    if length < 1 or stride < 1 or videos.shape[1] < length:
        raise ValueError(f"cannot cut {length}-frame windows (stride {stride}) from {videos.shape[1]}-frame videos")
    starts = range(0, videos.shape[1] - length + 1, stride)
    return np.concatenate([videos[:, s:s + length] for s in starts])
