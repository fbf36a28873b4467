"""Which implementation an op runs: its Triton kernel or its torch reference.

Every op is its torch reference decorated with :func:`kernel_op`, so the reference is the one copy of the logic
that CPU runs and tests compare the kernel against. In ``auto`` mode (the default) an op runs its Triton kernel
only when

- its first tensor argument is on a CUDA device,
- ``triton`` imports, and
- the op is not disabled by ``VGEN_DISABLE_TRITON`` (``1`` or ``all`` disables every op; otherwise a comma list
  of op names, e.g. ``probs,accept``),

and the kernel supports the call (its launcher returns ``NotImplemented`` for, say, an acceptance rule that
describes itself to no kernel); the reference runs otherwise. :func:`use_backend` forces one side: ``"torch"``, or
``"triton"`` (tests and benchmarks; on CPU tensors the kernels run in Triton's interpreter, set up by
:func:`load_interpreted` before they are imported, since ``@triton.jit`` reads ``TRITON_INTERPRET`` when a kernel
is defined). A forced Triton call that the kernel does not support raises instead of quietly running the
reference.

The launchers live with the references, in the samplers: they turn the samplers' objects into the plain values
of :mod:`vgen.kernels.spec` and import the kernel modules (and with them triton, an optional dependency) at their
first call.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

import torch

BACKENDS = ("auto", "torch", "triton")

_BACKEND: ContextVar[str] = ContextVar("vgen_kernel_backend", default="auto")
_INTERPRETED = False  # set by load_interpreted
F = TypeVar("F", bound=Callable[..., Any])


@functools.cache
def triton_available() -> bool:
    """Whether ``import triton`` works here."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def disabled(op: str) -> bool:
    """Whether ``VGEN_DISABLE_TRITON`` switches ``op``'s kernel off (read at every call)."""
    value = os.environ.get("VGEN_DISABLE_TRITON", "").strip()
    return value in ("1", "all") or op in {name.strip() for name in value.split(",")}


@contextmanager
def use_backend(backend: str) -> Iterator[None]:
    """Within the block, ops run ``backend``: ``"auto"``, ``"torch"`` or ``"triton"`` (forced)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    token = _BACKEND.set(backend)
    try:
        yield
    finally:
        _BACKEND.reset(token)


def choose(op: str, device: torch.device) -> str:
    """``"triton"`` or ``"torch"`` for a call of ``op`` on tensors on ``device`` under the current backend."""
    backend = _BACKEND.get()
    if backend == "torch":
        return "torch"
    if backend == "triton":
        if not triton_available():
            raise RuntimeError(f"backend 'triton' was forced for op {op!r}, but triton does not import; "
                               f"install the extra: pip install -e \".[triton]\"")
        if device.type != "cuda" and not interpreted():
            raise RuntimeError(f"backend 'triton' was forced for op {op!r} on {device.type} tensors, which needs "
                               f"Triton's interpreter: call vgen.kernels.load_interpreted() before using the ops")
        return "triton"
    return "triton" if device.type == "cuda" and triton_available() and not disabled(op) else "torch"


def interpreted() -> bool:
    """Whether the kernels run in Triton's interpreter (:func:`load_interpreted`, or ``TRITON_INTERPRET=1``)."""
    return _INTERPRETED or os.environ.get("TRITON_INTERPRET") == "1"


def load_interpreted() -> None:
    """Run forced Triton calls on CPU tensors in Triton's interpreter (slow: for tests and correctness checks):
    sets ``TRITON_INTERPRET=1`` for the rest of the process (the interpreter reads it at launches too) and imports
    triton and the kernel modules under it. Call it before anything imports triton."""
    global _INTERPRETED
    if _INTERPRETED:
        return
    if "triton" in sys.modules and not interpreted():
        raise RuntimeError("triton was imported before load_interpreted(), so its functions are built for a GPU; "
                           "call load_interpreted() first (or set TRITON_INTERPRET=1 before starting Python)")
    os.environ["TRITON_INTERPRET"] = "1"
    from vgen.kernels import accept, probs, residual  # noqa: F401 (triton, optional, is imported here)
    _INTERPRETED = True


def _device(args: tuple, kwargs: dict) -> torch.device:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.device
    raise TypeError("a kernel op needs at least one tensor argument")


def kernel_op(name: str, launcher: Callable[..., Any]) -> Callable[[F], F]:
    """Decorate a torch reference into op ``name`` whose Triton side is ``launcher``: a function of the same
    signature that hands its kernel plain values (a spec) and returns ``NotImplemented`` where there is no kernel
    for the call. The reference stays reachable as ``op.reference``."""

    def wrap(reference: F) -> F:
        @functools.wraps(reference)
        def op(*args: Any, **kwargs: Any) -> Any:
            if choose(name, _device(args, kwargs)) == "triton":
                out = launcher(*args, **kwargs)
                if out is not NotImplemented:
                    return out
                if _BACKEND.get() == "triton":
                    raise NotImplementedError(f"backend 'triton' was forced, but op {name!r} has no kernel for "
                                              f"these arguments")
            return reference(*args, **kwargs)

        op.reference = reference
        op.op_name = name
        return op

    return wrap
