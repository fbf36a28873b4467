"""``vgen sample --model <folder>`` on a copy of an embedded model whose ``config.json`` holds a bad value: the
command exits with one line naming the file and the field, never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vgen.apps.cli import main
from vgen.hub import ASSETS


def copy_with_config(tmp_path: Path, component: str, **changes) -> Path:
    """A copy of the embedded shapes-c2i pipeline (its files linked) whose ``component/config.json`` has
    ``changes``."""
    folder = tmp_path / "model"
    shutil.copytree(ASSETS / "shapes-c2i", folder, copy_function=os.symlink)
    config = folder / component / "config.json"
    meta = json.loads(config.read_text())
    meta["config"].update(changes)
    config.unlink()
    config.write_text(json.dumps(meta))
    return folder


@pytest.mark.parametrize("component, change, message", [
    ("gpt", {"n_head": 0}, r"n_head must be an integer in [1, 2**24], got 0"),
    ("gpt", {"dim": -256}, r"dim must be an integer in [1, 2**24], got -256"),
    ("gpt", {"n_layer": 8.0}, r"n_layer must be an integer in [1, 2**24], got 8.0"),
    ("gpt", {"dim": 250}, "dim 250 is not divisible by n_head 8"),
    ("vq", {"ch_mult": [1, "2"]}, "ch_mult[1] must be an integer in [1, 2**24], got '2'"),
    ("drafter", {"norm_eps": 0}, "norm_eps must be a finite number in (0, 1), got 0"),
])
def test_sample_names_the_config_file_and_the_field_in_one_line(tmp_path, capsys, component, change, message):
    folder = copy_with_config(tmp_path, component, **change)
    code = main(["sample", "--model", str(folder), "--out", str(tmp_path / "grid.png"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert err == f"vgen: error: bad model config in {folder / component / 'config.json'}: {message}\n"
    assert not (tmp_path / "grid.png").exists()


def test_the_command_exits_without_a_traceback(tmp_path):
    folder = copy_with_config(tmp_path, "gpt", n_head=0)
    done = subprocess.run([sys.executable, "-m", "vgen", "sample", "--model", str(folder), "--out",
                           str(tmp_path / "grid.png")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"vgen: error: bad model config in {folder / 'gpt' / 'config.json'}: n_head must be an integer in "
        f"[1, 2**24], got 0"]
