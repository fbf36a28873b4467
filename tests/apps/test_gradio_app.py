"""The web demo: the page's generate and stream functions over the pipeline API, then the live app on loopback
driven with gradio_client: generate, compare with AR, stream and stop, bad input shown as a message while the app
keeps serving, and 20 concurrent requests."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vgen.apps.gradio_app import (
    GENERATE_INPUTS,
    InputError,
    build_app,
    generate,
    sampler_options,
    samplers_for,
    stop_stream,
    stream_video,
    switch_class,
)
from vgen.eval.videos import read_video

gradio_client = pytest.importorskip("gradio_client")


@pytest.fixture(scope="module")
def tiny_model(tiny_pipeline_dir) -> str:
    return str(tiny_pipeline_dir)


SETTINGS = dict(class_id=1, num_images=3, seed=0, cfg_scale="", temperature=1.0, top_k=0, top_p=1.0)


def test_generate_returns_images_an_acceptance_map_and_stats(tiny_model) -> None:
    grid, amap, stats, ar, clip = generate(tiny_model, "sjd", **SETTINGS, window=4)
    assert grid.size == (3 * 16, 16) and amap is not None and ar is None and clip is None
    assert "tokens per forward" in stats and "| sampler | sjd |" in stats


def test_compare_runs_vanilla_ar_on_the_same_seed(tiny_model) -> None:
    grid, _, stats, ar, _ = generate(tiny_model, "mcsjd", **{**SETTINGS, "temperature": 0.0}, compare=True)
    assert "step compression vs AR" in stats and "latency ratio vs AR" in stats
    assert ar.tobytes() == grid.tobytes()  # greedy: the lossless sampler draws AR's images


def test_empty_sampling_fields_take_the_models_defaults(tiny_model) -> None:
    explicit = generate(tiny_model, "ar", **SETTINGS)[0]
    empty = generate(tiny_model, "ar", **{**SETTINGS, "temperature": "", "top_k": " ", "top_p": ""})[0]
    assert empty.tobytes() == explicit.tobytes()  # the tiny model's defaults are temperature 1, no filters
    assert generate(tiny_model, "ar", **{**SETTINGS, "temperature": "0.5"})[0].tobytes() != explicit.tobytes()


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
    (dict(num_images=99), "number of images must be in 1..16"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_k="many"), "top_k must be a number"),
    (dict(top_k="2.5"), "top_k must be a whole number"),
    (dict(cfg_scale="strong"), "cfg_scale must be a number"),
    (dict(cfg_interval="-2"), "cfg_interval must be an integer >= -1"),
    (dict(sampler="sjd", window=0), "window must be an integer >= 1"),
    (dict(sampler="sjd", drafter="head"), "needs a draft head"),
    (dict(gpt_ckpt="/no/such/gpt.pt", vq_ckpt="/no/such/vq.pt"), "checkpoint not found: /no/such/"),
    (dict(gpt_ckpt="/no/such/gpt.pt"), "need both a GPT and a VQ checkpoint"),
])
def test_bad_input_raises_a_specific_message(tiny_model, kwargs, message) -> None:
    args = {"model": tiny_model, "sampler": "ar", **SETTINGS, **kwargs}
    with pytest.raises(Exception, match=message.replace("(", "\\(").replace(")", "\\)")):
        generate(**args)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def live_app(tiny_model):
    app = build_app(tiny_model, max_concurrency=2)
    port = _free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    yield gradio_client.Client(f"http://127.0.0.1:{port}/", verbose=False)
    app.close()


def call(client, sampler: str = "sjd", **overrides):
    """The page's /generate with every option field empty but those in ``overrides``."""
    values = {**dict.fromkeys(GENERATE_INPUTS, ""), **dict(model=None, sampler=sampler, class_id=1, num_images=2,
                                                          seed=0, temperature=1.0, top_k=0, top_p=1.0, compare=False,
                                                          gpt_model="GPT-B", image_size=256), **overrides}
    return client.predict(*[values[name] for name in GENERATE_INPUTS], api_name="/generate")


def test_live_app_generates_non_blank_images_and_compares(live_app, tiny_model) -> None:
    images, amap, stats, ar, clip = call(live_app, model=tiny_model, window="4", compare=True)
    pixels = np.asarray(Image.open(images))
    assert pixels.shape == (16, 32, 3) and pixels.std() > 0
    assert Image.open(amap).size[0] > 0 and "step compression vs AR" in stats and ar


def test_live_app_gives_a_playable_clip_for_a_video_model(live_app, tiny_video_pipeline_dir) -> None:
    first_frames, amap, stats, ar, clip = call(live_app, "nbp", model=str(tiny_video_pipeline_dir), num_images=2)
    video = clip["video"] if isinstance(clip, dict) else clip
    assert read_video(Path(video)).shape == (3, 16, 32, 3)  # 3 frames of 2 clips side by side
    assert np.asarray(Image.open(first_frames)).shape == (16, 32, 3) and amap is None and ar is None


def test_live_app_shows_bad_input_and_keeps_serving(live_app, tiny_model) -> None:
    with pytest.raises(Exception, match="window must be an integer >= 1"):
        call(live_app, model=tiny_model, window="0")
    with pytest.raises(Exception, match="class id 9 is out of range"):
        call(live_app, model=tiny_model, class_id=9)
    assert call(live_app, model=tiny_model)[0]  # still serving


def test_twenty_concurrent_requests_all_complete(live_app, tiny_model) -> None:
    with ThreadPoolExecutor(max_workers=20) as pool:
        results = list(pool.map(lambda seed: call(live_app, model=tiny_model, seed=seed), range(20)))
    assert len(results) == 20 and all(r[0] for r in results)


def test_stream_video_shows_each_block_then_the_mp4(tiny_stream_pipeline_dir) -> None:
    outs = list(stream_video(str(tiny_stream_pipeline_dir), 1, 6, 0, 2, 1.0, session="whole"))
    assert len(outs) == 4  # three blocks of two frames, then the file
    assert [o[2] for o in outs[:3]] == [None] * 3 and "frame 6 / 6" in outs[2][1]
    assert outs[-1][1] == "done: 6 frames" and read_video(Path(outs[-1][2])).shape == (6, 16, 16, 3)


def test_stream_video_keeps_the_models_defaults_for_empty_fields(tiny_stream_pipeline_dir, monkeypatch) -> None:
    from vgen.pipelines import StreamPipeline

    seen = []
    original = StreamPipeline.stream_config
    monkeypatch.setattr(StreamPipeline, "stream_config",
                        lambda self, **options: seen.append(original(self, **options)) or seen[-1])
    list(stream_video(str(tiny_stream_pipeline_dir), 1, 2, 0, "", " ", session="defaults"))
    assert seen[-1].steps == 2 and seen[-1].cfg_scale == 1.0  # the tiny pipeline's recorded defaults
    list(stream_video(str(tiny_stream_pipeline_dir), 1, 2, 0, "3", "2.5", session="defaults"))
    assert seen[-1].steps == 3 and seen[-1].cfg_scale == 2.5
    with pytest.raises(InputError, match="cfg_scale must be a number"):
        next(stream_video(str(tiny_stream_pipeline_dir), 1, 2, 0, "", "lots"))


def test_switch_and_stop_reach_the_running_stream(tiny_stream_pipeline_dir) -> None:
    stream = stream_video(str(tiny_stream_pipeline_dir), 0, 1000, 0, 1, 1.0, session="steer")
    assert "class a" in next(stream)[1]
    assert switch_class(2, "steer") == "class 2 from the next block"
    assert "class c" in next(stream)[1]
    assert stop_stream("steer") == "stopping after this block"
    rest = list(stream)
    assert rest[-1][1] == "stopped: 4 frames" and read_video(Path(rest[-1][2])).shape[0] == 4
    assert stop_stream("steer") == "no stream is running"


def test_a_video_model_gives_a_playable_clip_and_its_first_frames(tiny_video_pipeline_dir) -> None:
    from vgen.pipelines import load

    grid, amap, stats, ar, clip = generate(str(tiny_video_pipeline_dir), "nbp", **{**SETTINGS, "num_images": 2})
    frames = read_video(Path(clip))
    assert frames.shape == (3, 16, 2 * 16, 3)  # 3 frames of the 2 clips side by side
    expected = load(tiny_video_pipeline_dir)([1], num_videos=2, seed=0).videos
    assert np.array_equal(np.asarray(grid), np.concatenate([expected[0, 0], expected[1, 0]], axis=1))
    assert np.abs(frames.astype(int) - np.concatenate(list(expected), axis=2).astype(int)).mean() < 20  # codec
    assert amap is None and ar is None and "| target forward passes | 3 |" in stats


def test_the_sampler_list_follows_the_token_order_and_a_nar_model_has_no_ar_comparison(
        tiny_model, tiny_pipeline_dir, tiny_nar_factory, tmp_path) -> None:
    from vgen.pipelines import load
    from vgen.samplers import available_samplers

    raster = samplers_for(tiny_model)
    assert "ar" in raster and "sjd" in raster and "nar" not in raster
    pipe = load(tiny_pipeline_dir)
    nar = type(pipe)(tiny_nar_factory((4, 4), vocab_size=32, num_classes=3), pipe.tokenizer, pipe.info)
    assert samplers_for(str(nar.save_pretrained(tmp_path / "nar"))) == ["nar"]
    assert samplers_for(str(tmp_path / "missing")) == available_samplers()  # the Generate click says why
    with pytest.raises(InputError, match="next-neighbour order: there is no vanilla AR run of it"):
        generate(str(tmp_path / "nar"), "nar", **SETTINGS, compare=True)


def test_the_generate_tab_refuses_a_streaming_model_and_the_stream_tab_a_token_model(tiny_model,
                                                                                   tiny_stream_pipeline_dir) -> None:
    with pytest.raises(InputError, match="use the Streaming tab"):
        generate(str(tiny_stream_pipeline_dir), "ar", **SETTINGS)
    with pytest.raises(InputError, match="use the Generate tab"):
        next(stream_video(tiny_model, 0, 8, 0, 2, 1.0))
    with pytest.raises(InputError, match="frames must be in"):
        next(stream_video(str(tiny_stream_pipeline_dir), 0, 0, 0, 2, 1.0))


def test_live_app_streams_until_stop_and_other_sessions_cannot_stop_it(live_app, tiny_stream_pipeline_dir) -> None:
    job = live_app.submit(str(tiny_stream_pipeline_dir), 0, 2000, 0, 1, 1.0, api_name="/stream")
    deadline = time.time() + 60
    while time.time() < deadline and len(job.outputs()) < 2:
        time.sleep(0.1)
    assert len(job.outputs()) >= 2, "no frames arrived"
    other_visitor = gradio_client.Client(live_app.src, verbose=False)  # another browser session
    assert other_visitor.predict(api_name="/stop_stream") == "no stream is running"
    assert other_visitor.predict(3, api_name="/switch_class") == "no stream is running"
    assert not job.done()
    assert live_app.predict(api_name="/stop_stream") == "stopping after this block"
    frame, status, video = job.result(timeout=60)
    assert status.startswith("stopped: ")
    frames_done = int(status.split()[1])
    assert read_video(Path(video["video"] if isinstance(video, dict) else video)).shape[0] == frames_done > 0
    assert np.asarray(Image.open(frame)).std() > 0
