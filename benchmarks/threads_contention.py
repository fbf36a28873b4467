"""Threads on a busy machine: how long ``vgen sample`` (the default model and settings) and ``vgen stream --frames
100`` take with the machine idle and with one core kept busy by another process, for each way of choosing torch's
CPU threads.

Candidates: ``auto`` (the ``vgen`` command's default: the cores not busy elsewhere when it starts), ``all`` (every
core, torch's own default), ``1`` (one thread) and ``all-passive`` (every core, with ``OMP_WAIT_POLICY=passive``:
OpenMP threads sleep instead of spinning while they wait). Each run is a fresh ``vgen`` process; its figure is the
command's wall time, imports and model loading included, with the one-minute load average when it started. The
busy core is ``python -c "while True: pass"``. A run past ``--timeout`` seconds is stopped and shown as ``>T``.

    python benchmarks/threads_contention.py --timeout 60     # 16 runs, each stopped after --timeout seconds

The target: every row within 1.5x of its idle time with one core busy.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

CANDIDATES = {"auto": ({}, None), "all": ({}, "cores"), "1": ({}, "1"),
              "all-passive": ({"OMP_WAIT_POLICY": "passive"}, "cores")}
COMMANDS = {"sample": ["sample", "--out", "threads.png"],
            "stream": ["stream", "--frames", "100", "--out", "threads.mp4"]}
TARGET = 1.5


def run_command(words: list[str], env: dict[str, str], threads: str | None, folder: Path,
                timeout: float) -> tuple[float | None, float]:
    """One ``vgen`` run: (wall seconds, None past ``timeout``; the one-minute load average at its start)."""
    args = [sys.executable, "-m", "vgen", *words, "--no-progress", "--overwrite"]
    if threads is not None:
        args += ["--threads", str(os.cpu_count() if threads == "cores" else threads)]
    environment = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    load = os.getloadavg()[0]
    start = time.perf_counter()
    try:
        subprocess.run(args, env={**environment, **env}, cwd=folder, check=True, timeout=timeout,
                       stdout=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, load
    return time.perf_counter() - start, load


def measure(candidates: list[str], commands: list[str], timeout: float) -> list[dict]:
    """For each candidate and command: its idle and its one-busy-core wall time and load averages."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for loaded in (False, True):
            busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if loaded else None
            try:
                if busy is not None:
                    time.sleep(1.0)  # the busy core shows in /proc/stat before the first command starts
                for name in candidates:
                    env, threads = CANDIDATES[name]
                    for command in commands:
                        seconds, load = run_command(COMMANDS[command], env, threads, Path(tmp), timeout)
                        print(f"{name:12s} {command:7s} {'busy' if loaded else 'idle'}: "
                              f"{'>' + str(timeout) if seconds is None else f'{seconds:.1f}'} s (load {load:.2f})",
                              file=sys.stderr)
                        rows.append({"candidate": name, "command": command, "loaded": loaded, "seconds": seconds,
                                     "load": load})
            finally:
                if busy is not None:
                    busy.kill()
                    busy.wait()
    return rows


def cell(seconds: float | None, load: float, timeout: float) -> str:
    return f"{'>' + format(timeout, 'g') if seconds is None else format(seconds, '.1f')} s ({load:.1f})"


def markdown(rows: list[dict], timeout: float) -> str:
    """One line per candidate: each command idle, with one core busy, and the ratio (``>`` where a run timed out);
    the load average at each run's start in brackets."""
    commands = list(dict.fromkeys(r["command"] for r in rows))
    head = ["threads"] + [f"{c} {k}" for c in commands for k in ("idle", "one core busy", "ratio")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in dict.fromkeys(r["candidate"] for r in rows):
        cells = [name]
        for command in commands:
            idle, busy = (next(r for r in rows if r["candidate"] == name and r["command"] == command
                               and r["loaded"] == loaded) for loaded in (False, True))
            if idle["seconds"] is None:
                ratio = "-"
            elif busy["seconds"] is None:
                ratio = f">{timeout / idle['seconds']:.1f}x"
            else:
                ratio = f"{busy['seconds'] / idle['seconds']:.2f}x"
            cells += [cell(idle["seconds"], idle["load"], timeout), cell(busy["seconds"], busy["load"], timeout), ratio]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--candidates", nargs="+", choices=list(CANDIDATES), default=list(CANDIDATES))
    parser.add_argument("--commands", nargs="+", choices=list(COMMANDS), default=list(COMMANDS))
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds after which a run is stopped")
    args = parser.parse_args()
    rows = measure(args.candidates, args.commands, args.timeout)
    print(f"{os.cpu_count()} cores, torch {torch.__version__}; wall time of each command (one-minute load average "
          f"at its start); target: one core busy within {TARGET}x of idle\n")
    print(markdown(rows, args.timeout))


if __name__ == "__main__":
    main()
