"""Launch settings, argument handling and the launch itself, shared by the kernels."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
import triton

# inside ``recording()``: the launches noted instead of run, as (kernel, args, options)
_RECORDED: ContextVar[list[tuple[Any, tuple, dict]] | None] = ContextVar("vgen_recorded_launches", default=None)


def last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself when its last dimension is contiguous (the kernels take the other strides), else a copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def row_launch(vocab: int) -> dict[str, Any]:
    """Block size and launch options of a program that holds a row of ``vocab`` values in registers: about 16
    values per thread, and no fused multiply-adds, so that rounding follows torch's separate multiply and add."""
    block = triton.next_power_of_2(vocab)
    return {"BLOCK_V": block, "num_warps": min(32, max(4, block // 512)), "enable_fp_fusion": False}


def launch(kernel: Any, grid: tuple[int, ...], *args: Any, **options: Any) -> None:
    """``kernel[grid](*args, **options)``, or inside :func:`recording` only note the call (outputs stay unset)."""
    recorded = _RECORDED.get()
    if recorded is None:
        kernel[grid](*args, **options)
    else:
        recorded.append((kernel, args, options))


@contextmanager
def recording() -> Iterator[list[tuple[Any, tuple, dict]]]:
    """Within the block the launchers run no kernel; the yielded list collects what they would have launched."""
    recorded: list[tuple[Any, tuple, dict]] = []
    token = _RECORDED.set(recorded)
    try:
        yield recorded
    finally:
        _RECORDED.reset(token)
