"""Measures of a prompt-steered stream: whether each frame shows what its prompt asks for, and, at a prompt switch
at frame ``s``, how fast the new prompt shows, how visible the change is, and how steady the stream is after it.

Every frame is read by a scene judge (:class:`~vgen.models.classifier.AttributeClassifier`, the shipped
``shapes-scene-judge`` by default: on 800 frames of 200 moving-scene test clips it reads shape and colour right in
99.75% of frames). The switch measures (``s`` on a block boundary; the modes a benchmark compares share seeds, so
their frames before ``s`` are equal):

- **latency**: the first ``t >= s`` at which frames ``t`` and ``t + 1`` both read the new shape and colour, counted
  from ``s`` (0: the switch's first two frames show it); ``None`` if it never happens. A switch *succeeds* when
  ``t + 1 < s + SWITCH_WINDOW``.
- **cut spike**: with ``d_t`` the mean absolute grey-level change from frame ``t - 1`` to ``t``, the largest
  ``d_t`` of the ``SPIKE_FRAMES`` frames from ``s`` over the median ``d_t`` of the ``BASELINE_FRAMES`` frames
  before ``s``: about 1 for a stream whose object keeps moving as before, large for a cut.
- **flicker** over frames ``[start, stop)``: the share of neighbouring frame pairs whose judged (shape, colour)
  differ (``label``), and the mean ``|d_t - d_{t-1}|`` (``pixel``: how unevenly the picture changes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from vgen.data.moving_scenes import ATTRIBUTE_VALUES
from vgen.eval.drift import chunk_bounds
from vgen.eval.features import classifier_input
from vgen.models.classifier import AttributeClassifier

JUDGED: tuple[str, ...] = ("shape", "colour")  # what a switch changes and a stream is held to
SWITCH_WINDOW = 8
SPIKE_FRAMES = 4
BASELINE_FRAMES = 8
MIN_CHANGE = 0.1  # grey levels: the floor of a spike's baseline (a still picture would divide by zero)
GREY = np.array([0.299, 0.587, 0.114])


@torch.no_grad()
def judge_frames(judge: AttributeClassifier, frames: np.ndarray, names: Sequence[str] = JUDGED,
                 batch_size: int = 256) -> np.ndarray:
    """The judge's reading of uint8 frames [..., H, W, 3] (resized to its input size): value indices
    [..., len(names)] of the attributes ``names``, in that order."""
    missing = [n for n in names if n not in judge.config.names]
    if missing:
        raise ValueError(f"the judge reads {list(judge.config.names)}, not {missing}")
    frames = np.asarray(frames)
    flat = frames.reshape(-1, *frames.shape[-3:])
    columns = [judge.config.names.index(n) for n in names]
    readings = [judge.predict(classifier_input(flat[i:i + batch_size], judge))[:, columns].numpy()
                for i in range(0, len(flat), batch_size)]
    out = np.concatenate(readings) if readings else np.zeros((0, len(names)), np.int64)
    return out.reshape(*frames.shape[:-3], len(names))


def attribute_values(attributes: Mapping[str, str], names: Sequence[str] = JUDGED) -> np.ndarray:
    """Value indices [len(names)] of named attributes (``{"shape": "star", "colour": "red", ...}``)."""
    try:
        return np.array([ATTRIBUTE_VALUES[n].index(attributes[n]) for n in names], np.int64)
    except (KeyError, ValueError) as error:
        raise ValueError(f"attributes {dict(attributes)} do not name a value for each of {list(names)}") from error


def frame_hits(readings: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Which frames read every wanted value: bool [...] from readings [..., A] and wanted [A] (or [..., A])."""
    return (np.asarray(readings) == np.asarray(wanted)).all(-1)


def frame_changes(frames: np.ndarray) -> np.ndarray:
    """``d`` [T]: ``d[t]`` is the mean absolute grey-level change from frame ``t - 1`` to ``t`` of uint8 frames
    [T, H, W, 3] (``d[0]`` is NaN: no frame before it)."""
    grey = np.asarray(frames, np.float64) @ GREY
    d = np.abs(np.diff(grey, axis=0)).mean(axis=(1, 2))
    return np.concatenate([[np.nan], d])


def switch_latency(judged: np.ndarray, switch_frame: int) -> int | None:
    """Frames from ``switch_frame`` to the first frame ``t >= switch_frame`` that, with frame ``t + 1``, reads the new
    attributes (``judged``: bool [T], per frame); ``None`` if no two such frames follow each other."""
    judged = np.asarray(judged, bool)
    if not 0 <= switch_frame < len(judged):
        raise ValueError(f"switch_frame {switch_frame} is outside the stream's {len(judged)} frames")
    both = judged[switch_frame:-1] & judged[switch_frame + 1:]
    return int(both.argmax()) if both.any() else None


def cut_spike(frames: np.ndarray, switch_frame: int) -> float:
    """The largest frame change of the ``SPIKE_FRAMES`` frames from ``switch_frame`` over the median change of the
    ``BASELINE_FRAMES`` frames before it (fewer where the stream is shorter; the median is at least
    ``MIN_CHANGE``)."""
    d = frame_changes(frames)
    if not 2 <= switch_frame < len(d):
        raise ValueError(f"switch_frame must be in [2, {len(d)}) for a stream of {len(d)} frames (a change "
                         f"before the switch is the baseline), got {switch_frame}")
    before = d[max(1, switch_frame - BASELINE_FRAMES):switch_frame]
    return float(d[switch_frame:switch_frame + SPIKE_FRAMES].max() / max(float(np.median(before)), MIN_CHANGE))


def largest_spike(frames: np.ndarray) -> float:
    """The largest :func:`cut_spike` over every frame with a whole baseline and spike window: how large a spike a
    stream without a switch reaches by itself (real clips' motion, a bounce)."""
    first, last = BASELINE_FRAMES + 1, len(frames) - SPIKE_FRAMES
    if last < first:
        raise ValueError(f"need at least {first + SPIKE_FRAMES} frames for a whole window, got {len(frames)}")
    return max(cut_spike(frames, s) for s in range(first, last + 1))


def flicker(judged_labels: np.ndarray, frames: np.ndarray, start: int, stop: int) -> dict[str, float]:
    """Flicker over frames ``[start, stop)``: ``label``, the share of neighbouring pairs whose judged labels
    (``judged_labels`` [T, A], e.g. shape and colour) differ; ``pixel``, the mean ``|d_t - d_{t-1}|`` of the frame
    changes within the span (grey levels)."""
    labels = np.asarray(judged_labels)
    if labels.ndim == 1:
        labels = labels[:, None]
    if len(labels) != len(frames):
        raise ValueError(f"{len(labels)} judged frames for {len(frames)} frames")
    if not (start >= 0 and start + 3 <= stop <= len(frames)):
        raise ValueError(f"need 0 <= start, start + 3 <= stop <= {len(frames)} frames, got [{start}, {stop})")
    span = labels[start:stop]
    d = frame_changes(frames[start:stop])[1:]
    return {"label": float((span[1:] != span[:-1]).any(-1).mean()), "pixel": float(np.abs(np.diff(d)).mean())}


def measure_switch(readings: np.ndarray, frames: np.ndarray, wanted: np.ndarray, switch_frame: int,
                   flicker_from: int = SWITCH_WINDOW, flicker_frames: int = 24) -> dict:
    """One switched stream's measures: its judge readings [T, A] and uint8 frames [T, H, W, 3], the new prompt's
    values [A], the switch frame; flicker over ``flicker_frames`` frames from ``switch_frame + flicker_from``
    (as many as the stream has; None if fewer than 3)."""
    start = switch_frame + flicker_from
    stop = min(len(frames), start + flicker_frames)
    return {"latency": switch_latency(frame_hits(readings, wanted), switch_frame),
            "spike": cut_spike(frames, switch_frame),
            "flicker": flicker(readings, frames, start, stop) if stop - start >= 3 else None}


def switch_summary(records: Sequence[Mapping], window: int = SWITCH_WINDOW) -> dict:
    """Over many streams' :func:`measure_switch` records: the share that switch within ``window`` frames, the
    share that never do, the median latency (None when half or more never switch), the mean and median spike,
    and the mean flicker (of the streams long enough to have it)."""
    if not records:
        raise ValueError("no switched streams to summarise")
    latencies = np.array([np.inf if r["latency"] is None else r["latency"] for r in records], np.float64)
    spikes = np.array([r["spike"] for r in records], np.float64)
    flickers = [r["flicker"] for r in records if r["flicker"] is not None]
    median = float(np.median(latencies))
    return {"streams": len(records), "within_window": float((latencies + 1 < window).mean()),
            "never": float(np.isinf(latencies).mean()), "median_latency": median if np.isfinite(median) else None,
            "mean_spike": float(spikes.mean()), "median_spike": float(np.median(spikes)),
            "label_flicker": float(np.mean([f["label"] for f in flickers])) if flickers else None,
            "pixel_flicker": float(np.mean([f["pixel"] for f in flickers])) if flickers else None}


def chunk_accuracy(hits: np.ndarray, chunks: int) -> list[float]:
    """The share of right frames in each of ``chunks`` equal chunks of streams' per-frame ``hits`` [N, T]."""
    hits = np.asarray(hits, bool)
    return [float(hits[:, a:b].mean()) for a, b in chunk_bounds(hits.shape[1], chunks)]
