"""Image sets in every accepted layout, the shapes domain features, and ``vgen eval fid|stats`` end to end: two
samples of the shapes data are close, shapes against noise are far apart."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vgen.apps.cli import main
from vgen.data.shapes import sample_image
from vgen.eval.features import extract, is_stats_file, load_extractor, load_images, shapes_features
from vgen.eval.fid import GaussianStats, frechet_distance


def shapes(seed: int, n: int) -> np.ndarray:
    return np.stack([sample_image(seed, i)[0] for i in range(n)])


@pytest.fixture(scope="module")
def image_sets(tmp_path_factory):
    root = tmp_path_factory.mktemp("sets")
    a, b = shapes(10, 96), shapes(11, 96)
    noise = np.random.default_rng(0).integers(0, 256, size=(96, 64, 64, 3), dtype=np.uint8)
    (root / "a").mkdir()
    for i, im in enumerate(a):
        Image.fromarray(im).save(root / "a" / f"{i:03d}.png")
    np.savez(root / "b.npz", arr_0=b)
    np.save(root / "noise.npy", noise)
    return root, a


def test_every_layout_loads_the_same_uint8_images(image_sets) -> None:
    root, a = image_sets
    assert np.array_equal(load_images(root / "a"), a)
    assert load_images(root / "b.npz").shape == (96, 64, 64, 3) and load_images(root / "noise.npy").dtype == np.uint8


def test_bad_image_sets_are_named(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="image set not found"):
        load_images(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no images"):
        load_images(tmp_path / "empty")
    np.savez(tmp_path / "x.npz", images=np.zeros((2, 8, 8, 3), np.uint8))
    with pytest.raises(ValueError, match="no 'arr_0'"):
        load_images(tmp_path / "x.npz")
    np.save(tmp_path / "f.npy", np.zeros((2, 8, 8, 3), np.float32))
    with pytest.raises(ValueError, match="expected uint8 images"):
        load_images(tmp_path / "f.npy")
    with pytest.raises(ValueError, match="unknown feature set 'clip'; available: shapes, inception, i3d"):
        extract("clip", np.zeros((2, 64, 64, 3), np.uint8))
    with pytest.raises(ValueError, match="'i3d' is for videos, not images; for images use shapes or inception"):
        load_extractor("i3d", "images")
    (tmp_path / "mixed").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "mixed" / "a.png")
    Image.new("RGB", (8, 6)).save(tmp_path / "mixed" / "b.png")
    with pytest.raises(ValueError, match=r"images in .*mixed differ in size: 6x8x3 \(b.png\), 8x8x3 \(a.png\)"):
        load_images(tmp_path / "mixed")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "a.png").write_bytes(b"not a png")
    with pytest.raises(ValueError, match="cannot read image .*a.png"):
        load_images(tmp_path / "broken")


def test_an_unreadable_folder_is_named(tmp_path, monkeypatch, capsys) -> None:
    """Permissions cannot be taken from root (the CI user), so the folder listing itself is made to fail."""
    (tmp_path / "locked").mkdir()

    def deny(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "iterdir", deny)
    with pytest.raises(ValueError, match="cannot read folder .*locked: Permission denied"):
        load_images(tmp_path / "locked")
    assert main(["eval", "fid", "--real", str(tmp_path / "locked"), "--fake", str(tmp_path / "locked")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read folder" in err


def test_shapes_features_resize_other_sizes(image_sets) -> None:
    _, a = image_sets
    big = np.stack([np.asarray(Image.fromarray(im).resize((128, 128), Image.BICUBIC)) for im in a[:4]])
    f64, f128 = shapes_features(a[:4]), shapes_features(big)
    assert f64.shape == (4, 192) and np.corrcoef(f64.ravel(), f128.ravel())[0, 1] > 0.9


def test_eval_fid_and_stats_commands(image_sets, tmp_path, capsys) -> None:
    root, _ = image_sets
    assert main(["eval", "fid", "--real", str(root / "a"), "--fake", str(root / "b.npz"), "--kid-subsets", "5",
                 "--kid-subset-size", "50", "--json", str(tmp_path / "close.json")]) == 0
    close = json.loads((tmp_path / "close.json").read_text())
    assert close["n_real"] == close["n_fake"] == 96 and close["kid_mean"] is not None
    assert main(["eval", "stats", "--images", str(root / "a"), "--out", str(tmp_path / "a.npz")]) == 0
    assert is_stats_file(tmp_path / "a.npz")
    assert main(["eval", "fid", "--real", str(tmp_path / "a.npz"), "--fake", str(root / "noise.npy"),
                 "--json", str(tmp_path / "far.json")]) == 0
    far = json.loads((tmp_path / "far.json").read_text())
    assert far["kid_mean"] is None  # one side is a stats file: no KID
    assert far["fid"] > 10 * close["fid"] > 0


def test_eval_errors_are_one_line(tmp_path, capsys) -> None:
    assert main(["eval", "fid", "--real", str(tmp_path / "nope"), "--fake", str(tmp_path / "nope")]) == 2
    assert "image set not found" in capsys.readouterr().err
    assert main(["eval", "stats", "--images", "x", "--out", str(tmp_path / "s.txt")]) == 2
    assert "unsupported file type .txt" in capsys.readouterr().err
    assert main(["eval", "fid", "--real", "a", "--fake", "b", "--features", "clip"]) == 2
    assert "unknown feature set 'clip'" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["fid", "--fake", "x", "--real"], ["stats", "--out", "s.npz", "--images"]],
                         ids=["fid", "stats"])
def test_a_file_named_npz_that_is_not_one_is_named(command, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "samples.npz").write_bytes(b"\x80\x04K\x01.")  # a pickle, which numpy would only unpickle
    assert main(["eval", *command, str(tmp_path / "samples.npz")]) == 2
    assert capsys.readouterr().err == (f"vgen: error: cannot read {tmp_path / 'samples.npz'}: the file is corrupt or "
                                       f"not an .npz archive\n")


def test_shapes_video_features_come_from_the_shipped_network(test_clips) -> None:
    from vgen.eval.classifier import SHIPPED_VIDEO_CLASSIFIER, load_shapes_video_classifier
    from vgen.eval.features import SHAPES_VIDEO, clip_input, shipped_sha256
    from vgen.eval.weights import sha256_of
    from vgen.hub import ASSETS

    clips = test_clips[0][:4]
    extractor = load_extractor("shapes", "videos")
    features = extractor(clips)
    assert features.shape == (4, 128) and features.dtype == np.float64 and extractor.dim == 128
    assert extractor.name == SHAPES_VIDEO and load_extractor(SHAPES_VIDEO, "videos").name == SHAPES_VIDEO
    assert extractor.weights_sha256 == shipped_sha256(SHIPPED_VIDEO_CLASSIFIER) == sha256_of(
        ASSETS / SHIPPED_VIDEO_CLASSIFIER / "model.safetensors")
    model = load_shapes_video_classifier().eval()
    with torch.no_grad():
        expected = model.features(clip_input(clips, model)).double().numpy()
    np.testing.assert_allclose(features, expected, rtol=1e-6)


def test_shapes_fvd_tells_real_motion_from_shuffled_and_frozen_frames(test_clips) -> None:
    """Two disjoint sets of real clips are close in the video features; the same clips with their frames shuffled
    or one frame frozen are far, though they show the same frames (the former per-frame features averaged over time
    gave shuffled clips exactly the features of the originals)."""
    clips = test_clips[0]
    a, b = clips[:64], clips[64:]
    rng = np.random.default_rng(0)
    shuffled = np.stack([c[rng.permutation(len(c))] for c in b])
    frozen = np.stack([c[[rng.integers(len(c))] * len(c)] for c in b])
    extractor = load_extractor("shapes", "videos")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 64 clips for 128-d features
        real = GaussianStats.of(extractor(a))
        fvd = {name: frechet_distance(real, GaussianStats.of(extractor(v))).fid
               for name, v in (("real", b), ("shuffled", shuffled), ("frozen", frozen))}
    assert fvd["shuffled"] > 10 * fvd["real"] and fvd["frozen"] > 10 * fvd["real"], fvd  # measured 1.1, 51, 50
    per_frame_mean = [shapes_features(v.reshape(-1, *v.shape[2:])).reshape(8, 16, -1).mean(1)
                      for v in (b[:8], shuffled[:8])]
    np.testing.assert_allclose(*per_frame_mean, rtol=1e-6, atol=1e-9)
