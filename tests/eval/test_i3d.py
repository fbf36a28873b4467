"""I3D for FVD: pytorch-i3d's key layout, VideoGPT / TATS' network and TATS' preprocessing (their outputs for the
same seeded weights, see data/README.md), StyleGAN-V's TorchScript calling convention, and TorchScript files run
only when trusted."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vgen.apps.cli import main
from vgen.eval.i3d import I3DFeatures, InceptionI3d, preprocess
from vgen.eval.weights import WeightsError, is_torchscript, sha256_of

REFERENCE = np.load(os.path.join(os.path.dirname(__file__), "data", "reference_outputs.npz"))


def test_parameter_names_and_shapes_are_the_reference_layout(i3d_layout) -> None:
    mine = {k: tuple(v.shape) for k, v in InceptionI3d().state_dict().items() if not k.endswith("num_batches_tracked")}
    assert mine == i3d_layout and len(mine) == 287


@pytest.fixture(scope="module")
def weights_file(i3d_layout, seeded, tmp_path_factory):
    """Seeded weights saved as TATS' file is: a plain state dict without BatchNorm counters."""
    path = tmp_path_factory.mktemp("i3d") / "i3d_pretrained_400.pt"
    torch.save(seeded(i3d_layout), path)
    return path


def test_logits_equal_videogpt_tats_for_the_same_weights(weights_file, reference_inputs) -> None:
    _, videos = reference_inputs
    features = I3DFeatures(weights_file)(videos)
    assert features.shape == (1, 400) and features.dtype == np.float64
    np.testing.assert_allclose(features, REFERENCE["i3d_logits"], rtol=1e-5, atol=1e-4)


def test_preprocess_is_bilinear_224_in_minus_one_one() -> None:
    videos = torch.full((2, 3, 10, 12, 3), 51, dtype=torch.uint8)
    videos[1] = 255
    x = preprocess(videos)
    assert x.shape == (2, 3, 3, 224, 224) and x.dtype == torch.float32
    assert torch.allclose(x[0], torch.tensor(2 * 51 / 255 - 1)) and torch.allclose(x[1], torch.tensor(1.0))
    ramp = torch.arange(8, dtype=torch.uint8).repeat(4, 1)[None, None, :, :, None].expand(1, 1, 4, 8, 3)
    expected = F.interpolate(ramp[0, 0].permute(2, 0, 1)[None].float(), size=(224, 224), mode="bilinear",
                             align_corners=False)[0] * (2 / 255) - 1
    assert torch.allclose(preprocess(ramp)[0, :, 0], expected)


class StyleGANVStandIn(torch.nn.Module):
    """A TorchScript with the interface of StyleGAN-V's i3d_torchscript.pt: uint8 [B, C, T, H, W] in, rescaled and
    resized inside when asked, 400 pre-softmax features out. It refuses any other call."""

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor, rescale: bool = False, resize: bool = False,
                return_features: bool = False) -> torch.Tensor:
        if x.dtype != torch.uint8 or x.shape[1] != 3 or not (rescale and resize and return_features):
            raise RuntimeError("called unlike StyleGAN-V")
        b, c, t, h, w = x.shape
        frames = x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w).float()
        frames = F.interpolate(frames, size=(224, 224), mode="bilinear", align_corners=False)
        return self.net(frames.reshape(b, t, c, 224, 224).transpose(1, 2) * (2 / 255) - 1)


def test_a_torchscript_file_is_called_as_stylegan_v_calls_it(weights_file, reference_inputs, tmp_path) -> None:
    _, videos = reference_inputs
    state_dict_model = I3DFeatures(weights_file)
    traced = torch.jit.trace(state_dict_model.model, preprocess(torch.from_numpy(videos)), check_trace=False)
    torch.jit.save(torch.jit.script(StyleGANVStandIn(traced)), tmp_path / "i3d_torchscript.pt")
    assert is_torchscript(tmp_path / "i3d_torchscript.pt") and not is_torchscript(weights_file)
    scripted = I3DFeatures(tmp_path / "i3d_torchscript.pt", trust_torchscript=True)
    assert scripted.torchscript
    np.testing.assert_allclose(scripted(videos), REFERENCE["i3d_logits"], rtol=1e-5, atol=1e-4)


def test_bad_weight_files_are_named(tmp_path, i3d_layout, seeded) -> None:
    state = seeded(i3d_layout)
    state["logits.conv3d.weight"] = torch.zeros(600, 1024, 1, 1, 1)  # a 600-class (Kinetics-600) head
    torch.save(state, tmp_path / "k600.pt")
    with pytest.raises(WeightsError, match=r"do not fit I3D .*wrong shape 1 \(logits.conv3d.weight\)"):
        I3DFeatures(tmp_path / "k600.pt")
    (tmp_path / "junk.pt").write_bytes(b"\x00" * 64)
    with pytest.raises(WeightsError, match="^cannot read weights file .*junk.pt: the file is corrupt or not a checkp"):
        I3DFeatures(tmp_path / "junk.pt")


class Constant(torch.nn.Module):
    """A crafted "I3D" with StyleGAN-V's signature: the same features for every clip, so every FVD is 0."""

    def forward(self, x: torch.Tensor, rescale: bool = False, resize: bool = False,
                return_features: bool = False) -> torch.Tensor:
        return torch.zeros(x.shape[0], 400)


def test_a_torchscript_file_runs_only_when_trusted(tmp_path, monkeypatch, capsys) -> None:
    crafted = tmp_path / "i3d_torchscript.pt"
    torch.jit.save(torch.jit.script(Constant()), str(crafted))
    videos = np.random.default_rng(0).integers(0, 256, (4, 16, 8, 8, 3), np.uint8)
    np.savez(tmp_path / "a.npz", arr_0=videos)
    np.savez(tmp_path / "b.npz", arr_0=255 - videos)
    fvd = ["eval", "fvd", "--real", str(tmp_path / "a.npz"), "--fake", str(tmp_path / "b.npz"), "--features", "i3d",
           "--weights", str(crafted)]
    with monkeypatch.context() as m:
        m.setattr(torch.jit, "load", lambda *a, **k: pytest.fail("an untrusted TorchScript file was loaded"))
        with pytest.raises(WeightsError, match=rf"^{crafted} is a TorchScript file \(SHA-256 {sha256_of(crafted)}\): "
                                               r"loading it runs the code inside it .*pass --trust-torchscript"):
            I3DFeatures(crafted)
        assert main(fvd) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"vgen: error: {crafted} is a TorchScript file")
    assert main(fvd + ["--trust-torchscript", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fvd"] == 0  # what a crafted file can do once trusted
