"""The procedural sets written to files: item i is item i of the training caches of the same split and rendering,
named by its class (scenes: beside their captions, one a line in file order); bad arguments fail in one line."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vgen.data import clips, moving_scenes, scenes, shapes
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


def test_clips_and_moving_scenes_have_split_seeds_of_their_own():
    assert split_seed("images", "val") == split_seed("scenes", "val") == shapes.SPLIT_SEEDS["val"]
    assert split_seed("clips", "val") == clips.SPLIT_SEEDS["val"] != shapes.SPLIT_SEEDS["val"]
    assert split_seed("moving-scenes", "val") == moving_scenes.SPLIT_SEEDS["val"] not in (
        shapes.SPLIT_SEEDS["val"], clips.SPLIT_SEEDS["val"])


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


def test_moving_scenes_are_the_split_s_clips_beside_their_captions(tmp_path):
    cfg = {"num_frames": 3, "frame_size": 16, "supersample": 1}
    paths = write_set("moving-scenes", 3, tmp_path, split="test", data=cfg, clip_format=".gif", progress=False)
    expected, captions, _ = moving_scenes.render_moving_scenes(moving_scenes.SPLIT_SEEDS["test"], 0, 3,
                                                               moving_scenes.MovingScenesConfig(**cfg))
    assert [p.name for p in paths] == ["000000.gif", "000001.gif", "000002.gif"]
    assert (tmp_path / CAPTIONS_FILE).read_text().splitlines() == captions
    assert np.abs(read_video(paths[1]).astype(int) - expected[1]).mean() < 8  # GIF's palette


@pytest.mark.parametrize("kind, kwargs, message", [
    ("audio", {}, "kind must be one of images, clips, scenes, moving-scenes, got 'audio'"),
    ("images", {"split": "dev"}, "split must be one of train, val, test, got 'dev'"),
    ("images", {"num": 0}, "num must be a whole number >= 1, got 0"),
    ("images", {"seed": -1}, "seed must be >= 0, got -1"),
    ("clips", {"clip_format": ".avi"}, r"clip_format must be one of .mp4, .gif, got '.avi'"),
    ("scenes", {"data": SMOOTH}, "scenes have one rendering"),
    ("clips", {"data": SMOOTH}, "data is not a rendering config of clips: .*image_size"),
    ("moving-scenes", {"data": {"frame_size": 8}}, "frame_size must be >= 16 pixels, got 8"),
    ("moving-scenes", {"data": SMOOTH}, "data is not a rendering config of moving-scenes: .*image_size"),
])
def test_bad_arguments_fail_before_anything_is_written(tmp_path, kind, kwargs, message):
    with pytest.raises(ValueError, match=message):
        write_set(kind, kwargs.pop("num", 2), tmp_path / "out", progress=False, **kwargs)
    assert not (tmp_path / "out").exists()
