"""The streaming pipeline: loads from a folder like every pipeline, yields a video block by block, and takes its
recommended settings from the folder with per-call overrides. A latent model travels with its KL tokenizer,
which decodes every block to pixels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vgen
from vgen.models.blockdiff import BlockDiffConfig
from vgen.pipelines import PipelineInfo, StreamPipeline
from vgen.samplers.streaming import BlockStreamer, StreamControl
from vgen.tokenizers.kl import KLConfig, KLTokenizer


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


def test_progress_shows_a_bar_of_frames_only_when_asked(pipe, capsys) -> None:
    """A long stream loop shows how far it is with ``progress=True``; by default it writes nothing."""
    assert len(list(pipe.stream(class_id=1, num_frames=5, seed=0))) == 3
    assert capsys.readouterr().err == ""
    frames = np.concatenate(list(pipe.stream(class_id=1, num_frames=5, seed=0, progress=True)))
    last = capsys.readouterr().err.replace("\r", "\n").split("\n")[-2]
    assert frames.shape[0] == 5 and last.startswith("stream: 100%") and "5/5" in last and "frame/s" in last
    assert np.array_equal(frames, np.concatenate(list(pipe.stream(class_id=1, num_frames=5, seed=0))))


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


def test_a_latent_pipeline_decodes_every_block_with_its_tokenizer(tmp_path, tiny_blockdiff_factory) -> None:
    torch.manual_seed(0)
    kl = KLTokenizer(KLConfig(block_out_channels=(8, 8), norm_num_groups=4, image_size=16, latent_channels=2))
    latent = BlockDiffConfig(frame_size=8, channels=2, patch_size=2, frames_per_block=2, train_frames=8, dim=48,
                             n_layer=2, n_head=4, num_classes=3)
    model = tiny_blockdiff_factory(latent)
    info = PipelineInfo(name="latent", image_size=16, class_names=["a", "b", "c"],
                        defaults={"steps": 2, "first_steps": 2, "sink_frames": 2, "window_frames": 4})
    folder = StreamPipeline(model, info, kl).save_pretrained(tmp_path / "latent")
    assert (folder / "kl").is_dir() and (folder / "blockdiff").is_dir()
    pipe = vgen.load(folder)
    assert isinstance(pipe.tokenizer, KLTokenizer) and pipe.tokenizer.config == kl.config
    out = pipe([0, 2], num_frames=5, seed=1)
    assert out.videos.shape == (2, 5, 16, 16, 3)  # pixels: the tokenizer's 16-px frames of 8 x 8 latents
    streamer = BlockStreamer(model, pipe.stream_config(), kl.eval().decode_frames)
    expected = np.concatenate([b.frames for b in streamer.stream([0, 2], 5, seed=1)], axis=1)
    assert np.abs(out.videos.astype(int) - expected.astype(int)).max() <= 1
    with pytest.raises(ValueError, match=r"latent frames \(8 x 8 x 2\) are not the model's \(8 x 8 x 3\)"):
        StreamPipeline(tiny_blockdiff_factory(BlockDiffConfig(frame_size=8, channels=3, patch_size=2,
                                                              frames_per_block=2, train_frames=8, dim=48, n_layer=2,
                                                              n_head=4, num_classes=3)), info, kl)
    with pytest.raises(ValueError, match="frame size 8 does not match the model's 16"):
        StreamPipeline(model, PipelineInfo(name="x", image_size=8), kl)


def test_more_clips_than_batch_size_are_streamed_chunk_by_chunk_from_one_generator(pipe) -> None:
    whole = pipe([0, 1, 2], num_frames=3, seed=4)
    assert np.array_equal(whole.videos, pipe([0, 1, 2], num_frames=3, seed=4, batch_size=3).videos)
    together = np.concatenate([b.frames for b in pipe.stream_blocks([0, 1, 2], 3, seed=4)], axis=1)
    assert np.array_equal(whole.videos, together)  # a call that fits in one chunk is one stream of all its clips
    out = pipe([0, 1, 2], num_frames=3, seed=4, batch_size=2)
    generator = torch.Generator().manual_seed(4)
    chunks = [np.concatenate([b.frames for b in pipe.stream_blocks(ids, 3, generator=generator)], axis=1)
              for ids in ([0, 1], [2])]
    assert np.array_equal(out.videos, np.concatenate(chunks)) and out.class_ids == [0, 1, 2]
    assert out.profile["blocks"] == 4 and out.profile["frames"] == 6  # 2 blocks of 3 frames per chunk


def test_streams_beyond_a_chunk_or_clips_beyond_memory_are_refused_before_drawing(pipe, monkeypatch) -> None:
    def never(*args, **kwargs):
        raise AssertionError("streaming started")

    monkeypatch.setattr(BlockStreamer, "stream", never)
    with pytest.raises(ValueError, match="^3 streams are more than batch_size 2 drawn at once"):
        pipe.stream_blocks([0, 1, 2], 4, batch_size=2)
    with pytest.raises(ValueError, match=r"^1000000 clips of 16x16 pixels take 11.4 GiB, .*`vgen sample-many`$"):
        pipe([0] * 10**6, num_frames=16)
