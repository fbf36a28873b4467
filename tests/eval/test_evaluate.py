"""FID / FVD end to end: equal to torchmetrics' FrechetInceptionDistance on the same features, FVD over video
sets and stats files, provenance checks between the sides, weights looked up and verified, one JSON object."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from torch import nn
from torchmetrics.image.fid import FrechetInceptionDistance

from vgen.apps.cli import main
from vgen.data.shapes import sample_image
from vgen.eval.evaluate import EvalSettings, frechet_report
from vgen.eval.features import shapes_features
from vgen.eval.fid import GaussianStats
from vgen.eval.inception import load_fid_inception


def shapes(seed: int, n: int) -> np.ndarray:
    return np.stack([sample_image(seed, i)[0] for i in range(n)])


class ShapesFeatureModule(nn.Module):
    """vgen's shapes features as a torchmetrics feature module (uint8 NCHW in)."""

    num_features = 192

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(shapes_features(images.permute(0, 2, 3, 1).numpy()))


def torchmetrics_fid(module: nn.Module, real: np.ndarray, fake: np.ndarray) -> float:
    metric = FrechetInceptionDistance(feature=module)
    metric.update(torch.from_numpy(real).permute(0, 3, 1, 2), real=True)
    metric.update(torch.from_numpy(fake).permute(0, 3, 1, 2), real=False)
    return float(metric.compute())


def test_fid_equals_torchmetrics_on_the_shapes_features(tmp_path) -> None:
    real, fake = shapes(20, 200), shapes(21, 200)  # more samples than the 192 dimensions
    np.savez(tmp_path / "real.npz", arr_0=real)
    np.savez(tmp_path / "fake.npz", arr_0=fake)
    ours = frechet_report(tmp_path / "real.npz", tmp_path / "fake.npz", EvalSettings(), kid_subsets=2,
                          kid_subset_size=100)
    assert ours["fid"] == pytest.approx(torchmetrics_fid(ShapesFeatureModule(), real, fake), rel=1e-6)
    assert ours["warnings"] == [] and ours["resolution_real"] == [64, 64]


def test_the_inception_module_serves_torchmetrics_with_the_same_statistics(inception_layout, seeded,
                                                                          tmp_path) -> None:
    """torchmetrics accepts the module as its feature extractor (offline) and accumulates the same mean and
    covariance as vgen; the FID formula on such statistics is compared above (a 2048-d FID costs two 2048x2048
    eigendecompositions, about a minute on this CPU)."""
    torch.save(seeded(inception_layout), tmp_path / "w.pth")
    model = load_fid_inception(tmp_path / "w.pth")
    images = np.random.default_rng(0).integers(0, 256, size=(5, 32, 32, 3), dtype=np.uint8)
    with torch.no_grad():
        features = model(torch.from_numpy(images).permute(0, 3, 1, 2)).numpy()
    assert features.shape == (5, 2048) and features.dtype == np.float32
    metric = FrechetInceptionDistance(feature=model)
    metric.update(torch.from_numpy(images).permute(0, 3, 1, 2), real=True)
    n = int(metric.real_features_num_samples)
    mean = (metric.real_features_sum / n).numpy()
    cov = ((metric.real_features_cov_sum - n * torch.outer(metric.real_features_sum / n,
                                                           metric.real_features_sum / n)) / (n - 1)).numpy()
    with pytest.warns(UserWarning, match="only 5 samples for 2048-d features"):
        ours = GaussianStats.of(features)
    np.testing.assert_allclose(mean, ours.mu, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(cov, ours.sigma, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def video_sets(tmp_path_factory):
    """20 shapes clips (16 frames: an image drifting right) from each of two seeds, and noise clips."""
    root = tmp_path_factory.mktemp("videos")

    def clips(seed: int) -> np.ndarray:
        return np.stack([np.stack([np.roll(im, f, axis=1) for f in range(16)]) for im in shapes(seed, 20)])

    np.savez(root / "a.npz", arr_0=clips(30))
    np.savez(root / "b.npz", arr_0=clips(31))
    np.savez(root / "noise.npz", arr_0=np.random.default_rng(0).integers(0, 256, (20, 16, 64, 64, 3), np.uint8))
    return root


def run_json(args: list[str], capsys) -> dict:
    assert main(args + ["--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1  # one JSON object on one line
    return json.loads(out[0])


def fvd(real, fake, capsys, *extra: str) -> dict:
    return run_json(["eval", "fvd", "--real", str(real), "--fake", str(fake), "--num-frames", "8", *extra], capsys)


def test_fvd_over_video_sets_and_stats_files(video_sets, tmp_path, capsys) -> None:
    r = video_sets
    same = fvd(r / "a.npz", r / "a.npz", capsys, "--kid-subsets", "2")
    assert same["fvd"] == pytest.approx(0, abs=1e-3) and same["resolution_real"] == [8, 64, 64]
    close = fvd(r / "a.npz", r / "b.npz", capsys, "--kid-subsets", "2")
    far = fvd(r / "a.npz", r / "noise.npz", capsys, "--kid-subsets", "2")
    assert far["fvd"] > 10 * close["fvd"] > 0 and far["kvd_mean"] > close["kvd_mean"]
    assert close["features"] == "shapes-video" and close["num_frames"] == 8 and close["n_real"] == 20
    assert any("only 20 samples for 128-d features" in w for w in close["warnings"])
    stats = run_json(["eval", "stats", "--videos", str(r / "a.npz"), "--out", str(tmp_path / "a_stats.npz"),
                      "--num-frames", "8"], capsys)
    assert stats["count"] == 20 and stats["resolution"] == [8, 64, 64] and stats["features"] == "shapes-video"
    from_stats = fvd(tmp_path / "a_stats.npz", r / "b.npz", capsys)
    assert from_stats["fvd"] == pytest.approx(close["fvd"], rel=1e-12) and from_stats["kvd_mean"] is None


def test_kvd_records_its_subset_size_and_refuses_one_larger_than_a_set(video_sets, monkeypatch, capsys) -> None:
    r = video_sets
    default = fvd(r / "a.npz", r / "b.npz", capsys, "--kid-subsets", "2")
    assert (default["kvd_subset_size"], default["kvd_subsets"]) == (20, 2) and default["kvd_std"] < 1e-12
    assert ("KVD uses subsets of 20 samples, the smaller set's size, instead of 1000: it compares only with KVD on "
            "subsets of 20; every subset is a whole set, so kvd_std is 0") in default["warnings"]
    chosen = fvd(r / "a.npz", r / "b.npz", capsys, "--kid-subsets", "3", "--kid-subset-size", "10")
    assert (chosen["kvd_subset_size"], chosen["kvd_subsets"]) == (10, 3) and chosen["kvd_std"] > 0
    assert not any("KVD uses subsets" in w for w in chosen["warnings"])
    monkeypatch.setattr("vgen.eval.evaluate.side_stats", lambda *a: pytest.fail("features computed"))
    assert main(["eval", "fvd", "--real", str(r / "a.npz"), "--fake", str(r / "b.npz"), "--kid-subset-size", "21"]) == 2
    assert capsys.readouterr().err == (f"vgen: error: {r / 'a.npz'} holds 20 videos, fewer than the KVD subset size "
                                       f"of 21: pass a subset size of at most 20\n")


def test_a_stats_file_that_is_not_finite_fails_in_one_line_without_a_result(tmp_path, capsys) -> None:
    np.savez(tmp_path / "nan.npz", mu=np.array([np.nan, 0.0, 0.0]), sigma=np.eye(3))
    GaussianStats(np.zeros(3), np.eye(3), 10, "shapes", (64, 64)).save(str(tmp_path / "ok.npz"))
    assert main(["eval", "fid", "--real", str(tmp_path / "nan.npz"), "--fake", str(tmp_path / "ok.npz"), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"vgen: error: {tmp_path / 'nan.npz'}: the statistics' mu holds 1 NaN or infinite values; "
                            f"recompute them\n")


def test_warnings_reach_stderr_and_the_result_is_one_line(video_sets, capsys) -> None:
    r = video_sets
    assert main(["eval", "fvd", "--real", str(r / "a.npz"), "--fake", str(r / "b.npz"), "--num-frames", "4",
                 "--kid-subsets", "2"]) == 0
    captured = capsys.readouterr()
    assert "vgen: warning: real and fake: only 20 samples for 128-d features" in captured.err
    assert re.fullmatch(r"FVD \d+\.\d{3}, KVD \S+ ± \S+ \(shapes-video features; 20 real and 20 fake videos of 4 "
                        r"frames\)\n", captured.out)


def test_sides_made_differently_are_refused(video_sets, tmp_path, capsys) -> None:
    r = video_sets
    images = shapes(40, 12)
    np.savez(tmp_path / "images.npz", arr_0=images)
    np.savez(tmp_path / "images32.npz", arr_0=images[:, ::2, ::2])
    rng = np.random.default_rng(0)
    GaussianStats(np.zeros(192), np.eye(192), 10, "inception", (64, 64), "ab" * 32).save(str(tmp_path / "inc.npz"))
    GaussianStats(np.zeros(192), np.eye(192), 10, "shapes", (64, 64), "cd" * 32).save(str(tmp_path / "old.npz"))
    GaussianStats(rng.normal(size=192), np.eye(192), 10).save(str(tmp_path / "adm.npz"))  # no provenance
    # video stats of the former per-frame shapes features, recorded as "shapes"
    GaussianStats(np.zeros(192), np.eye(192), 10, "shapes", (8, 64, 64), "cd" * 32).save(str(tmp_path / "frames.npz"))
    cases = [
        (["fid", "--real", str(tmp_path / "images.npz"), "--fake", str(tmp_path / "images32.npz")],
         "differ in resolution (images 64x64 vs images 32x32)"),
        (["fid", "--real", str(tmp_path / "inc.npz"), "--fake", str(tmp_path / "images.npz"), "--features", "shapes"],
         "inc.npz holds statistics of inception features, not shapes"),
        (["fid", "--real", str(tmp_path / "old.npz"), "--fake", str(tmp_path / "images.npz")],
         "the two sides' shapes weights differ: SHA-256 cdcdcdcdcdcd..."),
        (["fvd", "--real", str(r / "a.npz"), "--fake", str(r / "a.npz"), "--num-frames", "20"],
         "has 16 frames; the evaluation needs 20 per video"),
        (["fvd", "--real", str(tmp_path / "frames.npz"), "--fake", str(r / "a.npz"), "--num-frames", "8"],
         "frames.npz holds statistics of shapes features, not shapes-video"),
        (["fvd", "--real", str(tmp_path / "frames.npz"), "--fake", str(r / "a.npz"), "--features", "shapes"],
         "frames.npz holds statistics of shapes features, not shapes-video"),
        (["fvd", "--real", str(r / "a.npz"), "--fake", str(r / "a.npz"), "--features", "inception"],
         "feature set 'inception' is for images, not videos; for videos use shapes or i3d"),
    ]
    for args, message in cases:
        assert main(["eval", *args]) == 2, args
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith("vgen: error: ") and message in err, err
    adm = run_json(["eval", "fid", "--real", str(tmp_path / "adm.npz"), "--fake", str(tmp_path / "images.npz")],
                   capsys)
    assert any("real statistics record no feature set" in w for w in adm["warnings"])


def test_inception_weights_are_found_checked_and_recorded(inception_layout, seeded, tmp_path, monkeypatch,
                                                          capsys) -> None:
    images = np.random.default_rng(1).integers(0, 256, (3, 40, 40, 3), np.uint8)
    np.savez(tmp_path / "images.npz", arr_0=images)
    stats_args = ["eval", "stats", "--images", str(tmp_path / "images.npz"), "--out", str(tmp_path / "s.npz"),
                  "--features", "inception"]
    monkeypatch.setenv("VGEN_WEIGHTS_DIR", str(tmp_path / "weights"))
    monkeypatch.setattr("vgen.eval.weights.CACHE_DIR", tmp_path / "cache")
    assert main(stats_args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pt_inception-2015-12-05-6726825d.pth" in err and str(tmp_path / "weights") in err
    assert "SHA-256 6726825d0af5f729cebd5821db510b11b1cfad8faad88a03f1befd49fb9129b2" in err
    (tmp_path / "weights").mkdir()
    torch.save(seeded(inception_layout), tmp_path / "weights" / "pt_inception-2015-12-05-6726825d.pth")
    assert main(stats_args) == 2  # seeded weights are not the reference file
    assert "is not the reference Inception-v3 FID weights" in capsys.readouterr().err
    result = run_json(stats_args + ["--no-verify-weights"], capsys)
    assert result["weights_verified"] is False and result["features"] == "inception"
    assert result["resolution"] == [40, 40] and any("only 3 samples for 2048-d" in w for w in result["warnings"])
    saved = GaussianStats.load(str(tmp_path / "s.npz"))
    assert saved.mu.shape == (2048,) and saved.weights_sha256 == result["weights_sha256"]


def test_a_covariance_that_is_not_one_is_named_in_the_result(tmp_path, capsys) -> None:
    sigma = np.diag([1.0, 1.0, -0.5])  # a damaged stats file: a negative variance
    GaussianStats(np.zeros(3), np.eye(3), 10, "shapes", (64, 64)).save(str(tmp_path / "a.npz"))
    GaussianStats(np.zeros(3), sigma, 10, "shapes", (64, 64)).save(str(tmp_path / "b.npz"))
    result = run_json(["eval", "fid", "--real", str(tmp_path / "a.npz"), "--fake", str(tmp_path / "b.npz")], capsys)
    assert result["sqrt_min_eigenvalue"] == pytest.approx(-0.5)
    assert any("not positive semi-definite" in w for w in result["warnings"])
