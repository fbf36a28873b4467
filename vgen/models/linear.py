"""The linear layer of vgen's models: ``nn.Linear`` whose fp32 inference on a CPU can multiply through oneDNN.

Torch's CPU wheels multiply fp32 matrices with MKL, which takes a generic code path on x86 CPUs not made by Intel.
oneDNN ships in the same wheel and dispatches on the CPU's features; with its weights reordered once into its
own blocked layout ("packed"), a decode step of the embedded default (2 rows) spent 1.4 ms in its products against
MKL's 2.7 ms on a 2-core AMD EPYC with AVX-512, and a 16-position verify pass (32 rows) about half of MKL's time
(``benchmarks/cpu_matmul.py``). ``VGEN_CPU_MATMUL`` picks the library: ``auto`` (the default: oneDNN on AMD
CPUs), ``onednn`` or ``mkl``; :func:`set_cpu_matmul` does the same from Python. A layer marked ``reused`` (a
diffusion head's, whose weights stay in cache over its reverse chain) keeps MKL for its small products.

The packed copy of a weight is made at its first use and kept until the layer is moved or cast or the weight dies
(as much memory again as the fp32 weights), and made again whenever the weight changes: in place (its version
counter moves, as under an optimizer step or ``load_state_dict``) or by a new tensor under the same parameter
(``param.data = ...``). Training (gradients enabled), other dtypes and other devices run ``F.linear``
unchanged; the state-dict keys are ``nn.Linear``'s.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.weak import WeakIdKeyDictionary

CPU_MATMUL_ENV = "VGEN_CPU_MATMUL"
CPU_MATMUL_CHOICES = ("auto", "onednn", "mkl")


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


SMALL_PRODUCT_MACS = 2**19
"""A reused layer's products of at most this many multiply-adds (rows x in x out) stay with ``F.linear``: with
its weight in cache, a oneDNN call's fixed cost (about 10 us more than MKL's) outweighs its faster arithmetic.
``benchmarks/cpu_matmul.py`` (weights in cache) on the 2-core AMD EPYC: MKL is faster for every product of the
embedded models' shapes up to 2^19 multiply-adds (a 256 x 256 weight on 2 rows: 7 against 16 us; on 8 rows: 15
against 17), oneDNN for every larger one."""

_ONEDNN: bool | None = None  # read from VGEN_CPU_MATMUL when the first layer is made
_PACKED: WeakIdKeyDictionary = WeakIdKeyDictionary()  # weight -> (what it was when packed, packed copy)


def set_cpu_matmul(choice: str) -> None:
    """Pick the library of fp32 CPU inference products for this process (``auto``, ``onednn`` or ``mkl``)."""
    global _ONEDNN
    _ONEDNN = resolve_cpu_matmul(choice)


def uses_onednn() -> bool:
    """Whether fp32 CPU inference products go through oneDNN in this process (``VGEN_CPU_MATMUL`` unless
    :func:`set_cpu_matmul` said otherwise)."""
    global _ONEDNN
    if _ONEDNN is None:
        _ONEDNN = resolve_cpu_matmul(os.environ.get(CPU_MATMUL_ENV, "auto"))
    return _ONEDNN


def packed_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` in oneDNN's blocked layout, made once per content of the weight: its storage (held weakly, so
    that a freed one is never mistaken for a new one at the same address), place in it and version."""
    state = (StorageWeakRef(weight.untyped_storage()), weight.data_ptr(), weight.shape, weight._version)
    seen, packed = _PACKED.get(weight, (None, None))
    if seen is None or seen[0].expired() or seen != state:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
        _PACKED[weight] = (state, packed)
    return packed


def linear_onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` through oneDNN with the weight's packed copy."""
    return torch.ops.mkldnn._linear_pointwise(x, packed_weight(weight), bias, "none", [], "")


# ``linear_onednn`` as an op that ``torch.compile`` calls as it is at run time (where the packed copy is looked up):
# Inductor's own lowering of oneDNN's linear wants weights frozen into the graph. Defined through a library
# rather than ``torch.library.custom_op``, whose Python wrapper costs about 6 us more a call.
_OPS = torch.library.Library("vgen", "DEF")
_OPS.define("linear_onednn(Tensor x, Tensor weight, Tensor? bias) -> Tensor")
_OPS.impl("linear_onednn", linear_onednn, "CPU")


@torch.library.register_fake("vgen::linear_onednn", lib=_OPS)
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


class Linear(nn.Linear):
    """``nn.Linear``; in fp32 inference on a CPU, through oneDNN when this process uses it (:func:`uses_onednn`).
    Moving or casting the layer (``to``, ``cuda``, ``half``, ...) drops its packed copy.

    ``reused``: the layer runs many times back to back on a few rows (a diffusion head's reverse chain), so its
    weight stays in cache and its small products (:data:`SMALL_PRODUCT_MACS`) go through ``F.linear``. A model's
    other layers stream their weights from memory, where oneDNN is faster even on one row."""

    def __init__(self, *args, reused: bool = False, **kwargs) -> None:
        uses_onednn()  # reads VGEN_CPU_MATMUL here, where a bad value is an error of the command that builds a model
        super().__init__(*args, **kwargs)
        self.reused = reused

    def _apply(self, fn, recurse: bool = True):
        _PACKED.pop(self.weight, None)
        return super()._apply(fn, recurse)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (_ONEDNN and x.device.type == "cpu" and x.dtype == torch.float32 and self.weight.dtype == torch.float32
                and not torch.is_grad_enabled()
                and not (self.reused and x.numel() // x.shape[-1] * self.weight.numel() <= SMALL_PRODUCT_MACS)):
            if torch.compiler.is_compiling():
                return torch.ops.vgen.linear_onednn(x, self.weight, self.bias)
            return linear_onednn(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)
