"""vgen's linear layer: fp32 CPU inference multiplies through oneDNN with a packed copy of the weight when the
process uses it, with nn.Linear's results and keys, compiled or not; the copy follows in-place changes of the
weight; training and the MKL choice run F.linear."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from vgen.models import linear as linear_module
from vgen.models.linear import Linear, packed_weight, resolve_cpu_matmul, set_cpu_matmul, uses_onednn

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@pytest.fixture
def matmul_choice():
    """Set the process's choice for one test and put the original back."""
    before = "onednn" if uses_onednn() else "mkl"
    yield set_cpu_matmul
    set_cpu_matmul(before)


def ops_run(fn) -> set[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {event.key for event in prof.key_averages()}


@needs_onednn
@pytest.mark.parametrize("bias", [False, True])
def test_inference_goes_through_onednn_and_equals_nn_linear(matmul_choice, bias) -> None:
    matmul_choice("onednn")
    torch.manual_seed(0)
    layer, reference = Linear(24, 40, bias=bias), nn.Linear(24, 40, bias=bias)
    reference.load_state_dict(layer.state_dict())
    x = torch.randn(2, 3, 24)
    with torch.no_grad():
        ops = ops_run(lambda: layer(x))
        torch.testing.assert_close(layer(x), reference(x), rtol=1e-5, atol=1e-5)
    assert "mkldnn::_linear_pointwise" in ops


@needs_onednn
def test_a_reused_layer_runs_its_small_products_through_f_linear(matmul_choice) -> None:
    """A diffusion head's layers: a product of at most SMALL_PRODUCT_MACS multiply-adds through F.linear, a larger
    one through oneDNN; a layer not marked reused takes oneDNN for both."""
    matmul_choice("onednn")
    reused, plain = Linear(256, 256, reused=True), Linear(256, 256)
    small, large = torch.randn(8, 256), torch.randn(9, 256)  # 8 x 256 x 256 = SMALL_PRODUCT_MACS
    assert linear_module.SMALL_PRODUCT_MACS == 8 * 256 * 256
    with torch.no_grad():
        assert "mkldnn::_linear_pointwise" not in ops_run(lambda: reused(small))
        assert "mkldnn::_linear_pointwise" in ops_run(lambda: reused(large))
        assert "mkldnn::_linear_pointwise" in ops_run(lambda: plain(small))


@needs_onednn
def test_training_and_the_mkl_choice_run_f_linear(matmul_choice) -> None:
    matmul_choice("onednn")
    layer = Linear(8, 16, bias=False)
    x = torch.randn(16, 8)
    out = layer(x)  # gradients enabled: F.linear, which backpropagates
    out.sum().backward()
    assert layer.weight.grad is not None
    with torch.no_grad():
        matmul_choice("mkl")
        assert "mkldnn::_linear_pointwise" not in ops_run(lambda: layer(x))


@needs_onednn
def test_compiled_inference_equals_eager_through_the_library_op(matmul_choice) -> None:
    matmul_choice("onednn")
    torch.manual_seed(0)
    layer = Linear(32, 48)
    x = torch.randn(8, 32)
    with torch.no_grad():
        compiled = torch.compile(layer, fullgraph=True)
        torch.testing.assert_close(compiled(x), layer(x), rtol=0, atol=0)


@needs_onednn
def test_the_packed_copy_is_made_once_and_again_when_the_weight_changes(matmul_choice) -> None:
    matmul_choice("onednn")
    layer = Linear(16, 32, bias=False)
    x = torch.randn(5, 16)
    with torch.no_grad():
        layer(x)
        first = packed_weight(layer.weight)
        layer(x)
        assert packed_weight(layer.weight) is first
        layer.weight.mul_(-2.0)
        torch.testing.assert_close(layer(x), x @ layer.weight.T, rtol=1e-5, atol=1e-5)
        second = packed_weight(layer.weight)
        assert second is not first
        layer.weight.data = torch.randn(32, 16)  # a new tensor under the same parameter, its version unmoved
        torch.testing.assert_close(layer(x), x @ layer.weight.T, rtol=1e-5, atol=1e-5)
        assert packed_weight(layer.weight) is not second


@needs_onednn
def test_moving_or_casting_the_layer_drops_its_packed_copy(matmul_choice) -> None:
    matmul_choice("onednn")
    layer = Linear(16, 32, bias=False)
    with torch.no_grad():
        layer(torch.randn(3, 16))
    assert layer.weight in linear_module._PACKED  # the store the layer packs into
    layer.double()
    assert layer.weight not in linear_module._PACKED


def test_auto_uses_onednn_on_amd_only_and_bad_choices_are_refused(monkeypatch) -> None:
    available = torch.backends.mkldnn.is_available()
    monkeypatch.setattr(linear_module, "cpu_vendor", lambda: "AuthenticAMD")
    assert resolve_cpu_matmul("auto") is available
    monkeypatch.setattr(linear_module, "cpu_vendor", lambda: "GenuineIntel")
    assert resolve_cpu_matmul("auto") is False
    assert resolve_cpu_matmul("onednn") is available and resolve_cpu_matmul("mkl") is False
    with pytest.raises(ValueError, match="VGEN_CPU_MATMUL must be one of"):
        resolve_cpu_matmul("blas")


def test_a_bad_vgen_cpu_matmul_is_the_command_s_error_not_a_traceback(tmp_path) -> None:
    env = {**os.environ, "VGEN_CPU_MATMUL": "blas"}
    command = [sys.executable, "-m", "vgen", "sample", "--num-images", "1", "--out", str(tmp_path / "x.png")]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    assert "vgen: error: VGEN_CPU_MATMUL must be one of ['auto', 'onednn', 'mkl'], got 'blas'" in run.stderr
    assert "Traceback" not in run.stderr
