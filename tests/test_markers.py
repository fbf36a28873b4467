"""The test run's markers: a test marked ``gpu`` is skipped, with its reason, where there is no CUDA device, so
that no marker expression is needed to leave them out (``pytest -m "not slow"`` works as written)."""

from __future__ import annotations

import pytest
import torch


def test_the_default_options_select_no_markers(pytestconfig: pytest.Config) -> None:
    assert not [option for option in pytestconfig.getini("addopts") if option.startswith("-m")]


def test_gpu_tests_are_skipped_with_their_reason_where_there_is_no_cuda(request: pytest.FixtureRequest) -> None:
    gpu = [item for item in request.session.items if item.get_closest_marker("gpu")]
    assert gpu  # this file's own below, at least
    skips = [[m.kwargs.get("reason") for m in item.iter_markers("skip")] for item in gpu]
    if torch.cuda.is_available():
        assert not any(skips)
    else:
        assert all(any("needs a CUDA device" in str(reason) for reason in reasons) for reasons in skips)


@pytest.mark.gpu
def test_a_gpu_test_sees_cuda() -> None:
    assert torch.cuda.is_available()
