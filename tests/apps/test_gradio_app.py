"""The web demo: the page's generate and stream functions over the pipeline API (a class or a prompt, as the model
takes; every field checked against its declaration, server paths only where the operator allows them, Stop inside
a block, the newest stream of a session switched to a class or a prompt), then the live app on loopback driven with
gradio_client and raw HTTP: generate, compare with AR, stream and stop, bad input answered with its own message
(every echoed value cut) while the app keeps serving, a refusal logged as one line, one concurrency limit over every
endpoint, streams cancelled inside a block when their client goes away, no temporary files left, a soak of
concurrent generations and streams, and ``vgen app`` stopped by SIGTERM with a page connected, leaving no cached
file. (Uploads, handlers the page does not call and other sessions' hashes: tests/apps/test_fuzz_web.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vgen.apps import gradio_app
from vgen.apps.cli import main
from vgen.apps.gradio_app import (
    GENERATE_INPUTS,
    MAX_TEXT,
    TEMP_PREFIX,
    InputError,
    ModelAccess,
    ModelControls,
    StreamSessions,
    build_app,
    generate,
    iterate_in_thread,
    model_controls,
    page_message,
    sampler_options,
    serve,
    stream_controls,
    stream_target,
    stream_video,
)
from vgen.apps.models_cli import pipeline_info, vocabulary_lines
from vgen.data.scenes import EXAMPLE_PROMPTS, caption_vocabulary
from vgen.eval.videos import read_video
from vgen.images import image_grid
from vgen.pipelines import DEFAULT_TEXT_MODEL
from vgen.samplers import available_samplers
from vgen.samplers.streaming import BlockStreamer

gradio_client = pytest.importorskip("gradio_client")
httpx = pytest.importorskip("httpx")


@pytest.fixture(scope="module")
def tiny_model(tiny_pipeline_dir) -> str:
    return str(tiny_pipeline_dir)


@pytest.fixture(scope="module")
def tiny_t2i(tiny_t2i_pipeline_dir) -> str:
    return str(tiny_t2i_pipeline_dir)


@pytest.fixture(scope="module")
def access(tiny_pipeline_dir, tiny_video_pipeline_dir, tiny_stream_pipeline_dir, tiny_t2i,
           tiny_text_stream_pipeline_dir) -> ModelAccess:
    """The operator's allow-list: the tiny test pipelines beside the embedded models."""
    return ModelAccess(folders=(*map(str, (tiny_pipeline_dir, tiny_video_pipeline_dir, tiny_stream_pipeline_dir)),
                                tiny_t2i, str(tiny_text_stream_pipeline_dir)))


@pytest.fixture
def gen(access, tmp_path):
    return functools.partial(generate, folder=tmp_path, access=access)


@pytest.fixture
def stream(access, tmp_path):
    return functools.partial(stream_video, folder=tmp_path, access=access)


SETTINGS = dict(class_id=1, num_images=3, seed=0, cfg_scale="", temperature=1.0, top_k=0, top_p=1.0)


def test_generate_returns_images_an_acceptance_map_and_stats(gen, tiny_model) -> None:
    grid, amap, stats, ar, clip = gen(tiny_model, "sjd", **SETTINGS, window=4)
    assert grid.size == (3 * 16, 16) and amap is not None and ar is None and clip is None
    assert "tokens per forward" in stats and "| sampler | sjd |" in stats


def test_compare_runs_vanilla_ar_on_the_same_seed(gen, tiny_model) -> None:
    grid, _, stats, ar, _ = gen(tiny_model, "mcsjd", **{**SETTINGS, "temperature": 0.0}, compare=True)
    assert "step compression vs AR" in stats and "latency ratio vs AR" in stats
    assert ar.tobytes() == grid.tobytes()  # greedy: the lossless sampler draws AR's images


def test_empty_sampling_fields_take_the_models_defaults(gen, tiny_model) -> None:
    explicit = gen(tiny_model, "ar", **SETTINGS)[0]
    empty = gen(tiny_model, "ar", **{**SETTINGS, "temperature": "", "top_k": " ", "top_p": ""})[0]
    assert empty.tobytes() == explicit.tobytes()  # the tiny model's defaults are temperature 1, no filters
    assert gen(tiny_model, "ar", **{**SETTINGS, "temperature": "0.5"})[0].tobytes() != explicit.tobytes()


def test_sampler_fields_are_passed_only_when_the_sampler_has_them_and_they_are_filled() -> None:
    assert sampler_options("ar", {"window": 8}) == {}
    assert sampler_options("lantern", {"window": "8", "lantern_delta": "", "draft_init": " "}) == {"window": 8}
    assert sampler_options("gsd", {"gsd_p_threshold": "0.2", "draft_coupling": "gumbel"}) == \
        {"gsd_p_threshold": 0.2, "draft_coupling": "gumbel"}
    with pytest.raises(InputError, match="window must be a whole number"):
        sampler_options("sjd", {"window": "2.5"})
    with pytest.raises(InputError, match="lantern_k must be a number, got 'many'"):
        sampler_options("lantern", {"lantern_k": "many"})


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(model="no-such-model"), "unknown model 'no-such-model'"),
    (dict(sampler="nope"), "unknown sampler 'nope'"),
    (dict(class_id=7), "class id 7 is out of range"),
    (dict(class_id=1.5), "class_id must be a whole number, got 1.5"),
    (dict(class_id=float("inf")), "class_id must be a finite number, got 'inf'"),
    (dict(class_id=None), "class_id is empty"),
    (dict(num_images=99), "num_images must be an integer in [1, 16], got 99"),
    (dict(num_images=float("nan")), "num_images must be a finite number, got 'nan'"),
    (dict(num_images="[1]"), "num_images must be a number, got '[1]'"),
    (dict(seed=2**64), "seed must be an integer in [0, 9223372036854775807], got 18446744073709551616"),
    (dict(seed=-1), "seed must be an integer in [0, 9223372036854775807], got -1"),
    (dict(seed="1e400"), "seed must be a finite number, got '1e400'"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_k="many"), "top_k must be a number"),
    (dict(top_k="2.5"), "top_k must be a whole number"),
    (dict(top_k="1e400"), "top_k must be a finite number, got '1e400'"),
    (dict(cfg_scale="strong"), "cfg_scale must be a number"),
    (dict(cfg_scale="1e309"), "cfg_scale must be a finite number, got '1e309'"),
    (dict(cfg_scale="1e300"), "cfg_scale must be in [0, 100.0] (guidance only above 1), got 1e+300"),
    (dict(temperature="-inf"), "temperature must be a finite number, got '-inf'"),
    (dict(cfg_interval="-2"), "cfg_interval must be an integer in [-1, "),
    (dict(sampler="sjd", window=-1), "window must be an integer in [0, "),
    (dict(sampler="sjd", drafter="head"), "needs a draft head"),
    (dict(gpt_ckpt="/no/such/gpt.pt", vq_ckpt="/no/such/vq.pt"), "checkpoint paths are off on this server"),
])
def test_bad_input_raises_a_specific_message(gen, tiny_model, kwargs, message) -> None:
    with pytest.raises(ValueError) as e:
        gen(**{"model": tiny_model, "sampler": "ar", **SETTINGS, **kwargs})
    assert message in str(e.value)


@pytest.mark.parametrize("field", ["model", "sampler", "seed", "top_k", "window", "lantern_mode", "gpt_ckpt"])
def test_a_long_value_is_refused_without_being_echoed(gen, tiny_model, field) -> None:
    with pytest.raises(InputError) as e:
        gen(**{"model": tiny_model, "sampler": "lantern", **SETTINGS, field: "9" * 1_000_000})
    assert str(e.value).endswith(f"is 1000000 characters long; at most {MAX_TEXT} are accepted")
    assert len(str(e.value)) < 100


def test_server_paths_are_off_unless_the_operator_allows_them(tiny_model, tiny_stream_pipeline_dir, tmp_path,
                                                              monkeypatch) -> None:
    real_load = gradio_app.load
    monkeypatch.setattr(gradio_app, "load", lambda *a, **k: pytest.fail("a refused path was loaded"))
    embedded = ModelAccess()
    answers = []
    for path in (tiny_model, str(tmp_path / "missing"), "/etc", "../../"):
        with pytest.raises(InputError) as e:
            generate(path, "ar", **SETTINGS, folder=tmp_path, access=embedded)
        answers.append(str(e.value).replace(repr(path), "PATH"))
    assert len(set(answers)) == 1  # an existing folder and a missing one get the same answer
    assert answers[0].startswith("unknown model PATH; this server offers: shapes-blockdiff, ")
    with pytest.raises(InputError, match="checkpoint paths are off on this server"):
        generate("", "ar", **SETTINGS, gpt_ckpt=tiny_model, vq_ckpt=tiny_model, folder=tmp_path, access=embedded)
    with pytest.raises(InputError, match="unknown model"):
        next(stream_video(str(tiny_stream_pipeline_dir), 0, 4, 0, "", "", folder=tmp_path, access=embedded))
    assert model_controls(tiny_model, embedded).samplers == available_samplers()  # the Generate click says why
    monkeypatch.setattr(gradio_app, "load", real_load)
    for allowed in (ModelAccess(folders=(tiny_model,)), ModelAccess(local_paths=True)):
        assert generate(tiny_model, "ar", **SETTINGS, folder=tmp_path, access=allowed)[0].size == (48, 16)


def test_stream_video_shows_each_block_then_the_mp4(stream, tiny_stream_pipeline_dir) -> None:
    outs = list(stream(str(tiny_stream_pipeline_dir), 1, 6, 0, 2, 1.0))
    assert len(outs) == 4  # three blocks of two frames, then the file
    assert [o[2] for o in outs[:3]] == [None] * 3 and "frame 6 / 6" in outs[2][1]
    assert outs[-1][1] == "done: 6 frames" and read_video(Path(outs[-1][2])).shape == (6, 16, 16, 3)


def test_stream_video_keeps_the_models_defaults_for_empty_fields(stream, tiny_stream_pipeline_dir,
                                                                monkeypatch) -> None:
    from vgen.pipelines import StreamPipeline

    seen = []
    original = StreamPipeline.stream_config
    monkeypatch.setattr(StreamPipeline, "stream_config",
                        lambda self, **options: seen.append(original(self, **options)) or seen[-1])
    list(stream(str(tiny_stream_pipeline_dir), 1, 2, 0, "", " "))
    assert seen[-1].steps == 2 and seen[-1].cfg_scale == 1.0  # the tiny pipeline's recorded defaults
    list(stream(str(tiny_stream_pipeline_dir), 1, 2, 0, "3", "2.5"))
    assert seen[-1].steps == 3 and seen[-1].cfg_scale == 2.5


@pytest.mark.parametrize(("args", "message"), [
    ((0, 8, 0, "100000", ""), "steps must be an integer in [1, 1000], got 100000"),
    ((0, 8, 0, "", "1e309"), "cfg_scale must be a finite number, got '1e309'"),
    ((0, 8, 0, "", "lots"), "cfg_scale must be a number"),
    ((0, 0, 0, "", ""), "num_frames must be an integer in [1, 2000], got 0"),
    ((0, 10**6, 0, "", ""), "num_frames must be an integer in [1, 2000], got 1000000"),
    ((0, float("inf"), 0, "", ""), "num_frames must be a finite number"),
    ((5, 8, 0, "", ""), "class id 5 is out of range"),
])
def test_stream_settings_are_checked_before_anything_runs(stream, tiny_stream_pipeline_dir, args, message) -> None:
    with pytest.raises(ValueError) as e:
        next(stream(str(tiny_stream_pipeline_dir), *args))
    assert message in str(e.value)


def test_stop_ends_the_stream_at_the_next_denoising_step_inside_its_block(stream, tiny_stream_pipeline_dir,
                                                                          monkeypatch) -> None:
    sessions, velocity, steps = StreamSessions(), BlockStreamer._velocity, []

    def step(self, *args):
        steps.append(args[1])
        if len(steps) == 3:  # the first of the second block's 500 steps (the first block takes 2)
            assert sessions.stop("visitor") == "stopping"
        return velocity(self, *args)

    monkeypatch.setattr(BlockStreamer, "_velocity", step)
    with sessions.running("visitor") as control:
        outs = list(stream(str(tiny_stream_pipeline_dir), 1, 100, 0, "500", "", control=control))
    assert len(steps) == 3
    assert outs[-1][1] == "stopped: 2 frames" and read_video(Path(outs[-1][2])).shape[0] == 2


def test_stop_and_switch_reach_the_newest_stream_of_the_session() -> None:
    sessions = StreamSessions()
    older = sessions.running("visitor")
    first = older.__enter__()
    with sessions.running("visitor") as second:
        assert sessions.switch("visitor", 2) == "class 2 from the next block"
        assert second.pending_switch() == 2 and first.pending_switch() is None
        older.__exit__(None, None, None)  # the older stream ends first: the newer one keeps its controls
        assert sessions.stop("visitor") == "stopping" and second.cancelled and not first.stopped
        assert sessions.stop("another visitor") == "no stream is running"
        with pytest.raises(InputError, match="class_id must be a finite number"):
            sessions.switch("visitor", "inf")
    assert sessions.stop("visitor") == "no stream is running" and sessions.count() == 0



def test_a_text_stream_names_its_prompt_and_a_switch_reaches_it_at_the_next_block(stream, access,
                                                                                 tiny_text_stream_pipeline_dir,
                                                                                 monkeypatch) -> None:
    model, sessions, velocity, steps = str(tiny_text_stream_pipeline_dir), StreamSessions(), BlockStreamer._velocity, []

    def step(self, *args):
        steps.append(args[1])
        if len(steps) == 3:  # inside the second block: the switch applies from the third
            assert sessions.switch("visitor", "a blue ring") == "prompt 'a blue ring' from the next block"
        return velocity(self, *args)

    monkeypatch.setattr(BlockStreamer, "_velocity", step)
    with sessions.running("visitor", functools.partial(stream_target, model, access)) as control:
        outs = list(stream(model, "ignored", 6, 0, "2", "", "a red star", control=control))
    statuses = [status for _, status, _ in outs]
    assert statuses[0].startswith('frame 2 / 6, prompt "a red star", ') and "switched" not in statuses[1]
    assert statuses[2].startswith('frame 6 / 6, prompt "a blue ring", ') and "switched here (" in statuses[2]
    assert statuses[3] == "done: 6 frames" and read_video(Path(outs[-1][2])).shape == (6, 16, 16, 3)


def test_a_stop_during_a_switchs_re_cache_leaves_the_frames_before_it(stream, access, tiny_text_stream_pipeline_dir,
                                                                      monkeypatch) -> None:
    from vgen.models.blockdiff import BlockDiffusionTransformer

    model, sessions = str(tiny_text_stream_pipeline_dir), StreamSessions()
    recache = BlockDiffusionTransformer.clean_context

    def stopped(self, *args, **kwargs):
        assert sessions.stop("visitor") == "stopping"
        return recache(self, *args, **kwargs)

    monkeypatch.setattr(BlockDiffusionTransformer, "clean_context", stopped)
    with sessions.running("visitor") as control:
        frames = stream(model, 0, 100, 0, "", "", "a red star", control=control)
        next(frames), next(frames)
        control.switch_to("a blue ring")
        outs = list(frames)
    assert outs[-1][1] == "stopped: 4 frames" and read_video(Path(outs[-1][2])).shape[0] == 4


def test_the_switch_box_takes_a_prompt_for_a_text_stream_and_a_class_for_a_class_stream(
        access, tiny_text_stream_pipeline_dir, tiny_stream_pipeline_dir) -> None:
    text, classes = str(tiny_text_stream_pipeline_dir), str(tiny_stream_pipeline_dir)
    assert stream_target(text, access, " a blue ring ") == "a blue ring"
    assert stream_target(classes, access, "b") == 1 and stream_target(classes, access, 2) == 2
    for model, value, message in [(text, "2", "streams prompts: switch to a prompt, not a class id"),
                                  (text, 2, "streams prompts: switch to a prompt, not a class id"),
                                  (text, " ", "the prompt is empty"),
                                  (text, "x" * 10_000, "at most 256 are accepted"),
                                  (classes, "a blue ring", "unknown class 'a blue ring' for tiny-stream"),
                                  (classes, "7", "class id 7 is out of range")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            stream_target(model, access, value)


def test_a_text_stream_refuses_an_empty_prompt_and_a_class_stream_ignores_the_prompt_field(
        stream, tiny_text_stream_pipeline_dir, tiny_stream_pipeline_dir) -> None:
    with pytest.raises(InputError, match="the prompt is empty: tiny-text-stream draws what a prompt describes"):
        next(stream(str(tiny_text_stream_pipeline_dir), 0, 4, 0, "", "", "  "))
    assert next(stream(str(tiny_stream_pipeline_dir), 1, 2, 0, "", "", "a red star"))[1].startswith(
        "frame 2 / 2, class b")


def test_a_text_streams_status_notes_the_prompts_unknown_words(stream, tiny_text_stream_pipeline_dir) -> None:
    status = next(stream(str(tiny_text_stream_pipeline_dir), 0, 2, 0, "", "", "a red stars"))[1]
    assert status.startswith('frame 2 / 2, prompt "a red stars", ')
    assert "\n\n**Note:** the prompt's words this model does not know, read as unknown: stars (say 'star')" in status


def test_the_streaming_tab_offers_a_text_model_its_example_prompts_and_a_class_model_the_class_box(
        access, tiny_text_stream_pipeline_dir, tiny_stream_pipeline_dir) -> None:
    text = stream_controls(str(tiny_text_stream_pipeline_dir), access)
    examples = tuple(pipeline_info(tiny_text_stream_pipeline_dir).example_prompts)
    assert text.text and text.example_prompts == examples and len(examples) >= 2
    assert text.switch_value() == examples[1] and text.switch_help().startswith("a prompt")
    classes = stream_controls(str(tiny_stream_pipeline_dir), access)
    assert not classes.text and classes.example_prompts == () and classes.switch_value() == "1"
    assert classes.settings["steps"] == 2  # the pipeline's recorded default
    assert stream_controls("/not/offered", access) == gradio_app.StreamControls()

def test_a_session_that_goes_away_cancels_all_its_streams() -> None:
    sessions = StreamSessions()
    with sessions.running("gone") as a, sessions.running("gone") as b, sessions.running("stays") as c:
        sessions.end("gone")
        assert a.cancelled and b.cancelled and not c.stopped


def test_a_consumer_that_goes_away_cancels_the_step_in_hand_and_the_items_close_after_it() -> None:
    in_step, released, closed = threading.Event(), threading.Event(), threading.Event()

    def items():
        try:
            yield 1
            in_step.set()
            released.wait(30)  # a long step, until cancelled
            yield 2
        finally:
            closed.set()

    async def consume() -> float:
        iterator = iterate_in_thread(items(), released.set)
        assert await anext(iterator) == 1
        task = asyncio.ensure_future(anext(iterator))
        await asyncio.to_thread(in_step.wait, 30)
        start = time.perf_counter()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.perf_counter() - start

    assert asyncio.run(consume()) < 5 and released.is_set()
    assert closed.wait(10)  # closed in the worker once the step returned

    async def finish() -> list:
        return [item async for item in iterate_in_thread((i for i in (1, 2)), lambda: pytest.fail("cancelled"))]

    assert asyncio.run(finish()) == [1, 2]


def test_a_video_model_gives_a_playable_clip_and_its_first_frames(gen, tiny_video_pipeline_dir) -> None:
    from vgen.pipelines import load

    grid, amap, stats, ar, clip = gen(str(tiny_video_pipeline_dir), "nbp", **{**SETTINGS, "num_images": 2})
    frames = read_video(Path(clip))
    assert frames.shape == (3, 16, 2 * 16, 3)  # 3 frames of the 2 clips side by side
    expected = load(tiny_video_pipeline_dir)([1], num_videos=2, seed=0).videos
    assert np.array_equal(np.asarray(grid), np.concatenate([expected[0, 0], expected[1, 0]], axis=1))
    assert np.abs(frames.astype(int) - np.concatenate(list(expected), axis=2).astype(int)).mean() < 20  # codec
    assert amap is None and ar is None and "| target forward passes | 3 |" in stats


def test_a_video_model_draws_clips_of_the_frames_asked_for_window_by_window(gen, tiny_video_pipeline_dir) -> None:
    from vgen.pipelines import load

    _, _, stats, _, clip = gen(str(tiny_video_pipeline_dir), "nbp", clip_frames=5, **{**SETTINGS, "num_images": 1})
    frames = read_video(Path(clip))
    assert frames.shape == (5, 16, 16, 3)
    expected = load(tiny_video_pipeline_dir)([1], seed=0, num_frames=5).videos[0]
    assert np.abs(frames.astype(int) - expected.astype(int)).mean() < 20  # the same clip through the codec
    assert "| target forward passes | 5 |" in stats  # 3 frames, then a window of 2 new frames
    for bad in (-1, 65, 2.5):  # 0: the model's window
        with pytest.raises(InputError, match="clip_frames must be"):
            gen(str(tiny_video_pipeline_dir), "nbp", clip_frames=bad, **SETTINGS)
    assert model_controls(str(tiny_video_pipeline_dir), ModelAccess(local_paths=True)).video


def test_the_sampler_list_follows_the_token_order_and_a_nar_model_has_no_ar_comparison(
        tiny_model, tiny_pipeline_dir, tiny_nar_factory, tmp_path) -> None:
    from vgen.pipelines import load

    local = ModelAccess(local_paths=True)
    raster = model_controls(tiny_model, local).samplers
    assert "ar" in raster and "sjd" in raster and "nar" not in raster
    pipe = load(tiny_pipeline_dir)
    nar = type(pipe)(tiny_nar_factory((4, 4), vocab_size=32, num_classes=3), pipe.tokenizer, pipe.info)
    assert model_controls(str(nar.save_pretrained(tmp_path / "nar")), local).samplers == ["nar"]
    assert model_controls(str(tmp_path / "missing"), local).samplers == available_samplers()  # Generate says why
    with pytest.raises(InputError, match="next-neighbour order: there is no vanilla AR run of it"):
        generate(str(tmp_path / "nar"), "nar", **SETTINGS, compare=True, folder=tmp_path, access=local)


def test_the_generate_tab_refuses_a_streaming_model_and_the_stream_tab_a_token_model(
        gen, stream, tiny_model, tiny_stream_pipeline_dir) -> None:
    with pytest.raises(InputError, match="use the Streaming tab"):
        gen(str(tiny_stream_pipeline_dir), "ar", **SETTINGS)
    with pytest.raises(InputError, match="use the Generate tab"):
        next(stream(tiny_model, 0, 8, 0, 2, 1.0))


# ---- a text-to-image model: the prompt box ----------------------------------------------------------------------

PROMPT = "a large blue ring on a yellow background"


def test_a_text_model_draws_the_prompt_and_ignores_the_class_field(gen, tiny_t2i) -> None:
    from vgen.pipelines import load

    grid, amap, stats, ar, clip = gen(tiny_t2i, "sjd", **{**SETTINGS, "class_id": None}, prompt=f"  {PROMPT}\n")
    expected = load(tiny_t2i)(prompt=PROMPT, num_images=3, sampler="sjd", seed=0, temperature=1.0, top_k=0,
                              top_p=1.0).images
    assert grid.tobytes() == image_grid(expected, 3).tobytes() and amap is not None and ar is None and clip is None
    assert gen(tiny_t2i, "sjd", **SETTINGS, prompt="a small red star")[0].tobytes() != grid.tobytes()


def test_a_text_model_compares_with_ar_on_the_same_prompt(gen, tiny_t2i) -> None:
    grid, _, stats, ar, _ = gen(tiny_t2i, "mcsjd", **{**SETTINGS, "temperature": 0.0}, prompt=PROMPT, compare=True)
    assert "step compression vs AR" in stats and ar.tobytes() == grid.tobytes()


@pytest.mark.parametrize(("prompt", "message"), [
    ("", f"the prompt is empty: tiny-t2i draws what a prompt describes, e.g. {EXAMPLE_PROMPTS[0]!r}"),
    (" \n ", "the prompt is empty"),
    (None, "the prompt is empty"),
    ("a red star " * 8, "the prompt has 24 words; tiny-t2i reads at most 23: shorten it"),
    ("x" * 1_000_000, f"prompt is 1000000 characters long; at most {MAX_TEXT} are accepted"),
])
def test_a_bad_prompt_gets_its_own_message(gen, tiny_t2i, prompt, message) -> None:
    with pytest.raises(InputError) as e:
        gen(tiny_t2i, "ar", **SETTINGS, prompt=prompt)
    assert str(e.value) == message or str(e.value).startswith(message)
    assert len(str(e.value)) < 200  # never the prompt itself


def test_unknown_prompt_words_are_noted_under_the_stats_with_what_to_say(gen, tiny_t2i) -> None:
    stats = gen(tiny_t2i, "ar", **SETTINGS, prompt="two red stars")[2]
    assert stats.endswith("**Note:** the prompt's words this model does not know, read as unknown: stars (say "
                          "'star'), two; stars, two: the model draws a single shape")
    assert "Note" not in gen(tiny_t2i, "ar", **SETTINGS, prompt="a red star")[2]


def test_a_class_model_ignores_the_prompt_field(gen, tiny_model) -> None:
    plain = gen(tiny_model, "ar", **SETTINGS)[0]
    assert gen(tiny_model, "ar", **SETTINGS, prompt="x" * 1_000_000)[0].tobytes() == plain.tobytes()


def test_the_controls_follow_the_model(access, tiny_model, tiny_t2i) -> None:
    raster, settings = available_samplers("raster"), dict(temperature=1.0, top_k=0, top_p=1.0, cfg_scale=2.0,
                                                          cfg_interval=-1)  # the tiny models' cfg_scale
    assert model_controls(tiny_model, access) == ModelControls(raster, class_names=("a", "b", "c"),
                                                               settings=settings)
    words = tuple(vocabulary_lines(caption_vocabulary()))
    assert model_controls(tiny_t2i, access) == ModelControls(raster, True, EXAMPLE_PROMPTS[:3], vocabulary=words,
                                                             settings=settings)
    assert model_controls("/etc", access) == ModelControls(available_samplers())  # Generate says why
    assert model_controls(tiny_model, access).class_help() == "a class name: a, b, c, or its id (0 = the first)"
    shown = model_controls(tiny_t2i, access).vocabulary_markdown()
    assert "(a single shape)" in shown and "\n- colour: blue, cyan, golden," in shown


def test_the_class_box_takes_a_name_or_an_id(gen, tiny_model) -> None:
    by_name, by_id = gen(tiny_model, "ar", **{**SETTINGS, "class_id": " b "}), gen(tiny_model, "ar", **SETTINGS)
    assert by_name[0].tobytes() == by_id[0].tobytes()  # class 1 is b
    with pytest.raises(ValueError, match=r"unknown class 'zebra' for tiny; classes: a, b, c \(or ids 0..2\)"):
        gen(tiny_model, "ar", **{**SETTINGS, "class_id": "zebra"})
    with pytest.raises(ValueError, match="class_id must be a finite number, got 'nan'"):
        gen(tiny_model, "ar", **{**SETTINGS, "class_id": "nan"})


def test_a_class_switch_takes_a_name_the_streams_model_has() -> None:
    sessions = StreamSessions()
    with sessions.running("visitor", {"circle": 0, "star": 3}.__getitem__) as control:
        assert sessions.switch("visitor", "star") == "class 3 from the next block" and control.pending_switch() == 3
    with sessions.running("visitor"), pytest.raises(InputError, match="takes class ids, not names such as 'star'"):
        sessions.switch("visitor", "star")


def page_fields(app) -> dict[str, dict]:
    """The props of the page's components, by label."""
    return {c["props"]["label"]: c["props"] for c in app.config["components"] if c.get("props", {}).get("label")}


def test_the_page_opens_with_the_prompt_box_for_a_text_model_and_the_class_picker_for_a_class_model(
        access, tiny_t2i) -> None:
    for default, text in (("shapes-c2i", False), (tiny_t2i, True)):
        fields = page_fields(build_app(default, access=access))
        assert fields["prompt"]["visible"] is text and fields["class name or id"]["visible"] is not text
        assert fields["example prompts"]["visible"] is text
    fields = page_fields(build_app(tiny_t2i, access=access))
    assert fields["prompt"]["value"] == EXAMPLE_PROMPTS[0]  # ready to generate
    assert [choice[0] for choice in fields["example prompts"]["choices"]] == list(EXAMPLE_PROMPTS[:3])
    # the Streaming tab opens on the first streaming model, the embedded class model: the class box, a class switch
    assert fields["class of the video"]["visible"] and not fields["prompt of the video"]["visible"]
    assert fields["switch to"]["value"] == "1"


def test_the_page_sends_no_analytics_and_shows_numbers_with_their_bounds_and_the_models_values(access) -> None:
    app = build_app("shapes-c2i", access=access)
    assert app.config["analytics_enabled"] is False and os.environ["GRADIO_ANALYTICS_ENABLED"] == "False"
    fields = {}
    for c in app.config["components"]:  # the first of a label: the Generate tab's
        fields.setdefault(c.get("props", {}).get("label"), c)
    shown = {name: {k: fields[name]["props"][k] for k in ("minimum", "maximum", "step", "value")}
             for name in ("top_p", "cfg_scale", "window", "number of images")}
    assert shown == {"top_p": dict(minimum=0, maximum=1, step=0.01, value=1.0),
                     "cfg_scale": dict(minimum=0, maximum=100.0, step=0.01, value=4.0),  # shapes-c2i's own
                     "window": dict(minimum=0, maximum=65536, step=1, value=16),
                     "number of images": dict(minimum=1, maximum=16, step=1, value=4)}
    assert {fields[name]["type"] for name in shown} == {"number"} and fields["class name or id"]["type"] == "textbox"
    assert fields["accept"]["type"] == "dropdown" and fields["accept"]["props"]["value"] == ""


# ---- the command ------------------------------------------------------------------------------------------------


def test_app_flags_show_their_defaults_and_pass_the_model_access_on(tiny_model, monkeypatch, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["app", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "(default: 127.0.0.1)" in help_text and "(default: 2)" in help_text
    assert "--allow-local-models" in help_text and "--model-dir DIR" in help_text
    built, served = [], []
    monkeypatch.setattr(gradio_app, "build_app", lambda *args: built.append(args))
    monkeypatch.setattr(gradio_app, "serve", lambda app, *args: served.append(args))
    assert main(["app", "--model-dir", tiny_model, "--model", tiny_model, "--max-concurrency", "3"]) == 0
    assert built == [(tiny_model, 3, ModelAccess(folders=(tiny_model,)))] and served == [("127.0.0.1", 7860, False)]
    assert main(["app"]) == 0
    assert built[-1][0] == DEFAULT_TEXT_MODEL  # people type prompts: the page opens on the embedded text model


@pytest.mark.parametrize(("argv", "message"), [
    (["--model-dir", "/no/such/folder"], "--model-dir /no/such/folder is not a model folder vgen.load reads"),
    (["--model", "/some/folder"], "--model /some/folder is neither embedded nor a --model-dir"),
])
def test_app_refuses_a_model_it_would_not_serve(argv, message, capsys) -> None:
    assert main(["app", *argv]) == 2
    assert message in capsys.readouterr().err


# ---- the live app -----------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(access: ModelAccess, temp: Path, max_concurrency: int = 2, sessions: StreamSessions | None = None):
    """The app on a free loopback port for the block, with the requests' folders in ``temp``/requests and Gradio's
    cache in ``temp``/gradio; heartbeats every 0.2 s, so that a client that goes away is noticed at once."""
    (temp / "requests").mkdir(parents=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRADIO_HEARTBEAT_INTERVAL", "0.2")
        mp.setenv("GRADIO_TEMP_DIR", str(temp / "gradio"))
        mp.setattr(tempfile, "tempdir", str(temp / "requests"))
        app = build_app("shapes-c2i", max_concurrency, access, sessions)
        port = _free_port()
        serve(app, port=port, prevent_thread_lock=True, quiet=True)
        try:
            yield f"http://127.0.0.1:{port}/"
        finally:
            app.close()


@pytest.fixture(scope="module")
def live(access, tmp_path_factory):
    """A live app, its stream sessions and the folder its requests' temporary folders go to."""
    temp = tmp_path_factory.mktemp("live")
    sessions = StreamSessions()
    with served(access, temp, 2, sessions) as url:
        yield gradio_client.Client(url, verbose=False), sessions, temp / "requests"


@pytest.fixture(scope="module")
def live_app(live):
    return live[0]


def call(client, sampler: str = "sjd", **overrides):
    """The page's /generate with every option field empty but those in ``overrides``."""
    values = {**dict.fromkeys(GENERATE_INPUTS, ""), **dict(model=None, sampler=sampler, class_id=1, num_images=2,
                                                          seed=0, temperature=1.0, top_k=0, top_p=1.0, compare=False,
                                                          gpt_model="GPT-B", image_size=256), **overrides}
    return client.predict(*[values[name] for name in GENERATE_INPUTS], api_name="/generate")


def raw_call(client, api_name: str, data_json: str) -> tuple[str, object]:
    """One call through Gradio's HTTP API with ``data_json`` sent as written (JSON may say 1e400 or NaN): the
    final event (``complete`` or ``error``) and its data."""
    base = f"{client.src.rstrip('/')}/gradio_api/call/{api_name}"
    posted = httpx.post(base, content=f'{{"data": {data_json}}}', headers={"content-type": "application/json"})
    posted.raise_for_status()
    with httpx.stream("GET", f"{base}/{posted.json()['event_id']}", timeout=120) as response:
        lines = [line for line in response.iter_lines() if line]
    event = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")][-1]
    return event, json.loads([line.removeprefix("data: ") for line in lines if line.startswith("data: ")][-1])


def test_live_app_generates_non_blank_images_and_compares(live_app, tiny_model) -> None:
    images, amap, stats, ar, clip = call(live_app, model=tiny_model, window="4", compare=True)
    pixels = np.asarray(Image.open(images))
    assert pixels.shape == (16, 32, 3) and pixels.std() > 0
    assert Image.open(amap).size[0] > 0 and "step compression vs AR" in stats and ar


def test_live_app_gives_a_playable_clip_and_keeps_no_temporary_folder(live, tiny_video_pipeline_dir) -> None:
    client, _, temp = live
    first_frames, amap, stats, ar, clip = call(client, "nbp", model=str(tiny_video_pipeline_dir), num_images=2)
    video = clip["video"] if isinstance(clip, dict) else clip
    assert read_video(Path(video)).shape == (3, 16, 32, 3)  # 3 frames of 2 clips side by side
    assert np.asarray(Image.open(first_frames)).shape == (16, 32, 3) and amap is None and ar is None
    assert not list(temp.glob(f"{TEMP_PREFIX}*"))  # the request's folder went once Gradio had its copy


def test_live_app_draws_a_prompt(live_app, tiny_t2i) -> None:
    images, amap, stats, _, _ = call(live_app, model=tiny_t2i, prompt=PROMPT, class_id="")
    pixels = np.asarray(Image.open(images))
    assert pixels.shape == (16, 32, 3) and pixels.std() > 0 and "tokens per forward" in stats
    with pytest.raises(Exception, match="the prompt is empty: tiny-t2i draws what a prompt describes"):
        call(live_app, model=tiny_t2i, prompt=" ")


def test_live_app_names_the_parameters_of_generate(live_app) -> None:
    endpoint = live_app.view_api(return_format="dict", print_info=False)["named_endpoints"]["/generate"]
    assert [parameter["parameter_name"] for parameter in endpoint["parameters"]] == GENERATE_INPUTS


def test_the_launch_lines_give_the_commands_flag_for_a_public_link(tmp_path, capsys, monkeypatch) -> None:
    import gradio as gr

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    with gr.Blocks(analytics_enabled=False) as app:
        gr.Markdown("a page")
    serve(app, port=_free_port(), prevent_thread_lock=True)
    app.close()
    printed = capsys.readouterr().out
    assert "Running on local URL" in printed and "run `vgen app --share`" in printed and "share=True" not in printed


def test_live_app_shows_bad_input_and_keeps_serving(live_app, tiny_model) -> None:
    with pytest.raises(Exception, match=r"window must be an integer in \[0, "):
        call(live_app, model=tiny_model, window="-1")
    with pytest.raises(Exception, match="class id 9 is out of range"):
        call(live_app, model=tiny_model, class_id=9)
    with pytest.raises(Exception, match="unknown model '/etc'"):
        call(live_app, model="/etc")
    assert call(live_app, model=tiny_model)[0]  # still serving


BAD_VALUES = {"1e400": "must be a finite number", "-1e400": "must be a finite number",
              "NaN": "must be a finite number", '"' + "7" * 100_000 + '"': "is 100000 characters long",
              "[1, 2]": "must be a number, got '[1, 2]'", '{"a": 1}': "must be a number", "true": "must be a number"}
HUGE = {"class_id": "is out of range", "num_images": "must be an integer in [1, 16]",
        "seed": "must be an integer in [0, ", "cfg_scale": "cfg_scale must be in [0, 100.0]",
        "top_k": "top_k must be an integer in [0, ", "window": "window must be an integer in [0, "}  # to 1e30


@pytest.mark.parametrize("field", ["class_id", "num_images", "seed", "cfg_scale", "top_k", "window"])
def test_every_field_answers_an_absurd_value_with_its_own_message(live_app, tiny_model, field) -> None:
    values = {**dict.fromkeys(GENERATE_INPUTS, ""), **dict(model=tiny_model, sampler="sjd", class_id=1, num_images=1,
                                                          seed=0, compare=False, gpt_model="GPT-B", image_size=256)}
    # text in the class box is a class name
    names = {"[1, 2]": "unknown class '[1, 2]'", '{"a": 1}': "unknown class", "true": "unknown class 'True'"}
    for text, message in {**BAD_VALUES, "1e30": HUGE[field], **(names if field == "class_id" else {})}.items():
        data = json.dumps([values[name] if name != field else "VALUE" for name in GENERATE_INPUTS])
        event, answer = raw_call(live_app, "generate", data.replace('"VALUE"', text))
        assert event == "error" and message in answer["error"] and len(answer["error"]) < 200, (text, answer)


def test_the_page_shows_a_refusal_on_one_line_with_every_echoed_value_cut() -> None:
    message = page_message(InputError(f"class id {10**308} is out of range; got {'x y ' * 50!r}\nand 12345"))
    assert message == (f"class id 1{'0' * 59}... (309 digits) is out of range; got '{('x y ' * 50)[:59]}... "
                       f"(200 characters)\\nand 12345")


def test_live_app_cuts_every_value_it_echoes(live_app, tiny_model) -> None:
    values = {**dict.fromkeys(GENERATE_INPUTS, ""), **dict(model=tiny_model, sampler="ar", class_id=1, num_images=1,
                                                          seed=0, compare=False, gpt_model="GPT-B", image_size=256)}
    for field, text, said in [("class_id", "1e308", "is out of range"), ("seed", "1e308", "must be an integer in"),
                              ("model", json.dumps("a model " * 25), "... (199 characters); this server offers")]:
        data = json.dumps([values[name] if name != field else "VALUE" for name in GENERATE_INPUTS])
        event, answer = raw_call(live_app, "generate", data.replace('"VALUE"', text))
        assert event == "error" and said in answer["error"] and "... (" in answer["error"], (field, answer)
        assert not re.search(r"\d{61}", answer["error"]) and "a model " * 10 not in answer["error"]
    prompt = "a red star " * 10_000  # the model switch leaves the prompt box as it is, without sending it back
    event, answer = raw_call(live_app, "false", json.dumps([tiny_model, "ar", prompt]))
    assert event == "complete" and "a red star a red star" not in json.dumps(answer)


def test_a_refusal_is_logged_as_one_line_and_a_bug_with_its_traceback(live_app, tiny_model, caplog, capsys,
                                                                      monkeypatch) -> None:
    bad = [dict(class_id=9), dict(window="-1"), dict(model="/etc"), dict(seed="1e308"), dict(sampler="x" * 300)]
    with caplog.at_level(logging.WARNING, logger=gradio_app.__name__):
        for overrides in bad:
            with pytest.raises(gradio_client.exceptions.AppError):
                call(live_app, **{"model": tiny_model, **overrides})
    refusals = [r for r in caplog.records if r.name == gradio_app.__name__]
    assert len(refusals) == len(bad)
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in refusals)
    assert "Traceback" not in capsys.readouterr().err

    def bug(*args, **kwargs):
        raise RuntimeError("a bug, not a refusal")

    monkeypatch.setattr(gradio_app, "generate", bug)
    with pytest.raises(gradio_client.exceptions.AppError):
        call(live_app, model=tiny_model)
    assert "Traceback" in capsys.readouterr().err  # a real bug keeps its traceback in the server's log


def files_in(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


def serving(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.slow  # ~25 s: a fresh process imports torch and gradio
def test_sigterm_stops_the_app_and_removes_gradios_cache_with_a_page_connected(tiny_model, tmp_path) -> None:
    port, cache = _free_port(), tmp_path / "gradio"
    url = f"http://127.0.0.1:{port}/"
    app = subprocess.Popen([sys.executable, "-m", "vgen.apps.cli", "app", "--port", str(port), "--model-dir",
                            tiny_model, "--model", tiny_model], env={**os.environ, "GRADIO_TEMP_DIR": str(cache)},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_for(lambda: app.poll() is not None or serving(url), 120) and app.poll() is None
        client = gradio_client.Client(url, verbose=False)  # holds its heartbeat open, as an open tab does
        assert call(client, model=tiny_model)[0] and files_in(cache)  # Gradio keeps a copy of the images
        app.send_signal(signal.SIGTERM)
        assert app.wait(timeout=60) == 0, app.stdout.read()[-2000:]
        client.close()
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
    assert not files_in(cache)


def test_twenty_concurrent_requests_all_complete(live_app, tiny_model) -> None:
    with ThreadPoolExecutor(max_workers=20) as pool:
        results = list(pool.map(lambda seed: call(live_app, model=tiny_model, seed=seed), range(20)))
    assert len(results) == 20 and all(r[0] for r in results)


def wait_for(condition, timeout: float = 60) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline and not condition():
        time.sleep(0.05)
    return condition()


def test_live_app_streams_until_stop_and_other_sessions_cannot_stop_it(live, tiny_stream_pipeline_dir) -> None:
    client, sessions, temp = live
    job = client.submit(str(tiny_stream_pipeline_dir), 0, 2000, 0, 1, 1.0, api_name="/stream")
    assert wait_for(lambda: len(job.outputs()) >= 2), "no frames arrived"
    other_visitor = gradio_client.Client(client.src, verbose=False)  # another browser session
    assert other_visitor.predict(api_name="/stop_stream") == "no stream is running"
    assert other_visitor.predict(3, api_name="/switch_class") == "no stream is running"
    assert not job.done()
    assert client.predict(api_name="/stop_stream") == "stopping"
    frame, status, video = job.result(timeout=60)
    assert status.startswith("stopped: ")
    frames_done = int(status.split()[1])
    assert read_video(Path(video["video"] if isinstance(video, dict) else video)).shape[0] == frames_done > 0
    assert np.asarray(Image.open(frame)).std() > 0
    assert wait_for(lambda: not list(temp.glob(f"{TEMP_PREFIX}*")), 10)


@pytest.fixture
def slow_steps(monkeypatch):
    """The denoising steps run from here on, each ``hook.delay`` s slower: (steps, hook)."""
    velocity, steps = BlockStreamer._velocity, []

    def hook(self, *args):
        steps.append(args[1])
        time.sleep(hook.delay)
        return velocity(self, *args)

    hook.delay = 0.0
    monkeypatch.setattr(BlockStreamer, "_velocity", hook)
    return steps, hook


@pytest.mark.parametrize("goes_away", ["cancels the event", "closes its session"])
def test_a_stream_whose_client_goes_away_stops_inside_its_block(live, tiny_stream_pipeline_dir, slow_steps,
                                                               goes_away) -> None:
    client, sessions, temp = live
    steps, hook = slow_steps
    visitor = gradio_client.Client(client.src, verbose=False)
    job = visitor.submit(str(tiny_stream_pipeline_dir), 0, 2000, 0, "1000", "", api_name="/stream")
    assert wait_for(lambda: len(job.outputs()) >= 1), "no frames arrived"
    hook.delay = 0.005  # the second block: 1000 steps of >= 5 ms
    assert wait_for(lambda: len(steps) > 2 + 10)
    visitor.close() if goes_away == "closes its session" else job.cancel()
    assert wait_for(lambda: sessions.count() == 0, 20)
    time.sleep(0.5)
    stopped_at = len(steps)
    time.sleep(0.5)
    assert len(steps) == stopped_at < 2 + 1000  # no step ran after the stop, and the block was cut short
    assert wait_for(lambda: not list(temp.glob(f"{TEMP_PREFIX}*")), 10)


@contextlib.contextmanager
def counted(active: list[int], peak: list[int], lock: threading.Lock):
    with lock:
        active[0] += 1
        peak[0] = max(peak[0], active[0])
    try:
        time.sleep(0.3)  # long enough for the other requests to overlap this one if they could
        yield
    finally:
        with lock:
            active[0] -= 1


def test_one_concurrency_limit_covers_generations_and_streams(access, tiny_model, tiny_stream_pipeline_dir,
                                                              monkeypatch, tmp_path) -> None:
    active, peak, lock = [0], [0], threading.Lock()
    run_generate, run_stream = gradio_app.generate, gradio_app.stream_video

    def generate_counted(*args, **kwargs):
        with counted(active, peak, lock):
            return run_generate(*args, **kwargs)

    def stream_counted(*args, **kwargs):
        with counted(active, peak, lock):
            yield from run_stream(*args, **kwargs)

    monkeypatch.setattr(gradio_app, "generate", generate_counted)
    monkeypatch.setattr(gradio_app, "stream_video", stream_counted)
    with served(access, tmp_path, max_concurrency=2) as url:
        client = gradio_client.Client(url, verbose=False)
        jobs = [client.submit(str(tiny_stream_pipeline_dir), 0, 4, seed, "", "", api_name="/stream")
                for seed in range(3)]
        with ThreadPoolExecutor(max_workers=3) as pool:
            images = list(pool.map(lambda seed: call(client, model=tiny_model, seed=seed), range(3)))
        statuses = [job.result(timeout=120)[1] for job in jobs]
    assert all(images) and statuses == ["done: 4 frames"] * 3
    assert peak[0] == 2  # 6 requests over 2 endpoints, never more than 2 at once


def resident_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the resident memory from /proc")
def test_soak_twenty_generations_and_four_streams_at_once(access, tiny_model, tiny_video_pipeline_dir,
                                                          tiny_stream_pipeline_dir, tmp_path) -> None:
    """Every request answered within the time bound, memory back near its level before, no file left behind
    by the requests or (after exit) by Gradio's cache."""
    samplers = ("ar", "sjd", "mcsjd", "lantern")
    requests = [dict(model=tiny_model, sampler=samplers[i % 4], seed=i, num_images=1 + i % 3) for i in range(16)]
    requests += [dict(model=str(tiny_video_pipeline_dir), sampler="nbp", seed=i) for i in range(4)]
    with served(access, tmp_path, max_concurrency=2) as url:
        client = gradio_client.Client(url, verbose=False, download_files=False)
        call(client, model=tiny_model)  # loads the models and warms the server before the baseline
        call(client, "nbp", model=str(tiny_video_pipeline_dir))
        list(client.submit(str(tiny_stream_pipeline_dir), 0, 4, 0, "", "", api_name="/stream"))
        gc.collect()
        before, start = resident_mb(), time.perf_counter()
        streams = [client.submit(str(tiny_stream_pipeline_dir), i % 3, 8, i, "", "", api_name="/stream")
                   for i in range(4)]
        with ThreadPoolExecutor(max_workers=20) as pool:
            answers = list(pool.map(lambda r: call(client, **r), requests))
        statuses = [job.result(timeout=120)[1] for job in streams]
        elapsed = time.perf_counter() - start
        gc.collect()
        after = resident_mb()
        assert not list((tmp_path / "requests").iterdir())  # no request left a folder
    assert len(answers) == 20 and all(a[0] for a in answers) and statuses == ["done: 8 frames"] * 4
    assert elapsed < 120, f"the soak took {elapsed:.0f} s"
    assert after - before < 150, f"resident memory grew from {before:.0f} MB to {after:.0f} MB"
    assert not [p for p in (tmp_path / "gradio").rglob("*") if p.is_file()]  # Gradio's cache went at exit
