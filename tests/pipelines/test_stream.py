"""The streaming pipeline: loads from a folder like every pipeline, yields a video block by block, and takes its
recommended settings from the folder with per-call overrides. A latent model travels with its KL tokenizer,
which decodes every block to pixels; a prompt-conditioned model with its text encoder and example prompts.
Switches change a stream's class or prompt at the block holding their frame; a prompt for a class model, a class
for a text model and a bad switch are refused in one line before any block."""

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


# the example prompts of conftest's tiny_text_stream_pipeline_dir
TINY_TEXT_STREAM_PROMPTS = ["a red star on a white background", "a blue ring moving right", "a green square"]


@pytest.fixture(scope="module")
def text_pipe(tiny_text_stream_pipeline_dir) -> StreamPipeline:
    return vgen.load(tiny_text_stream_pipeline_dir)


def test_a_text_pipeline_loads_its_text_encoder_and_example_prompts(text_pipe, tiny_text_stream_pipeline_dir,
                                                                    tiny_text_blockdiff) -> None:
    _, words = tiny_text_blockdiff
    assert text_pipe.is_text and (tiny_text_stream_pipeline_dir / "text_encoder").is_dir()
    assert text_pipe.text_encoder.config == words.config and text_pipe.example_prompts == TINY_TEXT_STREAM_PROMPTS
    prompt = TINY_TEXT_STREAM_PROMPTS[0]
    torch.testing.assert_close(text_pipe.text_encoder.condition(prompt).values, words.condition(prompt).values)


def test_a_text_stream_switches_prompt_at_the_block_holding_the_frame(text_pipe) -> None:
    first, second = TINY_TEXT_STREAM_PROMPTS[:2]
    blocks = list(text_pipe.stream_blocks(prompt=first, num_frames=8, switches={5: second}, seed=2))
    assert [b.prompts for b in blocks] == [[first]] * 2 + [[second]] * 2 and all(b.class_ids == [] for b in blocks)
    assert [b.switched for b in blocks] == [False, False, True, False]
    direct = text_pipe.streamer().stream([first], 8, seed=2, switches=[(4, second)])
    assert all(np.array_equal(a.frames, b.frames) for a, b in zip(blocks, direct, strict=True))
    frames = np.concatenate(list(text_pipe.stream(prompt=first, num_frames=8, switches={5: second}, seed=2)))
    assert np.array_equal(frames, np.concatenate([b.frames[0] for b in blocks]))


def test_calling_a_text_pipeline_draws_its_example_prompts_unless_given_prompts(text_pipe) -> None:
    out = text_pipe(num_frames=4, switches={2: "a yellow heart"})
    assert out.videos.shape == (3, 4, 16, 16, 3) and out.prompts == TINY_TEXT_STREAM_PROMPTS and out.class_ids == []
    assert text_pipe(prompts=["a pink moon"], num_frames=4).prompts == ["a pink moon"]


def test_a_class_pipeline_switches_to_classes_by_id_or_name(pipe) -> None:
    blocks = list(pipe.stream_blocks([0, 1], 8, switches={3: "c", 6: 0}, switch="plain", seed=1))
    assert [b.class_ids for b in blocks] == [[0, 1], [2, 2], [2, 2], [0, 0]]
    assert pipe([0], num_frames=4, switches=[(2, 1)]).class_ids == [0]
    last_wins = list(pipe.stream_blocks(0, 6, switches={4: 1, 5: 2}, seed=1))  # frames 4 and 5: one block
    assert [b.class_ids for b in last_wins] == [[0], [0], [2]]
    each = list(pipe.stream_blocks([0, 1], 6, switches={2: ["c", 0]}, seed=1))  # one target per stream
    assert [b.class_ids for b in each] == [[0, 1], [2, 0], [2, 0]]


def test_each_text_stream_may_switch_to_its_own_prompt(text_pipe) -> None:
    first, second, third = TINY_TEXT_STREAM_PROMPTS
    blocks = list(text_pipe.stream_blocks(prompt=[first, first], num_frames=6, switches={2: [second, third]}))
    assert [b.prompts for b in blocks] == [[first, first], [second, third], [second, third]]


CLASS_ONLY = "^tiny-stream is class-conditional: give class ids or names, not a prompt$"


@pytest.mark.parametrize("call, message", [
    (lambda p, t: p.stream(prompt="a red star"), CLASS_ONLY),
    (lambda p, t: p(prompts=["a red star"]), CLASS_ONLY),
    (lambda p, t: t.stream(2), "^tiny-text-stream is prompt-conditioned: give a prompt, not class ids$"),
    (lambda p, t: t([0, 1]), "^tiny-text-stream is prompt-conditioned: give a prompt, not class ids$"),
    (lambda p, t: t.stream(), r"^tiny-text-stream is prompt-conditioned: give a prompt \(e.g. 'a red star on a white "),
    (lambda p, t: t.stream(prompt=" "), "^prompt is empty: give the text of what to draw$"),
    (lambda p, t: t.stream_blocks(prompt=["a red star", ""]), r"^prompt\[1\] is empty"),
    (lambda p, t: t.stream(prompt="a red star", num_frames=8, switches={4: 2}),
     "^switch at frame 4: tiny-text-stream is prompt-conditioned: give a prompt, not the class 2$"),
    (lambda p, t: t.stream(prompt="a red star", num_frames=8, switches={4: "\t"}),
     "^the prompt of the switch at frame 4 is empty"),
    (lambda p, t: t.stream_blocks(prompt=["a red star"] * 2, num_frames=8, switches={4: ["a blue ring", 2]}),
     "^switch at frame 4: tiny-text-stream is prompt-conditioned: give a prompt, not the class 2$"),
    (lambda p, t: t.stream_blocks(prompt=["a red star"] * 2, num_frames=8, switches={4: ["a blue ring", ""]}),
     "^the prompt of the switch at frame 4 is empty"),
    (lambda p, t: t.stream_blocks(prompt=["a red star"] * 2, num_frames=8, switches={4: ["a blue ring"]}),
     "^switch at frame 4: 1 targets for 2 videos; give one target for all or one per video$"),
    (lambda p, t: p.stream_blocks([0, 1], num_frames=8, switches={4: [1, "x"]}), "^unknown class 'x' for tiny-stream"),
    (lambda p, t: p.stream(0, num_frames=8, switches={8: 1}),
     r"^switch at frame 8: a switch frame must lie in 1\.\.7 \(the stream has 8 frames\)$"),
    (lambda p, t: p.stream(0, num_frames=8, switches={0: 1}), "^switch at frame 0: a switch frame must lie in 1..7"),
    (lambda p, t: p.stream(0, num_frames=8, switches={6: 1, 3: 2}),
     "^switch at frame 3 comes after the switch at frame 6: switch frames must increase in the order given$"),
    (lambda p, t: p.stream(0, num_frames=8, switches={4: "a red star"}), "^unknown class 'a red star' for tiny-stream"),
    (lambda p, t: p.stream(0, num_frames=8, switches=[(4.5, 1)]), r"^switches\[0\]: the frame must be an integer"),
    (lambda p, t: p.stream(0, num_frames=8, switches=[4]), r"^switches\[0\] must be a \(frame, target\) pair, got 4$"),
    (lambda p, t: p.stream(0, num_frames=8, switches="4:b"), "^switches must be a {frame: target} mapping or"),
])
def test_bad_prompts_classes_and_switches_are_refused_in_one_line_before_any_block(pipe, text_pipe, monkeypatch,
                                                                                   call, message) -> None:
    def never(*args, **kwargs):
        raise AssertionError("streaming started")

    monkeypatch.setattr(BlockStreamer, "_velocity", never)
    with pytest.raises(ValueError, match=message):
        next(iter(call(pipe, text_pipe)))


def test_a_text_model_needs_its_text_encoder_and_a_class_model_takes_none(text_pipe, pipe) -> None:
    with pytest.raises(ValueError, match=r"^the model is prompt-conditioned: it needs its text encoder \(text_enc"):
        StreamPipeline(text_pipe.model, text_pipe.info)
    with pytest.raises(ValueError, match="^the model is class-conditional: it takes no text encoder$"):
        StreamPipeline(pipe.model, pipe.info, text_encoder=text_pipe.text_encoder)
