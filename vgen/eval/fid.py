"""Fréchet distance and KID between two feature sets, the way the reference evaluators define them.

FID fits a Gaussian (mean, covariance) to each set of features and takes
``||mu1 - mu2||^2 + tr(S1) + tr(S2) - 2 tr(sqrt(S1 S2))``. The trace of the square root is computed in float64
from the eigenvalues of ``S1 S2`` (a product of two PSD matrices: its eigenvalues are real and >= 0 in exact
arithmetic), so no ``scipy.linalg.sqrtm`` is needed (SciPy 1.18 removed the ``disp`` argument that pytorch-fid,
clean-fid and the ADM evaluator pass to it). Rounding leaves tiny negative or imaginary parts: imaginary parts
are dropped and negative eigenvalues clamped to 0 (torch-fidelity's ``sqrt(eigvals).real`` differs only by
rounding), and both are reported. Rounding keeps them near 1e-16 of the largest eigenvalue; beyond
:data:`ROUNDING_TOLERANCE` of it they are not rounding, and a :class:`FrechetWarning` says so. KID is the unbiased
MMD^2 with the polynomial kernel ``(x . y / d + 1)^3``, averaged over random subsets
(100 subsets of 1000 by default, as torch-fidelity and clean-fid; a subset larger than a set is an error, as in
torch-fidelity and torchmetrics).
"""

from __future__ import annotations

import warnings
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ROUNDING_TOLERANCE = 1e-6  # relative to the largest |eigenvalue| of S1 S2; measured rounding stays below 1e-15
KID_SUBSET_SIZE = 1000  # torch-fidelity's and clean-fid's default
_READ_ERRORS = (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error)


@contextmanager
def _open_npz(path: str | Path) -> Iterator[np.lib.npyio.NpzFile]:
    try:
        f = np.load(path)
    except _READ_ERRORS:
        raise ValueError(f"cannot read {path}: the file is corrupt or not an .npz archive") from None
    if not isinstance(f, np.lib.npyio.NpzFile):
        raise ValueError(f"{path} is a single .npy array, not an .npz archive")
    with f:
        yield f


def npz_keys(path: str | Path) -> list[str]:
    """The array names in an ``.npz``; a file numpy cannot open as one is a ValueError naming it."""
    with _open_npz(path) as f:
        return list(f.files)


def read_npz(path: str | Path, keys: Iterable[str]) -> dict[str, np.ndarray]:
    """Those of the arrays ``keys`` that an ``.npz`` holds; an unreadable file or array is a ValueError naming it."""
    with _open_npz(path) as f:
        arrays = {}
        for key in (k for k in keys if k in f.files):
            try:
                arrays[key] = f[key]
            except _READ_ERRORS:
                raise ValueError(f"cannot read array {key!r} of {path}: the file is corrupt or the array holds "
                                 f"Python objects") from None
        return arrays


def read_npy(path: str | Path) -> np.ndarray:
    """The array of an ``.npy``; a file numpy cannot read as one is a ValueError naming it."""
    try:
        array = np.load(path)
    except _READ_ERRORS:
        raise ValueError(f"cannot read {path}: the file is corrupt or not an .npy array") from None
    if not isinstance(array, np.ndarray):
        array.close()
        raise ValueError(f"{path} is an .npz archive, not an .npy array")
    return array


class FrechetWarning(UserWarning):
    """The square root dropped more than rounding noise: a covariance is not positive semi-definite."""


class SampleSizeWarning(UserWarning):
    """Fewer samples than feature dimensions: the statistics are valid but the distance is strongly biased."""


def sample_size_warning(count: int, dim: int) -> str | None:
    """Why ``count`` samples of ``dim``-d features give a distance that is only comparable at the same count."""
    if count > dim:
        return None
    return (f"only {count} samples for {dim}-d features: their covariance has rank at most {count - 1} < {dim}, so "
            f"the Fréchet distance is biased upward by the small sample (it falls as the count grows) and is "
            f"comparable only with distances computed from the same number of samples (the usual counts are 50,000 "
            f"images for FID and 2,048 videos for FVD; use more than {dim} at the very least)")


@dataclass(frozen=True)
class GaussianStats:
    """Mean [d] and covariance [d, d] (float64) of ``count`` feature vectors, with where they came from: the feature
    set's name, the resolution of the inputs ([H, W] for images, [T, H, W] for videos) and the SHA-256 of the
    extractor's weights. Stats files written by other tools (ADM's reference batches) have no provenance (None)."""

    mu: np.ndarray
    sigma: np.ndarray
    count: int
    features: str | None = None
    resolution: tuple[int, ...] | None = None
    weights_sha256: str | None = None

    def __post_init__(self) -> None:
        if self.mu.ndim != 1 or self.sigma.shape != (len(self.mu), len(self.mu)):
            raise ValueError(f"statistics need mu [d] and sigma [d, d], got {list(self.mu.shape)} and "
                             f"{list(self.sigma.shape)}")
        for name in ("mu", "sigma"):
            bad = int(np.count_nonzero(~np.isfinite(getattr(self, name))))
            if bad:
                raise ValueError(f"the statistics' {name} holds {bad} NaN or infinite values; recompute them")

    @classmethod
    def of(cls, vectors: np.ndarray | torch.Tensor, /, **provenance) -> GaussianStats:
        """Fit to feature vectors [N, d]; warns (:class:`SampleSizeWarning`) when N <= d."""
        x = np.asarray(vectors, dtype=np.float64)
        if x.ndim != 2 or x.shape[0] < 2:
            raise ValueError(f"need at least 2 feature vectors [N, d] to fit a Gaussian, got shape {x.shape}")
        message = sample_size_warning(*x.shape)
        if message:
            warnings.warn(message, SampleSizeWarning, stacklevel=2)
        return cls(x.mean(0), np.cov(x, rowvar=False), x.shape[0], **provenance)

    def save(self, path: str) -> None:
        meta = {k: v for k, v in (("features", self.features), ("weights_sha256", self.weights_sha256)) if v}
        if self.resolution:
            meta["resolution"] = np.asarray(self.resolution, dtype=np.int64)
        np.savez(path, mu=self.mu, sigma=self.sigma, count=self.count, **meta)

    @classmethod
    def load(cls, path: str) -> GaussianStats:
        """The statistics in an ``.npz`` (``mu``, ``sigma`` and what vgen records); a file that is not one, or whose
        statistics are not finite, is a ValueError naming it."""
        f = read_npz(path, ("mu", "sigma", "count", "features", "resolution", "weights_sha256"))
        if "mu" not in f or "sigma" not in f:
            raise ValueError(f"{path} is not a statistics file (it needs arrays 'mu' and 'sigma')")
        text = lambda key: str(f[key]) if key in f else None
        try:
            return cls(f["mu"].astype(np.float64), f["sigma"].astype(np.float64),
                       int(f["count"]) if "count" in f else 0, text("features"),
                       tuple(int(v) for v in f["resolution"]) if "resolution" in f else None, text("weights_sha256"))
        except (ValueError, TypeError) as e:
            raise ValueError(f"{path}: {e}") from None


def check_comparable(a: GaussianStats, b: GaussianStats) -> list[str]:
    """Raise if two statistics were made with different feature extractors, weights or input resolutions (their
    distance would be a number without meaning); return warnings for what cannot be checked."""
    if a.features and b.features and a.features != b.features:
        raise ValueError(f"the two sides use different features: {a.features} vs {b.features}")
    if a.weights_sha256 and b.weights_sha256 and a.weights_sha256 != b.weights_sha256:
        raise ValueError(f"the two sides' {a.features or 'feature'} weights differ: SHA-256 {a.weights_sha256[:12]}... "
                         f"vs {b.weights_sha256[:12]}...")
    if a.resolution and b.resolution and a.resolution != b.resolution:
        kinds = {2: "images", 3: "videos"}
        what = " vs ".join(f"{kinds.get(len(r), 'inputs')} {'x'.join(map(str, r))}"
                           for r in (a.resolution, b.resolution))
        raise ValueError(f"the two sides differ in resolution ({what}); resize one set to the other's size first")
    if a.mu.shape != b.mu.shape:
        raise ValueError(f"feature sizes differ: {a.mu.shape[0]} vs {b.mu.shape[0]}")
    unknown = [side for side, s in (("real", a), ("fake", b)) if s.features is None]
    return [f"the {' and '.join(unknown)} statistics record no feature set or resolution (a file from another tool?): "
            f"vgen cannot check that both sides were made the same way"] if unknown else []


@dataclass(frozen=True)
class FrechetResult:
    fid: float
    max_imaginary: float  # largest |imaginary part| among the eigenvalues of S1 S2 (rounding noise)
    min_eigenvalue: float  # most negative real part before clamping (rounding noise when tiny)


def frechet_distance(a: GaussianStats, b: GaussianStats) -> FrechetResult:
    """The Fréchet distance of two Gaussians; warns (:class:`FrechetWarning`) when the parts of the eigenvalues it
    drops are more than rounding noise."""
    if a.mu.shape != b.mu.shape:
        raise ValueError(f"feature sizes differ: {a.mu.shape[0]} vs {b.mu.shape[0]}")
    eig = np.linalg.eigvals(a.sigma @ b.sigma)
    real = eig.real
    trace_sqrt = np.sqrt(np.clip(real, 0, None)).sum()
    diff = a.mu - b.mu
    fid = float(diff @ diff + np.trace(a.sigma) + np.trace(b.sigma) - 2 * trace_sqrt)
    result = FrechetResult(fid, float(np.abs(eig.imag).max(initial=0.0)), float(min(real.min(initial=0.0), 0.0)))
    largest = float(np.abs(eig).max(initial=0.0))
    if max(result.max_imaginary, -result.min_eigenvalue) > ROUNDING_TOLERANCE * largest:
        warnings.warn(f"the eigenvalues of S1 S2 have imaginary parts up to {result.max_imaginary:.3g} and negative "
                      f"parts down to {result.min_eigenvalue:.3g} against a largest eigenvalue of {largest:.3g}: not "
                      f"rounding noise, so a covariance is not positive semi-definite (a damaged or hand-made stats "
                      f"file?); the distance drops those parts and means little", FrechetWarning, stacklevel=2)
    return result


def kid_subset_size_for(count: int, requested: int | None = None) -> int:
    """The KID subset size for two sets whose smaller holds ``count`` samples: ``requested`` if given (a ValueError
    when a set is smaller), else :data:`KID_SUBSET_SIZE` or ``count`` if that is less."""
    if requested is None:
        return min(KID_SUBSET_SIZE, count)
    if requested < 2:
        raise ValueError(f"the KID subset size must be at least 2, got {requested}")
    if requested > count:
        raise ValueError(f"KID subsets of {requested} samples need at least {requested} on each side, but a side has "
                         f"{count}: pass a subset size of at most {count}")
    return requested


def kernel_inception_distance(x: np.ndarray, y: np.ndarray, subsets: int = 100, subset_size: int = KID_SUBSET_SIZE,
                              seed: int = 0) -> tuple[float, float]:
    """(mean, std) over ``subsets`` of the unbiased polynomial-kernel MMD^2 between feature sets [N, d], [M, d],
    on subsets of ``subset_size`` rows drawn without replacement (a ValueError when N or M is smaller)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    m = kid_subset_size_for(min(len(x), len(y)), subset_size)
    d = x.shape[1]
    rng = np.random.default_rng(seed)
    scores = []
    for _ in range(subsets):
        a = x[rng.choice(len(x), m, replace=False)]
        b = y[rng.choice(len(y), m, replace=False)]
        kxx, kyy, kxy = ((a @ a.T / d + 1) ** 3, (b @ b.T / d + 1) ** 3, (a @ b.T / d + 1) ** 3)
        off = lambda k: (k.sum() - np.trace(k)) / (m * (m - 1))
        scores.append(off(kxx) + off(kyy) - 2 * kxy.mean())
    return float(np.mean(scores)), float(np.std(scores))
