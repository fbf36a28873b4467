"""Video pipelines on a tiny randomly initialised NBP model saved as a folder: loading picks VideoPipeline, clips
are the tokenizer's per-frame decoding of the sampled tokens, one forward pass per frame block, seeded; and
``vgen sample`` / ``vgen train package`` write and assemble them (mp4, GIF, frame-grid PNG), with one error line
per bad input."""

from __future__ import annotations

import dataclasses
import json
from unittest import mock

import numpy as np
import pytest
import torch
from PIL import Image

from vgen.apps.cli import main
from vgen.data.clips import ClipsConfig, cached_clips
from vgen.eval import quality as quality_module
from vgen.eval.videos import read_video
from vgen.images import tensor_to_pil
from vgen.models.nar import NARConfig, NARTransformer
from vgen.models.nbp import NBPConfig, NBPTransformer
from vgen.pipelines import PipelineInfo, VideoPipeline, load, tile_clips
from vgen.video_io import write_video
from vgen.visualize import LEGEND_HEIGHT


@pytest.fixture
def video_dir(tiny_video_pipeline_dir):
    return tiny_video_pipeline_dir


def test_load_gives_a_video_pipeline_whose_clips_decode_the_tokens_frame_by_frame(video_dir) -> None:
    pipe = load(video_dir)
    assert isinstance(pipe, VideoPipeline) and pipe.num_frames == 3
    out = pipe([1, 2], seed=3)
    assert out.videos.shape == (2, 3, 16, 16, 3) and out.videos.dtype == np.uint8
    assert out.stats.sampler == "nbp" and out.stats.forward_passes == 3 and out.tokens.shape == (2, 48)
    for b in range(2):
        for t in range(3):
            frame = pipe.tokenizer.decode_code(out.tokens[b:b + 1, 16 * t:16 * (t + 1)], (4, 4))
            np.testing.assert_array_equal(out.videos[b, t], np.asarray(tensor_to_pil(frame)[0]))
    assert np.array_equal(pipe([1, 2], seed=3).videos, out.videos)
    assert not np.array_equal(pipe([1, 2], seed=4).videos, out.videos)
    assert pipe(0, num_videos=3).class_ids == [0, 0, 0]


def test_a_video_nar_backbone_loads_as_a_video_pipeline_and_takes_t_plus_h_plus_w_minus_2_passes(
        video_dir, tmp_path, capsys) -> None:
    torch.manual_seed(0)
    nar = NARTransformer(NARConfig(grid=(3, 4, 4), vocab_size=32, dim=32, n_layer=1, n_head=2, multiple_of=16,
                                   num_classes=3))
    folder = VideoPipeline(nar, load(video_dir).tokenizer, load(video_dir).info).save_pretrained(tmp_path / "nar")
    pipe = load(folder)
    assert isinstance(pipe, VideoPipeline) and isinstance(pipe.model, NARTransformer)
    out = pipe([0, 2], seed=1)
    assert out.stats.sampler == "nar" and out.stats.forward_passes == 3 + 4 + 4 - 2
    assert out.videos.shape == (2, 3, 16, 16, 3) and out.tokens.shape == (2, 48)
    code, stdout, err = run(["sample", "--model", str(folder), "--out", str(tmp_path / "c.gif")], capsys)
    assert code == 0, err
    assert "9 forward passes per clip where next-token AR takes 48" in stdout


def test_given_first_frames_are_kept_as_tokens_and_continued(video_dir) -> None:
    """``context``: the frames are tokenised frame by frame, kept as the clip's first tokens (so the clip starts with
    their reconstruction) and continued by the sampler's draws; one set of frames serves every clip."""
    pipe = load(video_dir)
    frames = np.random.default_rng(0).integers(0, 256, (2, 1, 16, 16, 3), dtype=np.uint8)
    given = pipe.context_tokens(frames)
    _, codes, _ = pipe.tokenizer.encode(torch.from_numpy(frames[:, 0]).permute(0, 3, 1, 2).float() / 127.5 - 1)
    assert torch.equal(given, codes.reshape(2, 16).long())
    out = pipe([1, 2], seed=3, context=frames)
    assert torch.equal(out.tokens[:, :16], given) and out.stats.details["given_tokens"] == 16
    np.testing.assert_array_equal(out.videos[:, 0], np.stack(pipe.decode(given.repeat(1, 3)))[:, 0])
    assert not torch.equal(out.tokens[:, 16:], pipe([1, 2], seed=3).tokens[:, 16:])  # the draws follow the frames
    shared = pipe([0, 1, 2], seed=3, context=frames[0, :1, None][0])  # [k, H, W, 3]: the same frame for all
    assert torch.equal(shared.tokens[:, :16], given[:1].expand(3, -1))
    assert np.array_equal(pipe([1, 2], seed=3, context=frames).videos, out.videos)


@pytest.mark.parametrize(("num_frames", "window_context", "windows", "passes"), [
    (7, None, 3, 3 + 2 + 2), (6, None, 3, 3 + 2 + 2), (5, 2, 3, 3 + 1 + 1), (2, None, 1, 3)])
def test_clips_longer_than_the_window_continue_its_last_frames_window_by_window(video_dir, num_frames, window_context,
                                                                                windows, passes) -> None:
    """A 3-frame model draws a longer clip window by window: each later window is the sampler's continuation of the
    last ``window_context`` frames (default 1, half the window) from one stream of draws, and adds the rest; the
    first window is the plain call's clip; the stats add up the windows' passes and drawn tokens."""
    pipe = load(video_dir)
    keep = window_context or 1
    out = pipe([1, 2], seed=3, num_frames=num_frames, window_context=window_context)
    assert out.videos.shape == (2, num_frames, 16, 16, 3) and out.tokens.shape == (2, 16 * num_frames)
    generator = torch.Generator().manual_seed(3)
    first, _, _ = pipe.sample_tokens([1, 2], generator=generator)
    expected = first.tokens
    for _ in range(windows - 1):
        window, _, _ = pipe.sample_tokens([1, 2], prefix=expected[:, -16 * keep:], generator=generator)
        assert torch.equal(window.tokens[:, :16 * keep], expected[:, -16 * keep:])
        expected = torch.cat([expected, window.tokens[:, 16 * keep:]], dim=1)
    assert torch.equal(out.tokens, expected[:, :16 * num_frames])
    shown = 16 * min(3, num_frames)
    assert torch.equal(out.tokens[:, :shown], pipe([1, 2], seed=3).tokens[:, :shown])
    np.testing.assert_array_equal(out.videos, np.stack(pipe.decode(out.tokens)))
    assert out.stats.forward_passes == passes
    assert out.stats.accept_step.shape == out.tokens.shape  # the passes of the frames kept
    drawn = 3 + (windows - 1) * (3 - keep)  # one frame a pass: the frames cut off took the last passes
    assert int(out.stats.accept_step.amax()) == passes - (drawn - num_frames)
    assert out.stats.tokens == 2 * 16 * drawn
    assert out.stats.details.get("windows", 1) == windows


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"window_context": 0}, r"window_context must be a whole number of frames between 1 and 2 .*got 0"),
    ({"window_context": 3}, "got 3"), ({"window_context": True}, "got True"), ({"window_context": 1.5}, "got 1.5"),
    ({"num_frames": 0}, "num_frames"),
    ({"num_frames": 4, "sampler": "ar"}, "tiny-video draws 3 frames a window; a 4-frame clip continues its last "
                                         r"frames window by window, which the 'ar' sampler cannot do \(samplers "
                                         r"that can: \['nbp'\]\)"),
])
def test_a_clip_length_that_cannot_be_drawn_is_refused(video_dir, kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        load(video_dir)([0, 1], **kwargs)


@pytest.mark.parametrize(("context", "kwargs", "message"), [
    (np.zeros((3, 16, 16, 3), np.uint8), {}, "between 1 and 2 frames of the model's 3, got 3"),
    (np.zeros((1, 8, 8, 3), np.uint8), {}, r"uint8 frames \[k, 16, 16, 3\]"),
    (np.zeros((1, 16, 16, 3), np.float32), {}, "got float32"),
    (np.zeros((3, 1, 16, 16, 3), np.uint8), {}, "frames for 3 clips, but 2 clips are asked for"),
    (np.zeros((1, 16, 16, 3), np.uint8), {"sampler": "ar"}, "the 'ar' sampler cannot continue given tokens"),
])
def test_context_that_cannot_be_continued_is_refused(video_dir, context, kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        load(video_dir)([0, 1], context=context, **kwargs)


def test_parts_that_do_not_fit_are_refused(video_dir) -> None:
    pipe = load(video_dir)
    model, vq, info = pipe.model, pipe.tokenizer, pipe.info
    with pytest.raises(ValueError, match="frame size 32 does not match the model's 4x4 tokens per frame"):
        VideoPipeline(model, vq, PipelineInfo(name="x", image_size=32))
    image_model = NBPTransformer(NBPConfig(grid=(3, 4), block="row", vocab_size=32, dim=32, n_layer=1, n_head=2))
    with pytest.raises(ValueError, match=r"needs a backbone over \(frames, rows, columns\) tokens, got grid \(3, 4\)"):
        VideoPipeline(image_model, vq, info)


def test_tile_clips_puts_clips_side_by_side_per_frame() -> None:
    clips = np.arange(2 * 3 * 2 * 2 * 3, dtype=np.uint8).reshape(2, 3, 2, 2, 3)
    tiled = tile_clips(clips, 2)
    assert tiled.shape == (3, 2, 4, 3)
    np.testing.assert_array_equal(tiled[:, :, :2], clips[0])
    np.testing.assert_array_equal(tiled[:, :, 2:], clips[1])


def run(args, capsys):
    code = main([*args, "--no-progress"] if args[0] == "sample" else args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("suffix", [".mp4", ".gif"])
def test_vgen_sample_writes_a_clip_that_reads_back(video_dir, tmp_path, capsys, suffix) -> None:
    out, stats = tmp_path / f"clip{suffix}", tmp_path / "s.json"
    code, stdout, err = run(["sample", "--model", str(video_dir), "--class-id", "2", "--out", str(out),
                             "--stats", str(stats)], capsys)
    assert code == 0, err
    assert "wrote 1 clip of 3 frames" in stdout
    frames = read_video(out)
    assert frames.shape == (3, 16, 16, 3)
    expected = load(video_dir)(2, seed=0).videos[0]
    assert np.abs(frames.astype(int) - expected.astype(int)).mean() < 20  # lossy codecs, same clip
    s = json.loads(stats.read_text())
    assert s["forward_passes"] == 3 and s["tokens"] == 48 and s["frames_per_second"] > 0
    assert s["next_token_forward_passes"] == 48 and "3 forward passes per clip where next-token AR takes 48" in stdout


def test_vgen_sample_draws_clips_longer_than_the_window(video_dir, tmp_path, capsys) -> None:
    out, stats, amap = tmp_path / "long.gif", tmp_path / "s.json", tmp_path / "map.png"
    code, stdout, err = run(["sample", "--model", str(video_dir), "--class-id", "2", "--num-frames", "5",
                             "--window-context", "2", "--out", str(out), "--stats", str(stats),
                             "--acceptance-map", str(amap)], capsys)
    assert code == 0, err
    assert "wrote 1 clip of 5 frames" in stdout and "5 forward passes per clip where next-token AR takes 80" in stdout
    assert read_video(out).shape == (5, 16, 16, 3)
    s = json.loads(stats.read_text())
    assert s["details"]["windows"] == 3 and s["tokens"] == 80
    assert Image.open(amap).width == 5 * 64 + 4 * 4  # five frames of maps


def test_vgen_sample_png_is_the_frame_grid_of_the_tiled_clips(video_dir, tmp_path, capsys) -> None:
    out = tmp_path / "grid.png"
    assert run(["sample", "--model", str(video_dir), "--num-images", "2", "--out", str(out)], capsys)[0] == 0
    grid = np.asarray(Image.open(out).convert("RGB"))
    videos = load(video_dir)([0, 1], seed=0).videos
    assert grid.shape == (2 * 16, 2 * 32, 3)  # 3 frames of 16 x 32 (two clips side by side) -> 2 x 2 grid cells
    np.testing.assert_array_equal(grid[:16, 32:64], tile_clips(videos, 2)[1])


def test_a_speculative_video_ar_run_draws_its_acceptance_map(tiny_video_ar_pipeline_dir, tmp_path, capsys) -> None:
    out, stats, amap = tmp_path / "c.gif", tmp_path / "s.json", tmp_path / "map.png"
    code, stdout, err = run(["sample", "--model", str(tiny_video_ar_pipeline_dir), "--sampler", "mcsjd",
                             "--num-images", "2", "--out", str(out), "--stats", str(stats), "--acceptance-map",
                             str(amap)], capsys)
    assert code == 0, err
    s = json.loads(stats.read_text())
    assert s["sampler"] == "mcsjd" and s["tokens"] == 2 * 48 and s["next_token_forward_passes"] == 48
    assert s["passes_per_image"] < 48 and s["batches"] == 2  # a speculative sampler on a CPU: one clip at a time
    assert "forward passes per clip where next-token AR takes 48 (" in stdout and "in 2 batches of 1" in stdout
    assert Image.open(amap).size == (3 * 64 + 2 * 4, 2 * (2 * 64 + 2 * 4) - 2 * 4 + LEGEND_HEIGHT)  # 3 frames, 2 clips


@pytest.mark.parametrize("args, message", [
    (["--out", "clip.jpg"], "tiny-video generates videos; write them to one of .mp4, .gif, .png, not .jpg"),
    (["--out", "clip.avi"], "unsupported file type .avi"),
    (["--class-id", "5"], "class id 5 is out of range"),
    (["--context", "missing.gif"], "--context missing.gif is not a file"),
    (["--context", "GIVEN", "--context-frames", "4"], "--context-frames must be between 1 and the 3 frames of"),
    (["--context", "GIVEN", "--context-frames", "3"], "context must give between 1 and 2 frames of the model's 3"),
])
def test_vgen_sample_bad_video_input_is_one_error_line(video_dir, tmp_path, capsys, args, message) -> None:
    write_video(np.arange(3, dtype=np.uint8)[:, None, None, None].repeat(16, 1).repeat(16, 2).repeat(3, 3) * 100,
                tmp_path / "given.gif", fps=8)  # 3 distinct frames (a GIF merges equal ones)
    args = [str(tmp_path / "given.gif") if a == "GIVEN" else a for a in args]
    args = [a if not a.endswith((".jpg", ".avi", ".png")) else str(tmp_path / a) for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "c.gif")]
    code, _, err = run(["sample", "--model", str(video_dir), *args], capsys)
    assert code == 2 and err.startswith("vgen: error: ") and message in err and err.count("\n") == 1


def test_vgen_sample_continues_the_first_frames_of_a_given_clip(video_dir, tmp_path, capsys) -> None:
    first = load(video_dir)(1, seed=5).videos[0]
    write_video(first, tmp_path / "given.gif", fps=8)
    given = read_video(tmp_path / "given.gif")  # what the command reads, whatever the GIF's palette did
    out = tmp_path / "c.png"
    code, _, err = run(["sample", "--model", str(video_dir), "--num-images", "2", "--context",
                        str(tmp_path / "given.gif"), "--context-frames", "2", "--out", str(out), "--stats",
                        str(tmp_path / "s.json")], capsys)
    assert code == 0, err
    expected = load(video_dir)([0, 1], seed=0, context=given[:2]).videos
    grid = np.asarray(Image.open(out).convert("RGB"))
    np.testing.assert_array_equal(grid[:16, :32], tile_clips(expected, 2)[0])
    assert json.loads((tmp_path / "s.json").read_text())["details"]["given_tokens"] == 2 * 16


def test_an_image_model_refuses_a_video_output(tiny_pipeline_dir, tmp_path, capsys) -> None:
    code, _, err = run(["sample", "--model", str(tiny_pipeline_dir), "--out", str(tmp_path / "x.mp4")], capsys)
    assert code == 2 and "tiny generates images" in err and not (tmp_path / "x.mp4").exists()


@pytest.mark.parametrize(("flag", "value"), [("--context", "GIVEN"), ("--num-frames", "4"),
                                           ("--window-context", "1")])
def test_an_image_model_refuses_video_settings(tiny_pipeline_dir, video_dir, tmp_path, capsys, flag, value) -> None:
    if value == "GIVEN":
        value = str(tmp_path / "given.gif")
        write_video(load(video_dir)([0], seed=0).videos[0], value)
    code, _, err = run(["sample", "--model", str(tiny_pipeline_dir), flag, value, "--out", str(tmp_path / "x.png")],
                       capsys)
    assert code == 2 and f"{flag} is for video models; tiny generates images" in err
    assert not (tmp_path / "x.png").exists()


def test_vgen_quality_judges_every_frame_and_the_motion_of_sampled_clips(video_dir, tmp_path, capsys) -> None:
    grid, figures_path = tmp_path / "by_class.png", tmp_path / "q.json"
    code, stdout, err = run(["quality", "--model", str(video_dir), "--num-images", "4", "--batch-size", "4",
                             "--grid", str(grid), "--json", str(figures_path)], capsys)
    assert code == 0, err
    figures = json.loads(figures_path.read_text())
    assert figures["num_clips"] == 4 and figures["tokens_measured"] == 4 * 48 and figures["num_real_clips"] == 4
    assert 0 <= figures["class_accuracy"] <= 1 and 0 <= figures["share_moving"] <= 1
    assert figures["collapsed"] in (0, 0.25, 0.5, 0.75, 1) and 0 <= figures["texture_frames"] <= 1
    assert "collapsed" in stdout
    assert set(figures["real_clips"]) == {"class_accuracy", "frame_accuracy", "identity_kept", "num_clips"}
    videos = load(video_dir)([0, 1, 2, 0], seed=0).videos  # classes in turn, one batch, --seed 0
    expected = np.concatenate([np.concatenate(list(videos[c]), axis=1) for c in range(3)], axis=0)
    np.testing.assert_array_equal(np.asarray(Image.open(grid)), expected)  # a row of frames per class


def test_vgen_quality_judges_clips_longer_than_the_window(video_dir, tmp_path, capsys) -> None:
    figures_path = tmp_path / "q.json"
    code, _, err = run(["quality", "--model", str(video_dir), "--num-images", "3", "--num-frames", "5",
                        "--json", str(figures_path), "--no-progress"], capsys)
    assert code == 0, err
    figures = json.loads(figures_path.read_text())
    assert figures["num_clips"] == 3 and figures["num_frames"] == 5
    assert figures["tokens_measured"] == 3 * 48  # the token statistics of the first window


def test_package_assembles_a_video_pipeline(video_dir, tmp_path, capsys) -> None:
    out = tmp_path / "packaged"
    code, printed, err = run(["train", "package", "--gpt", str(video_dir / "gpt"), "--vq", str(video_dir / "vq"),
                              "--out", str(out), "--name", "packaged-video"], capsys)
    assert code == 0, err
    pipe = load(out)
    assert isinstance(pipe, VideoPipeline) and pipe.info.image_size == 16
    assert np.array_equal(pipe(1, seed=0).videos, load(video_dir)(1, seed=0).videos)


def test_package_records_the_clips_of_its_data_folder_and_quality_renders_real_clips_like_them(
        video_dir, tmp_path, capsys) -> None:
    """--data-dir of a clips folder: the pipeline records its ClipsConfig, and vgen quality's real clips follow it
    (a pipeline packaged without one falls back to the default motion at its frame size)."""
    clips = ClipsConfig(num_frames=3, frame_size=16, min_scale=0.3, max_scale=0.4, supersample=1)
    cached_clips(tmp_path / "clips", "val", 1, clips)
    out = tmp_path / "packaged"
    code, _, err = run(["train", "package", "--gpt", str(video_dir / "gpt"), "--vq", str(video_dir / "vq"),
                        "--data-dir", str(tmp_path / "clips"), "--out", str(out), "--name", "packaged-video"], capsys)
    assert code == 0, err
    assert load(out).info.data == dataclasses.asdict(clips)
    seen = []
    real = quality_module.render_clips
    with mock.patch.object(quality_module, "render_clips",
                           lambda seed, start, n, cfg: seen.append(cfg) or real(seed, start, n, cfg)):
        code, _, err = run(["quality", "--model", str(out), "--num-images", "2", "--batch-size", "2"], capsys)
    assert code == 0, err
    assert seen == [clips]
