"""What the samplers share to run their steps under ``torch.compile``: the accepted modes and the static caches.

``compile`` is False (eager), True (mode ``"default"``) or a ``torch.compile`` mode name. The CUDA-graph modes
(``"reduce-overhead"``, ``"max-autotune"``) replay captured graphs, which read their inputs at fixed addresses:
a sampler running under them takes its KV cache from one store per model (:func:`take_static_cache`), whose
buffers are marked static and reused by the next call with the same shape, dtype and device.
"""

from __future__ import annotations

import functools
import types
import weakref
from collections.abc import Callable, Hashable

import torch

from vgen.models.cache import KVCache

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
COMPILE_HELP = "torch.compile the sampler's step (slow first call); from Python also a torch.compile mode name"


def check_compile(value: bool | str) -> None:
    """Refuse a ``compile`` setting that is neither a bool nor one of :data:`COMPILE_MODES`."""
    if not isinstance(value, bool) and value not in COMPILE_MODES:
        raise ValueError(f"compile must be a bool, got {value!r} (or one of torch.compile's modes "
                         f"{list(COMPILE_MODES)})")


def compile_mode(value: bool | str) -> str | None:
    """The ``torch.compile`` mode a ``compile`` setting names, None when the step runs eagerly."""
    if isinstance(value, str):
        return value
    return "default" if value else None


@functools.cache
def compile_step(step: Callable, mode: str, config: Hashable = None) -> Callable:
    """``step`` compiled for ``mode`` and a sampler configuration ``config`` (a sampler's options and what else
    sets its graphs apart), built once per process; graphs are made on first call. Under CUDA graphs every shape
    is static; otherwise a size that changes between calls (a verify pass's ``image_end``, a decode step's cache
    length) turns dynamic, so one more graph serves every value.

    Each configuration compiles a copy of ``step`` with a code object of its own. Dynamo keeps the graphs of one
    code object together and, past its recompile limit (8), fails a ``fullgraph`` compile; code that specialises
    on a setting (the speculative drafters on their window length) would reach it on a shared one in a process
    that sweeps the setting."""
    own = types.FunctionType(step.__code__.replace(), step.__globals__, step.__name__, step.__defaults__,
                             step.__closure__)
    return torch.compile(own, mode=mode, dynamic=False if mode in CUDA_GRAPH_MODES else None, fullgraph=True)


# one cache per model for the CUDA-graph modes, with the extra slots it was made with; taken out while in use, so
# concurrent calls never share one
_STATIC_CACHES: weakref.WeakKeyDictionary[torch.nn.Module, tuple[KVCache, int]] = weakref.WeakKeyDictionary()


def take_static_cache(model: torch.nn.Module, rows: int, extra: int = 0) -> KVCache:
    """The model's stored cache for ``rows`` rows and ``extra`` slots past the image (a new one, its buffers
    marked static, when the stored one differs in either, in dtype or in device), emptied; hand it back with
    :func:`keep_static_cache`."""
    cache, made_with = _STATIC_CACHES.pop(model, (None, None))
    p = next(model.parameters())
    if (cache is None or made_with != extra or cache.batch_size != rows or cache.keys[0].dtype != p.dtype
            or cache.keys[0].device != p.device):
        cache = model.new_cache(rows, extra=extra)
        for buffer in cache.buffers():
            torch._dynamo.mark_static_address(buffer)
    cache.crop(0)
    return cache


def keep_static_cache(model: torch.nn.Module, cache: KVCache, extra: int = 0) -> None:
    """Store ``cache`` (made with ``extra`` slots) as the model's static cache for the next call."""
    _STATIC_CACHES[model] = (cache, extra)


def static_cache(model: torch.nn.Module) -> KVCache | None:
    """The model's stored static cache, if any."""
    return _STATIC_CACHES.get(model, (None, None))[0]
