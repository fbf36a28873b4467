"""FID and KID against independent formulas: the eigenvalue route to tr sqrt(S1 S2) equals the symmetric
square root, closed forms hold for diagonal covariances, rank-deficient covariances stay finite, and KID is the
unbiased polynomial-kernel MMD^2."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest

from vgen.eval.fid import (
    GaussianStats,
    SampleSizeWarning,
    check_comparable,
    frechet_distance,
    kernel_inception_distance,
)


def random_stats(rng: np.random.Generator, d: int, n: int = 400) -> tuple[GaussianStats, np.ndarray]:
    x = rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) + rng.normal(size=d)
    return GaussianStats.of(x), x


def symmetric_trace_sqrt(s1: np.ndarray, s2: np.ndarray) -> float:
    """tr sqrt(S1^1/2 S2 S1^1/2) through symmetric eigendecompositions (the textbook form)."""
    w, v = np.linalg.eigh(s1)
    root = v @ np.diag(np.sqrt(np.clip(w, 0, None))) @ v.T
    return float(np.sqrt(np.clip(np.linalg.eigvalsh(root @ s2 @ root), 0, None)).sum())


def test_matches_the_symmetric_square_root_formula() -> None:
    rng = np.random.default_rng(0)
    (a, _), (b, _) = random_stats(rng, 16), random_stats(rng, 16)
    expected = (np.sum((a.mu - b.mu) ** 2) + np.trace(a.sigma) + np.trace(b.sigma)
                - 2 * symmetric_trace_sqrt(a.sigma, b.sigma))
    result = frechet_distance(a, b)
    assert result.fid == pytest.approx(expected, rel=1e-9)
    assert result.max_imaginary < 1e-8


def test_diagonal_closed_form_and_zero_for_identical_sets() -> None:
    a = GaussianStats(np.array([1.0, 2.0]), np.diag([4.0, 9.0]), 10)
    b = GaussianStats(np.array([0.0, 0.0]), np.diag([1.0, 1.0]), 10)
    assert frechet_distance(a, b).fid == pytest.approx(5 + (4 + 1 - 4) + (9 + 1 - 6))
    assert frechet_distance(a, a).fid == pytest.approx(0, abs=1e-9)


def test_rank_deficient_covariances_stay_finite_and_report_the_clamping() -> None:
    rng = np.random.default_rng(1)
    with pytest.warns(SampleSizeWarning):
        a, b = GaussianStats.of(rng.normal(size=(5, 12))), GaussianStats.of(rng.normal(size=(5, 12)))
    result = frechet_distance(a, b)
    assert np.isfinite(result.fid) and result.fid > 0
    assert result.min_eigenvalue <= 0 and abs(result.min_eigenvalue) < 1e-8


def test_kid_is_the_unbiased_polynomial_mmd() -> None:
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(30, 4)), rng.normal(size=(30, 4)) + 0.5
    k = lambda a, b: (a @ b.T / 4 + 1) ** 3
    off = lambda m: (m.sum() - np.trace(m)) / (30 * 29)
    expected = off(k(x, x)) + off(k(y, y)) - 2 * k(x, y).mean()
    mean, std = kernel_inception_distance(x, y, subsets=3, subset_size=30)  # every subset is the whole set
    assert mean == pytest.approx(expected) and std == pytest.approx(0, abs=1e-12)


def test_kid_is_near_zero_for_one_distribution_and_positive_for_two() -> None:
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(600, 8)), rng.normal(size=(600, 8))
    same, same_std = kernel_inception_distance(x, y, subsets=20, subset_size=200)
    shifted, _ = kernel_inception_distance(x, y + 1.0, subsets=20, subset_size=200)
    assert abs(same) < 3 * same_std + 1e-3 and shifted > 10 * abs(same)


def test_stats_round_trip_and_bad_files(tmp_path) -> None:
    rng = np.random.default_rng(4)
    stats, _ = random_stats(rng, 6)
    stats.save(str(tmp_path / "s.npz"))
    loaded = GaussianStats.load(str(tmp_path / "s.npz"))
    assert np.array_equal(loaded.mu, stats.mu) and np.array_equal(loaded.sigma, stats.sigma) and loaded.count == 400
    np.savez(tmp_path / "bad.npz", arr_0=np.zeros(3))
    with pytest.raises(ValueError, match="not a statistics file"):
        GaussianStats.load(str(tmp_path / "bad.npz"))
    with pytest.raises(ValueError, match="at least 2 feature vectors"):
        GaussianStats.of(np.zeros((1, 4)))
    with pytest.raises(ValueError, match="feature sizes differ"):
        frechet_distance(stats, GaussianStats.of(rng.normal(size=(10, 3))))


def test_stats_keep_their_provenance_and_refuse_other_features(tmp_path) -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(50, 6))
    a = GaussianStats.of(x, features="inception", resolution=(256, 256), weights_sha256="ab" * 32)
    a.save(str(tmp_path / "a.npz"))
    loaded = GaussianStats.load(str(tmp_path / "a.npz"))
    assert (loaded.features, loaded.resolution, loaded.weights_sha256) == ("inception", (256, 256), "ab" * 32)
    assert check_comparable(a, loaded) == []
    with pytest.raises(ValueError, match="different features: inception vs shapes"):
        check_comparable(a, replace(a, features="shapes"))
    with pytest.raises(ValueError, match=r"inception weights differ: SHA-256 abababababab\.\.\. vs cdcdcdcdcdcd"):
        check_comparable(a, replace(a, weights_sha256="cd" * 32))
    with pytest.raises(ValueError, match=r"differ in resolution \(images 256x256 vs images 64x64\)"):
        check_comparable(a, replace(a, resolution=(64, 64)))
    with pytest.raises(ValueError, match=r"differ in resolution \(images 256x256 vs videos 16x256x256\)"):
        check_comparable(a, replace(a, resolution=(16, 256, 256)))
    adm = GaussianStats(a.mu, a.sigma, 0)  # e.g. an ADM reference batch: mu and sigma only
    assert "fake statistics record no feature set" in check_comparable(a, adm)[0]


def test_too_few_samples_warn_and_say_what_it_means() -> None:
    rng = np.random.default_rng(6)
    with pytest.warns(SampleSizeWarning, match=r"only 8 samples for 16-d features: .*rank at most 7 < 16.*biased"):
        GaussianStats.of(rng.normal(size=(8, 16)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GaussianStats.of(rng.normal(size=(17, 16)))  # more samples than dimensions: no warning
