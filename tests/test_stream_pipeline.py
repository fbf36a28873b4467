"""The streaming pipeline: loads from a folder like every pipeline, yields a video block by block, and takes its
recommended settings from the folder with per-call overrides."""

from __future__ import annotations

import numpy as np
import pytest

import vgen
from vgen.samplers.streaming import StreamControl
from vgen.stream_pipeline import StreamPipeline


@pytest.fixture(scope="module")
def pipe(tiny_stream_pipeline_dir) -> StreamPipeline:
    return vgen.load(tiny_stream_pipeline_dir)


def test_load_returns_a_stream_pipeline_with_the_folder_defaults(pipe) -> None:
    assert isinstance(pipe, StreamPipeline)
    config = pipe.stream_config()
    assert (config.steps, config.sink_frames, config.window_frames) == (2, 2, 4)
    assert pipe.stream_config(steps=5, window_frames=None).steps == 5


def test_stream_yields_each_block_of_one_video(pipe) -> None:
    blocks = list(pipe.stream(class_id=1, num_frames=9, seed=0))
    assert [b.shape for b in blocks] == [(2, 16, 16, 3)] * 4 + [(1, 16, 16, 3)]
    assert all(b.dtype == np.uint8 for b in blocks)
    again = np.concatenate(list(pipe.stream(class_id=1, num_frames=9, seed=0)))
    assert np.array_equal(np.concatenate(blocks), again)


def test_call_returns_whole_clips_and_a_profile(pipe) -> None:
    out = pipe([0, 2], num_frames=6, seed=1)
    assert out.videos.shape == (2, 6, 16, 16, 3) and out.class_ids == [0, 2]
    assert out.profile["blocks"] == 3 and out.profile["frames"] == 6 and out.profile["fps"] > 0
    assert len(out.profile["per_block_latency_s"]) == 3
    assert pipe(2, num_frames=6, seed=1).videos.shape == (1, 6, 16, 16, 3)


def test_control_stops_a_stream(pipe) -> None:
    control = StreamControl()
    got = []
    for frames in pipe.stream(0, 100, control=control):
        got.append(frames)
        control.stop()
    assert len(got) == 1


def test_unknown_options_and_defaults_are_rejected(pipe) -> None:
    with pytest.raises(ValueError, match="unknown stream options"):
        pipe.stream_config(window=4)
    with pytest.raises(ValueError, match="unknown stream defaults"):
        StreamPipeline(pipe.model, type(pipe.info)(name="x", image_size=16, defaults={"top_k": 3}))
    with pytest.raises(ValueError, match="frame size"):
        StreamPipeline(pipe.model, type(pipe.info)(name="x", image_size=32))
