"""FID and KID against independent formulas: the eigenvalue route to tr sqrt(S1 S2) equals a 50-digit symmetric
square root on random, ill-conditioned and rank-deficient covariances, closed forms hold for shifted isotropic and
commuting covariances, parts dropped beyond rounding are reported, KID is the unbiased polynomial-kernel MMD^2 on
subsets no larger than a set, and statistics files that are not finite statistics, or not .npz files, are named."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest

from vgen.eval.fid import (
    FrechetWarning,
    GaussianStats,
    SampleSizeWarning,
    check_comparable,
    frechet_distance,
    kernel_inception_distance,
    kid_subset_size_for,
    npz_keys,
    read_npy,
    read_npz,
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


def mpmath_frechet(a: GaussianStats, b: GaussianStats) -> float:
    """The Fréchet distance of the same float64 statistics in 50-digit arithmetic, through the symmetric form
    tr sqrt(S1^1/2 S2 S1^1/2) (real eigenvalues by construction, so nothing is clamped but exact-zero noise)."""
    mp = pytest.importorskip("mpmath").mp
    with mp.workdps(50):
        s1, s2 = mp.matrix(a.sigma.tolist()), mp.matrix(b.sigma.tolist())
        w, q = mp.eigsy(s1)
        root = q * mp.diag([mp.sqrt(max(x, 0)) for x in w]) * q.T
        trace_sqrt = mp.fsum(mp.sqrt(max(x, 0)) for x in mp.eigsy(root * s2 * root, eigvals_only=True))
        diff = mp.fsum((mp.mpf(x) - mp.mpf(y)) ** 2 for x, y in zip(a.mu, b.mu))
        return float(diff + mp.fsum(s1[i, i] + s2[i, i] for i in range(s1.rows)) - 2 * trace_sqrt)


def rotated(rng: np.random.Generator, eigenvalues: np.ndarray) -> np.ndarray:
    """A covariance with these eigenvalues in random directions."""
    q, _ = np.linalg.qr(rng.normal(size=(len(eigenvalues), len(eigenvalues))))
    s = (q * eigenvalues) @ q.T
    return (s + s.T) / 2


def features(rng: np.random.Generator, n: int, d: int, decay: float) -> np.ndarray:
    """ReLU features of correlated Gaussians whose scales fall to ``decay`` (like a network's activations)."""
    return np.maximum(rng.normal(size=(n, d)) @ (rng.normal(size=(d, d)) * np.logspace(0, np.log10(decay), d)), 0)


def stats_pair(case: str) -> tuple[GaussianStats, GaussianStats]:
    rng = np.random.default_rng(7)
    if case.startswith("condition"):  # eigenvalues from 1 down to 1e-8 or 1e-12
        d, cond = 24, float(case.removeprefix("condition "))
        spectrum = lambda: np.logspace(0, -np.log10(cond), d)
        return (GaussianStats(rng.normal(size=d) * 0.1, rotated(rng, spectrum()), 0),
                GaussianStats(rng.normal(size=d) * 0.1, rotated(rng, spectrum()), 0))
    n, d, decay = {"random": (400, 16, 1.0), "decaying features": (200, 32, 1e-5),
                   "fewer samples than dimensions": (12, 32, 1e-2)}[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SampleSizeWarning)
        return (GaussianStats.of(features(rng, n, d, decay)), GaussianStats.of(features(rng, n, d, decay) + 0.05))


@pytest.mark.parametrize("case", ["random", "condition 1e8", "condition 1e12", "decaying features",
                                  "fewer samples than dimensions"])
def test_equals_a_50_digit_reference(case: str) -> None:
    a, b = stats_pair(case)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FrechetWarning)  # rounding stays far below the warning's threshold
        assert frechet_distance(a, b).fid == pytest.approx(mpmath_frechet(a, b), rel=1e-6)
        assert frechet_distance(a, a).fid == pytest.approx(0, abs=1e-6 * np.trace(a.sigma))


def test_shifted_isotropic_and_commuting_gaussians_give_the_closed_form() -> None:
    rng = np.random.default_rng(8)
    d, shift = 10, rng.normal(size=10)
    iso = lambda mu, s: GaussianStats(mu, rotated(rng, np.full(d, s**2)), 0)
    assert frechet_distance(iso(np.zeros(d), 1.5), iso(shift, 1.5)).fid == pytest.approx(shift @ shift, rel=1e-12)
    assert frechet_distance(iso(np.zeros(d), 1.0), iso(shift, 3.0)).fid == pytest.approx(shift @ shift + d * 4,
                                                                                       rel=1e-12)
    x = rng.normal(size=(300, d)) @ rng.normal(size=(d, d))  # y = c x + m: cov_y = c^2 cov_x, which commutes
    a, b = GaussianStats.of(x), GaussianStats.of(0.3 * x + shift)
    expected = np.sum((0.3 * a.mu + shift - a.mu) ** 2) + (1 - 0.3) ** 2 * np.trace(a.sigma)
    assert frechet_distance(a, b).fid == pytest.approx(expected, rel=1e-10)


def test_parts_dropped_beyond_rounding_are_reported() -> None:
    """A 'covariance' with a negative eigenvalue is not one: the clamped part is named, not silently dropped."""
    rng = np.random.default_rng(9)
    good = GaussianStats(np.zeros(6), rotated(rng, np.linspace(1, 2, 6)), 0)
    bad = GaussianStats(np.zeros(6), rotated(rng, np.array([-0.5, 1, 1, 1, 1, 1])), 0)
    with pytest.warns(FrechetWarning, match=r"negative parts down to -0\.\d+ .* not positive semi-definite"):
        result = frechet_distance(good, bad)
    assert result.min_eigenvalue < -0.1


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


@pytest.mark.parametrize("name, value", [("mu", np.nan), ("sigma", np.inf)])
def test_statistics_that_are_not_finite_are_refused_naming_the_file(name: str, value: float, tmp_path) -> None:
    arrays = {"mu": np.zeros(3), "sigma": np.eye(3)}
    arrays[name].flat[1] = value
    np.savez(tmp_path / "s.npz", **arrays)
    message = f"the statistics' {name} holds 1 NaN or infinite values; recompute them"
    with pytest.raises(ValueError, match=f"^{tmp_path / 's.npz'}: {message}$"):
        GaussianStats.load(str(tmp_path / "s.npz"))
    with pytest.raises(ValueError, match=f"^{message}$"):
        GaussianStats(arrays["mu"], arrays["sigma"], 10)


def test_statistics_of_mismatched_sizes_are_refused(tmp_path) -> None:
    np.savez(tmp_path / "s.npz", mu=np.zeros(2), sigma=np.eye(3))
    with pytest.raises(ValueError, match=r"s\.npz: statistics need mu \[d\] and sigma \[d, d\], got \[2\] and \[3, 3"):
        GaussianStats.load(str(tmp_path / "s.npz"))


def test_files_that_numpy_cannot_read_as_named_are_named(tmp_path) -> None:
    (tmp_path / "text.npz").write_text("mu, sigma")
    for read in (npz_keys, lambda p: read_npz(p, ["mu"]), lambda p: GaussianStats.load(str(p))):
        with pytest.raises(ValueError, match=f"^cannot read {tmp_path / 'text.npz'}: the file is corrupt or not an "
                                             r"\.npz archive$"):
            read(tmp_path / "text.npz")
    np.save(tmp_path / "array.npy", np.zeros(3))
    (tmp_path / "array.npy").rename(tmp_path / "array.npz")
    with pytest.raises(ValueError, match=r"array\.npz is a single \.npy array, not an \.npz archive$"):
        npz_keys(tmp_path / "array.npz")
    np.savez(tmp_path / "arrays.npz", arr_0=np.zeros(3))
    (tmp_path / "arrays.npz").rename(tmp_path / "arrays.npy")
    with pytest.raises(ValueError, match=r"arrays\.npy is an \.npz archive, not an \.npy array$"):
        read_npy(tmp_path / "arrays.npy")
    (tmp_path / "text.npy").write_text("mu, sigma")
    with pytest.raises(ValueError, match=r"^cannot read .*text\.npy: the file is corrupt or not an \.npy array$"):
        read_npy(tmp_path / "text.npy")
    np.savez(tmp_path / "objects.npz", mu=np.array([{"x": 1}], dtype=object), sigma=np.eye(1))
    with pytest.raises(ValueError, match=r"^cannot read array 'mu' of .*objects\.npz: the file is corrupt or the array "
                                         r"holds Python objects$"):
        GaussianStats.load(str(tmp_path / "objects.npz"))


def test_kid_subsets_are_never_larger_than_a_set() -> None:
    rng = np.random.default_rng(7)
    x, y = rng.normal(size=(30, 4)), rng.normal(size=(40, 4))
    with pytest.raises(ValueError, match="^KID subsets of 31 samples need at least 31 on each side, but a side has 30: "
                                         "pass a subset size of at most 30$"):
        kernel_inception_distance(x, y, subsets=2, subset_size=31)
    with pytest.raises(ValueError, match="KID subset size must be at least 2, got 1"):
        kernel_inception_distance(x, y, subsets=2, subset_size=1)
    assert kid_subset_size_for(64) == 64 and kid_subset_size_for(5000) == 1000 and kid_subset_size_for(64, 32) == 32


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
