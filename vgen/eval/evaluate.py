"""FID / FVD between two sets, each a folder or array file of images or videos, or a precomputed stats file.

This is what ``vgen eval fid|fvd|stats`` run. Each side becomes :class:`~vgen.eval.fid.GaussianStats` carrying its
provenance (feature set, weights hash, input resolution); sides made differently are refused (see
:func:`~vgen.eval.fid.check_comparable`). The result is a flat dict of figures and provenance, ready for JSON.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from vgen.eval.features import Extractor, is_stats_file, load_extractor, load_images, recorded_name
from vgen.eval.fid import (
    KID_SUBSET_SIZE,
    GaussianStats,
    check_comparable,
    frechet_distance,
    kernel_inception_distance,
    kid_subset_size_for,
)
from vgen.eval.videos import load_videos

METRICS = {"images": ("fid", "kid"), "videos": ("fvd", "kvd")}


@dataclass(frozen=True)
class EvalSettings:
    """How features are made: the feature set (None: the one a stats file records, else ``shapes``), where its
    weights are, whether they must be the reference file, whether a TorchScript weights file may run (its code runs
    with the user's permissions), and the batching / device / clip length."""

    media: str = "images"
    features: str | None = None
    weights: str | None = None
    verify: bool = True
    device: str = "cpu"
    batch_size: int = 64
    num_frames: int = 16
    progress: bool = False
    trust_torchscript: bool = False


def _recorded_features(*paths: str | Path) -> str | None:
    for p in paths:
        if is_stats_file(p):
            name = GaussianStats.load(str(p)).features
            if name:
                return name
    return None


def _loader(settings: EvalSettings, features: str):
    return cache(lambda: load_extractor(features, settings.media, settings.weights, settings.verify, settings.device,
                                        settings.trust_torchscript))


def _load_data(path: str | Path, settings: EvalSettings) -> np.ndarray:
    if settings.media == "images":
        return load_images(path)
    return load_videos(path, settings.num_frames)


def measured(extractor: Extractor, data: np.ndarray, batch_size: int = 64,
             progress: bool = False) -> tuple[np.ndarray, GaussianStats]:
    """Features [N, d] of uint8 images [N, H, W, 3] or clips [N, T, H, W, 3], and their statistics with provenance
    (feature set, weights, resolution)."""
    feats = extractor(data, batch_size, progress)
    return feats, GaussianStats.of(feats, features=extractor.name, resolution=tuple(data.shape[1:-1]),
                                   weights_sha256=extractor.weights_sha256)


def side_stats(data: np.ndarray, settings: EvalSettings, extractor: Extractor) -> tuple[np.ndarray, GaussianStats]:
    """(features [N, d], stats with provenance) of one image or video set, loaded, batched as ``settings`` say."""
    return measured(extractor, data, settings.batch_size, settings.progress)


def frechet_report(real: str | Path, fake: str | Path, settings: EvalSettings = EvalSettings(),
                   kid_subsets: int = 100, kid_subset_size: int | None = None) -> dict:
    """FID (images) or FVD (videos) and KID / KVD between ``real`` and ``fake``, with provenance and warnings.

    KID's subsets hold ``kid_subset_size`` samples (a set with fewer is an error, found before its features are
    computed); by default :data:`~vgen.eval.fid.KID_SUBSET_SIZE`, or the smaller set's size with a warning. The
    report records the subset size and count used.
    """
    metric, kernel = METRICS[settings.media]
    features = recorded_name(settings.features or _recorded_features(real, fake) or "shapes", settings.media)
    extractor = _loader(settings, features)
    sides, side_warnings = {}, {}
    for name, path in (("real", real), ("fake", fake)):
        with warnings.catch_warnings(record=True) as records:
            warnings.simplefilter("always")
            if is_stats_file(path):
                stats = GaussianStats.load(str(path))
                if stats.features and stats.features != features:
                    raise ValueError(f"{path} holds statistics of {stats.features} features, not {features}")
                sides[name] = (None, stats)
            else:
                model, data = extractor(), _load_data(path, settings)
                if kid_subset_size is not None and len(data) < kid_subset_size:
                    raise ValueError(f"{path} holds {len(data)} {settings.media}, fewer than the {kernel.upper()} "
                                     f"subset size of {kid_subset_size}: pass a subset size of at most {len(data)}")
                sides[name] = side_stats(data, settings, model)
        for r in records:
            side_warnings.setdefault(str(r.message), []).append(name)
    caught = [f"{' and '.join(names)}: {message}" for message, names in side_warnings.items()]
    (real_feats, a), (fake_feats, b) = sides["real"], sides["fake"]
    caught += check_comparable(a, b)
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        result = frechet_distance(a, b)
    caught += [str(r.message) for r in records]
    report = {metric: result.fid, "features": features, "n_real": a.count, "n_fake": b.count,
              "resolution_real": list(a.resolution or []) or None, "resolution_fake": list(b.resolution or []) or None,
              "weights_sha256": a.weights_sha256 or b.weights_sha256}
    computed = real_feats is not None or fake_feats is not None
    report["weights_verified"] = extractor().weights_verified if computed else None
    if real_feats is None or fake_feats is None:  # KID needs features, not a stats file
        report.update({f"{kernel}_{key}": None for key in ("mean", "std", "subset_size", "subsets")})
    else:
        size = kid_subset_size_for(min(len(real_feats), len(fake_feats)), kid_subset_size)
        if size < KID_SUBSET_SIZE and kid_subset_size is None:
            whole = len(real_feats) == len(fake_feats) == size
            caught.append(f"{kernel.upper()} uses subsets of {size} samples, the smaller set's size, instead of "
                          f"{KID_SUBSET_SIZE}: it compares only with {kernel.upper()} on subsets of {size}"
                          + (f"; every subset is a whole set, so {kernel}_std is 0" if whole else ""))
        report[f"{kernel}_mean"], report[f"{kernel}_std"] = kernel_inception_distance(
            real_feats, fake_feats, kid_subsets, size)
        report.update({f"{kernel}_subset_size": size, f"{kernel}_subsets": kid_subsets})
    if settings.media == "videos":
        report["num_frames"] = settings.num_frames
    report.update(sqrt_max_imaginary=result.max_imaginary, sqrt_min_eigenvalue=result.min_eigenvalue,
                  versions=versions(), warnings=caught)
    return report


def compute_stats(path: str | Path, out: str | Path, settings: EvalSettings = EvalSettings()) -> dict:
    """Write the statistics of one set to ``out`` (.npz) and return what was written."""
    extractor = load_extractor(settings.features or "shapes", settings.media, settings.weights, settings.verify,
                               settings.device, settings.trust_torchscript)
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        _, stats = side_stats(_load_data(path, settings), settings, extractor)
    stats.save(str(out))
    return {"out": str(out), "count": stats.count, "features": stats.features, "resolution": list(stats.resolution),
            "weights_sha256": stats.weights_sha256, "weights_verified": extractor.weights_verified,
            "versions": versions(), "warnings": [str(r.message) for r in records]}


def versions() -> dict[str, str]:
    from importlib.metadata import version

    import torch

    return {"vgen": version("vgen"), "torch": torch.__version__, "numpy": np.__version__}
