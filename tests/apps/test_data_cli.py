"""``vgen data render``: the sets the embedded models were trained on, in the rendering their pipeline records;
misuse is one ``vgen: error`` line."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from PIL import Image

from vgen.apps.cli import main
from vgen.data import shapes
from vgen.hub import ASSETS


def test_images_default_to_the_rendering_of_the_default_model(tmp_path, capsys):
    assert main(["data", "render", "--kind", "images", "--num", "3", "--out", str(tmp_path / "real"),
                 "--no-progress"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote 3 images of the val split to {tmp_path / 'real'}"
    data = json.loads((ASSETS / "shapes-c2i" / "pipeline.json").read_text())["data"]
    expected, _ = shapes.render_batch(shapes.SPLIT_SEEDS["val"], 0, 3, shapes.ShapesConfig(**data))
    files = sorted((tmp_path / "real").iterdir())
    assert [f.name for f in files] == ["000000_circle.png", "000001_square.png", "000002_triangle.png"]
    assert np.array_equal(np.stack([np.asarray(Image.open(f)) for f in files]), expected)


def test_moving_scenes_write_n_clips_and_n_captions(tmp_path, capsys):
    assert main(["data", "render", "--kind", "moving-scenes", "--num", "2", "--format", "gif", "--out",
                 str(tmp_path / "m"), "--no-progress"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote 2 moving-scenes of the val split to {tmp_path / 'm'}"
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["000000.gif", "000001.gif", "captions.txt"]
    assert len((tmp_path / "m" / "captions.txt").read_text().splitlines()) == 2


@pytest.mark.parametrize("argv, message", [
    (["--kind", "clips", "--model", "shapes-c2i"], "--model shapes-c2i was trained on images, not clips"),
    (["--kind", "images", "--model", "shapes-t2i"], "--model shapes-t2i records no rendering of its training data"),
    (["--kind", "scenes", "--model", "shapes-t2i"], "--model applies to images and clips"),
    (["--kind", "moving-scenes", "--model", "shapes-t2i"], "--model applies to images and clips: moving-scenes have"),
    (["--kind", "images", "--seed", "-2"], "--seed must be >= 0, got -2"),
    (["--kind", "images", "--num", "0"], r"--num must be in \[1, "),
])
def test_misuse_is_one_line(tmp_path, capsys, argv, message):
    argv = ["data", "render", "--num", "2", "--out", str(tmp_path / "o"), *argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("vgen: error: ") and len(err.splitlines()) == 1
    assert re.search(message, err)
    assert not (tmp_path / "o").exists()


def test_an_existing_folder_with_files_is_never_written_into(tmp_path, capsys):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "mine.png").write_bytes(b"x")
    assert main(["data", "render", "--kind", "images", "--num", "1", "--out", str(tmp_path / "o")]) == 2
    assert "--out " in capsys.readouterr().err and sorted(p.name for p in (tmp_path / "o").iterdir()) == ["mine.png"]
