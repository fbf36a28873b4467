"""The kernel tests run each Triton kernel on CPU in Triton's interpreter and compare it with its op's torch
reference. ``load_interpreted`` must run before anything imports triton, so it runs when this file is loaded (at
collection), except in a run of only the ``gpu`` tests on a CUDA machine (``pytest -m gpu``): there the kernels
compile for the GPU, which the interpreter would replace by host copies."""

from __future__ import annotations

from importlib.util import find_spec

import pytest
import torch

from vgen.kernels.dispatch import load_interpreted, use_backend


def only_gpu_tests_on_cuda(config: pytest.Config) -> bool:
    """Whether CUDA is here and the run's marker expression selects ``gpu`` tests and no unmarked ones."""
    if not torch.cuda.is_available():
        return False
    markexpr = config.getoption("markexpr", default="") or ""
    try:
        from _pytest.mark.expression import Expression

        expression = Expression.compile(markexpr)
        return expression.evaluate(lambda name, **_: name == "gpu") and not expression.evaluate(lambda name, **_: False)
    except Exception:  # another pytest's private API: the plain spelling still counts
        return markexpr.strip() == "gpu"


def pytest_configure(config: pytest.Config) -> None:  # called as soon as this file loads
    if find_spec("triton") is not None and not only_gpu_tests_on_cuda(config):  # find_spec: without importing it
        load_interpreted()


@pytest.fixture
def both():
    """``run(op, *args)`` -> (the op's torch reference output, its Triton kernel's output) on the same inputs."""

    def run(op, *args):
        reference = op.reference(*args)
        with use_backend("triton"):
            return reference, op(*args)

    return run
