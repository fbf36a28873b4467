"""How many CPU threads torch computes with: a number the user gives, or ``"auto"``, the cores that nothing else is
busy on.

torch's default takes every core. Its OpenMP threads spin while they wait for one another, so a process busy
elsewhere on the machine makes every parallel step wait for the slowest thread: on a shared 2-core machine
``vgen sample`` with both cores did not finish in 60 s where one thread took 8-26 s (docs/performance.md, "Threads
on a busy machine").
``"auto"`` counts the cores in use when vgen starts and leaves them out; with ``OMP_NUM_THREADS`` set it keeps
what the user asked for.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Iterator

import torch

AUTO = "auto"
TORCH_DEFAULT_THREADS = torch.get_num_threads()  # torch's own choice (its physical cores), read before any change
BUSY_INTERVAL_S = 0.05  # how long busy_cores watches the machine


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity), at most torch's own default."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    return max(1, min(cores, TORCH_DEFAULT_THREADS))


def cpu_times() -> tuple[int, int] | None:
    """(busy, total) CPU time of the whole machine in clock ticks from ``/proc/stat``; None where it cannot be read."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


def busy_cores(interval_s: float = BUSY_INTERVAL_S) -> float:
    """How many cores other processes keep busy now: the machine's busy CPU time over ``interval_s`` seconds
    (Linux), else the one-minute load average."""
    before = cpu_times()
    if before is not None:
        time.sleep(interval_s)
        after = cpu_times()
        if after is not None and after[1] > before[1]:
            return (os.cpu_count() or 1) * (after[0] - before[0]) / (after[1] - before[1])
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


@functools.cache
def auto_threads() -> int:
    """The available cores less those busy elsewhere, rounded to the nearest core, at least one; measured once a
    process."""
    return max(1, available_cores() - round(busy_cores()))


def resolve_threads(threads: int | str) -> int:
    """The thread count ``threads`` stands for: a number >= 1 as it is, ``"auto"`` :func:`auto_threads` (or
    torch's current count when ``OMP_NUM_THREADS`` is set)."""
    if threads == AUTO:
        return torch.get_num_threads() if os.environ.get("OMP_NUM_THREADS") else auto_threads()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1 or {AUTO!r}, got {threads!r}")
    return threads


def set_threads(threads: int | str) -> int:
    """Make torch compute with ``threads`` CPU threads (a number, or ``"auto"``: :func:`resolve_threads`) for the
    rest of the process; returns the count set."""
    count = resolve_threads(threads)
    if count != torch.get_num_threads():
        torch.set_num_threads(count)
    return count


@contextlib.contextmanager
def threads_for(threads: int | str) -> Iterator[int]:
    """:func:`set_threads` while the block runs, the count before it restored after (a command run inside a longer
    process, such as a test, leaves its thread count as it found it)."""
    previous = torch.get_num_threads()
    try:
        yield set_threads(threads)
    finally:
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)
