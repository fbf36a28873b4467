"""Ctrl-C and SIGTERM as requests: long loops (training, streaming) finish the unit of work in hand, save or
write it, and then stop, instead of dying half-way through a write."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def graceful_stop() -> Iterator[Callable[[], bool]]:
    """Turn Ctrl-C / SIGTERM into a request that the loop honours after the current step (then it saves).
    Outside the main thread signals cannot be caught, and nothing is ever requested."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    previous = {sig: signal.signal(sig, lambda signum, frame: received.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield lambda: bool(received)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
