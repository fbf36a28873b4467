"""The procedural sets written to files: item i is item i of the training caches of the same split and rendering,
named by its class (scenes: beside their captions, one a line in file order); bad arguments fail in one line."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vgen.data import clips, scenes, shapes
from vgen.data.render import CAPTIONS_FILE, split_seed, write_set
from vgen.eval.videos import read_video

SMOOTH = {"image_size": 32, "background": "smooth"}


def test_images_are_the_split_s_images_named_by_class(tmp_path):
    paths = write_set("images", 10, tmp_path, split="test", data=SMOOTH, progress=False)
    expected, labels = shapes.render_batch(shapes.SPLIT_SEEDS["test"], 0, 10, shapes.ShapesConfig(**SMOOTH))
    assert [p.name for p in paths] == [f"{i:06d}_{shapes.CLASS_NAMES[c]}.png" for i, c in enumerate(labels)]
    assert np.array_equal(np.stack([np.asarray(Image.open(p)) for p in paths]), expected)
    assert sorted(tmp_path.iterdir()) == paths


def test_a_seed_of_one_s_own_replaces_the_split_s(tmp_path):
    paths = write_set("images", 2, tmp_path, split="test", seed=7, progress=False)
    assert np.array_equal(np.asarray(Image.open(paths[1])), shapes.sample_image(7, 1)[0])


def test_clips_have_split_seeds_of_their_own():
    assert split_seed("images", "val") == split_seed("scenes", "val") == shapes.SPLIT_SEEDS["val"]
    assert split_seed("clips", "val") == clips.SPLIT_SEEDS["val"] != shapes.SPLIT_SEEDS["val"]


def test_clips_are_the_split_s_clips_as_gif(tmp_path):
    cfg = {"num_frames": 3, "frame_size": 16, "min_scale": 0.3, "max_scale": 0.4}
    (path,) = write_set("clips", 1, tmp_path, seed=5, data=cfg, clip_format=".gif", progress=False)
    frames, label = clips.sample_clip(5, 0, clips.ClipsConfig(**cfg))
    assert path.name == f"000000_{shapes.CLASS_NAMES[label]}.gif"
    assert np.abs(read_video(path).astype(int) - frames).mean() < 8  # GIF's palette


def test_scenes_come_with_their_captions_in_file_order(tmp_path):
    paths = write_set("scenes", 3, tmp_path, split="train", progress=False)
    images, captions, _ = scenes.render_scenes(shapes.SPLIT_SEEDS["train"], 0, 3)
    assert (tmp_path / CAPTIONS_FILE).read_text().splitlines() == captions
    assert [p.name for p in paths] == ["000000.png", "000001.png", "000002.png"]
    assert np.array_equal(np.asarray(Image.open(paths[2])), images[2])


@pytest.mark.parametrize("kind, kwargs, message", [
    ("audio", {}, "kind must be one of images, clips, scenes, got 'audio'"),
    ("images", {"split": "dev"}, "split must be one of train, val, test, got 'dev'"),
    ("images", {"num": 0}, "num must be a whole number >= 1, got 0"),
    ("images", {"seed": -1}, "seed must be >= 0, got -1"),
    ("clips", {"clip_format": ".avi"}, r"clip_format must be one of .mp4, .gif, got '.avi'"),
    ("scenes", {"data": SMOOTH}, "scenes have one rendering"),
    ("clips", {"data": SMOOTH}, "data is not a rendering config of clips: .*image_size"),
])
def test_bad_arguments_fail_before_anything_is_written(tmp_path, kind, kwargs, message):
    with pytest.raises(ValueError, match=message):
        write_set(kind, kwargs.pop("num", 2), tmp_path / "out", progress=False, **kwargs)
    assert not (tmp_path / "out").exists()
