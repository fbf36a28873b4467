"""The kernel tests run each Triton kernel on CPU in Triton's interpreter and compare it with its op's torch
reference. ``load_interpreted`` must run before anything imports triton, so it runs at collection."""

from __future__ import annotations

from importlib.util import find_spec

import pytest

from vgen.kernels.dispatch import load_interpreted, use_backend

if find_spec("triton") is not None:  # without importing it
    load_interpreted()


@pytest.fixture
def both():
    """``run(op, *args)`` -> (the op's torch reference output, its Triton kernel's output) on the same inputs."""

    def run(op, *args):
        reference = op.reference(*args)
        with use_backend("triton"):
            return reference, op(*args)

    return run

