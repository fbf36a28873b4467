"""The README's commands run as written on a fresh clone: every ``vgen`` command of its shell blocks parses, and
those of blocks that need no downloaded weights (a block that does says so in its first line) run in order in an
empty folder, as does its first Python block. Only their counts are cut (:data:`CAPS`; ``vgen sample`` draws one
image or clip) and they compute on one thread (the test shares the machine), so that the run fits the test budget.
``vgen app`` starts a server and ``vgen bench`` runs four samplers with FID (tests/apps/test_bench_cli.py runs
it): both are parsed only."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import torch

from vgen.apps.cli import build_parser, main
from vgen.threads import threads_for

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
NEEDS_WEIGHTS = "# needs downloaded weights"
CAPS = {"--num-images": 1, "--num-samples": 2, "--num": 8, "--frames": 8, "--num-frames": 8}
"""The most of each count flag the run test draws; every other argument is as written."""
PYTHON_CAPS = {"num_frames": 4}
PARSED_ONLY = {"app", "bench"}


def blocks(language: str) -> list[str]:
    return [body for lang, body in BLOCK.findall(README.read_text(encoding="utf-8")) if lang == language]


def vgen_commands(line: str) -> list[list[str]]:
    """The ``vgen`` commands of a shell line as argument lists (comments dropped, each part of an ``&&`` chain on
    its own)."""
    commands, current = [], []
    for word in [*shlex.split(line, comments=True), "&&"]:
        if word == "&&":
            if current and current[0] == "vgen":
                commands.append(current[1:])
            current = []
        else:
            current.append(word)
    return commands


def lines_of(block: str) -> list[str]:
    """One shell block's commands, one a line (a trailing backslash continues a line)."""
    return [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def readme_commands(runnable: bool | None = None) -> list[list[str]]:
    """Every ``vgen`` command of the README's shell blocks in order; with ``runnable``, those of blocks that need
    (False) or do not need (True) downloaded weights."""
    found = []
    for block in blocks("bash"):
        if runnable is not None and block.startswith(NEEDS_WEIGHTS) == runnable:
            continue
        for line in lines_of(block):
            found += vgen_commands(line)
    return found


def capped(argv: list[str]) -> list[str]:
    """``argv`` with each count of :data:`CAPS` at most its cap, a ``--switch FRAME:VALUE``'s frame scaled as its
    ``--frames`` is (so that it stays inside the stream), and ``--num-images 1`` for a ``sample`` that gives
    none."""
    out = list(argv)
    for i, word in enumerate(out[:-1]):
        if word in CAPS:
            out[i + 1] = str(min(int(out[i + 1]), CAPS[word]))
    if "--frames" in argv:
        at = argv.index("--frames") + 1
        written, kept = int(argv[at]), int(out[at])
        for i, word in enumerate(out[:-1]):
            if word == "--switch":
                frame, colon, value = out[i + 1].partition(":")
                out[i + 1] = f"{max(1, int(frame) * kept // written)}{colon}{value}"
    if out[0] == "sample" and "--num-images" not in out:
        out += ["--num-images", "1"]
    return out


def test_the_readme_has_commands_of_both_kinds() -> None:
    assert len(readme_commands(runnable=True)) >= 20 and len(readme_commands(runnable=False)) >= 4
    assert ["data", "render", "--kind", "images", "--num", "512", "--out", "real"] in readme_commands(True)
    assert capped(["stream", "--frames", "600"]) == ["stream", "--frames", "8"]
    assert capped(["stream", "--switch", "80:3", "--frames", "160"]) == ["stream", "--switch", "4:3", "--frames", "8"]
    assert capped(["sample", "--frames", "3"]) == ["sample", "--frames", "3", "--num-images", "1"]


@pytest.mark.parametrize("argv", readme_commands(), ids=lambda argv: " ".join(argv)[:60])
def test_every_readme_command_parses(argv: list[str]) -> None:
    """Every flag exists and every value is of its type (``--device cuda`` is read as ``cpu`` on a machine
    without CUDA, where argparse refuses it)."""
    if not torch.cuda.is_available():
        argv = [w if (i == 0 or argv[i - 1] != "--device") else "cpu" for i, w in enumerate(argv)]
    build_parser().parse_args(argv)


@pytest.mark.slow
def test_the_readme_runs_as_written_in_an_empty_folder(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    failed = []
    for argv in readme_commands(runnable=True):
        if argv[0] in PARSED_ONLY:
            continue
        if main([*capped(argv), "--threads", "1"]) != 0:
            failed.append(f"vgen {' '.join(argv)}: {capsys.readouterr().err.strip()}")
    code = blocks("python")[0]
    for name, cap in PYTHON_CAPS.items():
        code = re.sub(rf"\b{name}=\d+", f"{name}={cap}", code)
    code = code.replace('threads="auto"', "threads=1")  # one thread, as the commands: the test shares the machine
    with threads_for(1):
        exec(compile(code, str(README), "exec"), {})
    assert failed == []
    assert (tmp_path / "real-clips" / "000003_star.mp4").is_file() and (tmp_path / "square.png").is_file()
