"""The linear layer of vgen's models: ``nn.Linear`` whose fp32 inference on a CPU can multiply through oneDNN.

Torch's CPU wheels multiply fp32 matrices with MKL, which takes a generic code path on x86 CPUs not made by Intel:
on a 2-core AMD EPYC with AVX-512, a [32, 256] x [256, 1408] product ran at 94 GFLOP/s through MKL and at 167
through oneDNN (which ships in the same wheel and dispatches on the CPU's features), and MKL's time grew with every row
where oneDNN's barely did. oneDNN reorders the weight on every call, so with fewer than
:data:`MIN_ONEDNN_ROWS` rows MKL stays the faster one. ``VGEN_CPU_MATMUL`` picks the library: ``auto`` (the
default: oneDNN on AMD CPUs), ``onednn`` or ``mkl``; :func:`set_cpu_matmul` does the same from Python. Training
(gradients enabled), other dtypes and other devices run ``F.linear`` unchanged; the state-dict keys are
``nn.Linear``'s.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

CPU_MATMUL_ENV = "VGEN_CPU_MATMUL"
CPU_MATMUL_CHOICES = ("auto", "onednn", "mkl")
MIN_ONEDNN_ROWS = 4  # below this, MKL's fp32 product is the faster one on the CPUs measured


def cpu_vendor() -> str:
    """The CPU's vendor id from ``/proc/cpuinfo`` (``AuthenticAMD``, ``GenuineIntel``, ...), "" where unknown."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def resolve_cpu_matmul(choice: str) -> bool:
    """Whether fp32 CPU inference multiplies through oneDNN under ``choice`` (one of :data:`CPU_MATMUL_CHOICES`)."""
    if choice not in CPU_MATMUL_CHOICES:
        raise ValueError(f"{CPU_MATMUL_ENV} must be one of {list(CPU_MATMUL_CHOICES)}, got {choice!r}")
    if choice == "mkl" or not torch.backends.mkldnn.is_available():
        return False
    return choice == "onednn" or cpu_vendor() == "AuthenticAMD"


_ONEDNN = resolve_cpu_matmul(os.environ.get(CPU_MATMUL_ENV, "auto"))


def set_cpu_matmul(choice: str) -> None:
    """Pick the library of fp32 CPU inference products for this process (``auto``, ``onednn`` or ``mkl``)."""
    global _ONEDNN
    _ONEDNN = resolve_cpu_matmul(choice)


def uses_onednn() -> bool:
    """Whether fp32 CPU inference products with enough rows go through oneDNN in this process."""
    return _ONEDNN


@torch.library.custom_op("vgen::onednn_linear", mutates_args=())
def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` through oneDNN. A custom op, so that ``torch.compile`` calls it as it is: Inductor's own
    lowering of oneDNN's linear wants weights frozen into the graph."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


@onednn_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


class Linear(nn.Linear):
    """``nn.Linear``; in fp32 inference on a CPU with at least :data:`MIN_ONEDNN_ROWS` rows, through oneDNN when
    this process uses it (:func:`uses_onednn`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (_ONEDNN and x.device.type == "cpu" and x.dtype == torch.float32 and self.weight.dtype == torch.float32
                and not torch.is_grad_enabled() and x.numel() >= MIN_ONEDNN_ROWS * x.shape[-1]):
            if torch.compiler.is_compiling():
                return onednn_linear(x, self.weight, self.bias)
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)
