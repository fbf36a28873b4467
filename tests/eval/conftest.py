"""Shared by the feature-extractor tests: reference key layouts and deterministic random weights in them.

``data/*_layout.json`` list every tensor (name -> shape) of the reference implementations' state dicts, dumped
from torch-fidelity 0.4.0's ``FeatureExtractorInceptionV3`` and VideoGPT's ``pytorch_i3d.InceptionI3d`` (the
layout of TATS' converted ``i3d_pretrained_400.pt``, which has no ``num_batches_tracked``). ``data/*_outputs.npz``
hold those implementations' outputs for :func:`seeded_weights` and the inputs the tests build; see
``data/README.md``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

DATA = Path(__file__).parent / "data"


def reference_layout(name: str) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v) for k, v in json.loads((DATA / f"{name}_layout.json").read_text()).items()}


def seeded_weights(layout: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights in ``layout`` that keep activations O(1) through a deep conv net: He-scaled kernels,
    BatchNorm scales and variances in [0.5, 1.5], small shifts and means (tensors drawn in sorted-name order)."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for name in sorted(layout):
        shape = layout[name]
        if name.endswith("num_batches_tracked"):
            state[name] = torch.tensor(0)
        elif name.endswith(("running_var", "bn.weight")):
            state[name] = torch.rand(shape, generator=g) + 0.5
        elif len(shape) > 1:
            state[name] = torch.randn(shape, generator=g) * (2 / float(np.prod(shape[1:]))) ** 0.5
        else:  # biases and running means
            state[name] = torch.randn(shape, generator=g) * 0.1
    return state


@pytest.fixture(scope="session")
def inception_layout() -> dict[str, tuple[int, ...]]:
    return reference_layout("inception")


@pytest.fixture(scope="session")
def i3d_layout() -> dict[str, tuple[int, ...]]:
    return reference_layout("i3d")


def make_images(n: int = 2) -> np.ndarray:
    """uint8 [n, 37, 53, 3] (odd, non-square sizes exercise the resize)."""
    return np.random.default_rng(7).integers(0, 256, size=(n, 37, 53, 3), dtype=np.uint8)


def make_videos(n: int = 1) -> np.ndarray:
    """uint8 [n, 16, 40, 56, 3]."""
    return np.random.default_rng(8).integers(0, 256, size=(n, 16, 40, 56, 3), dtype=np.uint8)


@pytest.fixture(scope="session")
def reference_inputs():
    """(images, videos) the reference outputs were computed on."""
    return make_images(), make_videos()


@pytest.fixture(scope="session")
def seeded():
    """:func:`seeded_weights`."""
    return seeded_weights


@pytest.fixture(scope="session")
def test_clips() -> tuple[np.ndarray, np.ndarray]:
    """128 moving-shapes clips of the test split (never seen in training: 16 frames of 32x32) and their classes."""
    from vgen.data.clips import SPLIT_SEEDS, render_clips

    return render_clips(SPLIT_SEEDS["test"], 0, 128)
