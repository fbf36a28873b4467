"""Fréchet distance and KID between two feature sets, the way the reference evaluators define them.

FID fits a Gaussian (mean, covariance) to each set of features and takes
``||mu1 - mu2||^2 + tr(S1) + tr(S2) - 2 tr(sqrt(S1 S2))``. The trace of the square root is computed in float64
from the eigenvalues of ``S1 S2`` (a product of two PSD matrices: its eigenvalues are real and >= 0 in exact
arithmetic), so no ``scipy.linalg.sqrtm`` is needed (SciPy 1.18 removed the ``disp`` argument that pytorch-fid,
clean-fid and the ADM evaluator pass to it). Rounding leaves tiny negative or imaginary parts: imaginary parts
are dropped and negative eigenvalues clamped to 0, and both are reported so a user can see when they are not
tiny. KID is the unbiased MMD^2 with the polynomial kernel ``(x . y / d + 1)^3``, averaged over random subsets
(100 subsets of 1000 by default, as torch-fidelity and clean-fid).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class GaussianStats:
    """Mean [d] and covariance [d, d] (float64) of ``count`` feature vectors."""

    mu: np.ndarray
    sigma: np.ndarray
    count: int

    @classmethod
    def of(cls, features: np.ndarray | torch.Tensor) -> GaussianStats:
        x = np.asarray(features, dtype=np.float64)
        if x.ndim != 2 or x.shape[0] < 2:
            raise ValueError(f"need at least 2 feature vectors [N, d] to fit a Gaussian, got shape {x.shape}")
        return cls(x.mean(0), np.cov(x, rowvar=False), x.shape[0])

    def save(self, path: str) -> None:
        np.savez(path, mu=self.mu, sigma=self.sigma, count=self.count)

    @classmethod
    def load(cls, path: str) -> GaussianStats:
        with np.load(path) as f:
            if "mu" not in f or "sigma" not in f:
                raise ValueError(f"{path} is not a statistics file (it needs arrays 'mu' and 'sigma')")
            return cls(f["mu"].astype(np.float64), f["sigma"].astype(np.float64), int(f["count"]) if "count" in f
                       else 0)


@dataclass(frozen=True)
class FrechetResult:
    fid: float
    max_imaginary: float  # largest |imaginary part| among the eigenvalues of S1 S2 (rounding noise)
    min_eigenvalue: float  # most negative real part before clamping (rounding noise when tiny)


def frechet_distance(a: GaussianStats, b: GaussianStats) -> FrechetResult:
    if a.mu.shape != b.mu.shape:
        raise ValueError(f"feature sizes differ: {a.mu.shape[0]} vs {b.mu.shape[0]}")
    eig = np.linalg.eigvals(a.sigma @ b.sigma)
    real = eig.real
    trace_sqrt = np.sqrt(np.clip(real, 0, None)).sum()
    diff = a.mu - b.mu
    fid = float(diff @ diff + np.trace(a.sigma) + np.trace(b.sigma) - 2 * trace_sqrt)
    return FrechetResult(fid, float(np.abs(eig.imag).max(initial=0.0)), float(min(real.min(initial=0.0), 0.0)))


def kernel_inception_distance(x: np.ndarray, y: np.ndarray, subsets: int = 100, subset_size: int = 1000,
                              seed: int = 0) -> tuple[float, float]:
    """(mean, std) over ``subsets`` of the unbiased polynomial-kernel MMD^2 between feature sets [N, d], [M, d]
    (subsets of ``min(subset_size, N, M)`` rows drawn without replacement)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    m = min(subset_size, len(x), len(y))
    if m < 2:
        raise ValueError(f"KID needs at least 2 samples on each side, got {len(x)} and {len(y)}")
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
