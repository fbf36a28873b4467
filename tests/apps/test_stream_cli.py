"""``vgen stream``: writes the stream block by block into a file that stays playable when the run is interrupted
or killed, writes its profile, streams a class (class models) or a prompt (text models), switches it on request at
the frames given, and gives one specific error line per bad input, before any file is opened."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from vgen.apps.cli import main
from vgen.eval.videos import read_video


def run(args, capsys):
    try:
        code = main(["stream", *args, "--no-progress"])
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_stream_writes_every_frame_and_the_profile(tiny_stream_pipeline_dir, tmp_path, capsys) -> None:
    out, profile = tmp_path / "long.mp4", tmp_path / "profile.json"
    code, stdout, _ = run(["--model", str(tiny_stream_pipeline_dir), "--class-id", "2", "--frames", "41",
                           "--out", str(out), "--profile", str(profile)], capsys)
    assert code == 0 and "wrote 41 frames" in stdout
    assert read_video(out).shape == (41, 16, 16, 3)
    report = json.loads(profile.read_text())
    assert report["frames"] == 41 and report["blocks"] == 21 and len(report["per_block_latency_s"]) == 21
    assert report["fps"] > 0 and report["resident_memory_mb"]["peak"] > 0 and not report["interrupted"]
    assert report["config"]["window_frames"] == 4  # the pipeline's default


def test_gif_output_and_a_class_switch(tiny_stream_pipeline_dir, tmp_path, capsys) -> None:
    out = tmp_path / "s.gif"
    code, _, _ = run(["--model", str(tiny_stream_pipeline_dir), "--frames", "8", "--switch", "3:1",
                      "--out", str(out), "--window-frames", "2", "--sink-frames", "0"], capsys)
    assert code == 0 and read_video(out).shape == (8, 16, 16, 3)


def test_the_length_may_be_given_as_num_frames_as_the_other_commands_spell_it(tiny_stream_pipeline_dir, tmp_path,
                                                                              capsys) -> None:
    out = tmp_path / "s.gif"
    code, _, _ = run(["--model", str(tiny_stream_pipeline_dir), "--num-frames", "6", "--out", str(out)], capsys)
    assert code == 0 and read_video(out).shape == (6, 16, 16, 3)


def test_classes_go_by_name_as_well_as_by_id(tiny_stream_pipeline_dir, tmp_path, capsys) -> None:
    out, profile = tmp_path / "s.gif", tmp_path / "p.json"
    code, printed, err = run(["--model", str(tiny_stream_pipeline_dir), "--frames", "5", "--class-id", "c",
                              "--switch", "3:a", "--out", str(out), "--profile", str(profile)], capsys)
    assert code == 0, err
    report = json.loads(profile.read_text())
    assert report["class_id"] == 2 and report["switches"] == [[3, 0]]
    assert printed.startswith("wrote 5 frames to ") and "per block of 2 frames" in printed


@pytest.mark.parametrize("args, message", [
    (["--frames", "0"], "--frames (--num-frames) must be in [1, 10000000], got 0"),
    (["--num-frames", "-3"], "--frames (--num-frames) must be in [1, 10000000], got -3"),
    (["--seed", "-1"], "seed must be an integer in [0, 2**64), got -1"),
    (["--class-id", "3"], "class id 3 is out of range"),
    (["--switch", "4:7"], "class id 7 is out of range"),
    (["--class-id", "star"], "unknown class 'star' for tiny-stream; classes: a, b, c (or ids 0..2)"),
    (["--switch", "4:star"], "unknown class 'star' for tiny-stream; classes: a, b, c"),
    (["--window-frames", "1"], "not a whole number of 2-frame blocks"),
    (["--window-frames", "0"], "smaller than a block"),
    (["--window-frames", "8"], "exceed the 8 frames the model was trained on"),
    (["--out", "/no/such/dir/x.mp4"], "directory /no/such/dir does not exist"),
    (["--out", "x.png"], "unsupported file type .png"),
    (["--steps", "0"], "steps must be an integer in [1, 1000], got 0"),
    (["--steps", "100000"], "steps must be an integer in [1, 1000], got 100000"),
    (["--model", "shapes-c2i"], "not a streaming (block-diffusion) model"),
])
def test_bad_input_gets_one_specific_line_and_exit_2(tiny_stream_pipeline_dir, tmp_path, args, message,
                                                     capsys) -> None:
    full = ["--out", str(tmp_path / "x.mp4"), *args]
    if "--model" not in args:
        full = ["--model", str(tiny_stream_pipeline_dir), *full]
    code, _, err = run(full, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vgen: error: ") and message in lines[0]
    assert not (tmp_path / "x.mp4").exists()  # refused before the file is opened



def test_a_text_stream_plays_its_prompt_then_switches_at_the_frame_given(tiny_text_stream_pipeline_dir, tmp_path,
                                                                          capsys) -> None:
    out, profile = tmp_path / "x.mp4", tmp_path / "p.json"
    code, stdout, err = run(["--model", str(tiny_text_stream_pipeline_dir), "--prompt", "a red star", "--switch",
                             "4:a blue ring", "--frames", "8", "--out", str(out), "--profile", str(profile)], capsys)
    assert code == 0, err
    assert "wrote 8 frames" in stdout and read_video(out).shape == (8, 16, 16, 3)
    report = json.loads(profile.read_text())
    assert report["prompt"] == "a red star" and report["class_id"] is None
    assert report["switches"] == [[4, "a blue ring"]] and report["config"]["switch"] == "recache"
    recache = report["recache_ms"]  # per block: only block 2 (frames 4-5) re-encoded the cache
    assert len(recache) == 4 and recache[2] > 0 and recache[:2] + recache[3:] == [0, 0, 0]


def test_a_switch_prompt_may_hold_colons_and_the_mode_is_a_flag(tiny_text_stream_pipeline_dir, tmp_path,
                                                               capsys) -> None:
    profile = tmp_path / "p.json"
    code, _, err = run(["--model", str(tiny_text_stream_pipeline_dir), "--prompt", "a red star", "--switch",
                        "2:a blue ring: moving left", "--switch-mode", "plain", "--frames", "4", "--out",
                        str(tmp_path / "x.gif"), "--profile", str(profile)], capsys)
    assert code == 0, err
    report = json.loads(profile.read_text())
    assert report["switches"] == [[2, "a blue ring: moving left"]] and report["config"]["switch"] == "plain"
    assert report["recache_ms"] == [0, 0]  # a plain switch keeps the cache as it is


def test_a_text_model_streams_its_first_example_prompt_when_given_none(tiny_text_stream_pipeline_dir, tmp_path,
                                                                     capsys) -> None:
    from vgen.apps.models_cli import pipeline_info

    profile = tmp_path / "p.json"
    code, _, err = run(["--model", str(tiny_text_stream_pipeline_dir), "--frames", "2", "--out",
                        str(tmp_path / "x.gif"), "--profile", str(profile)], capsys)
    assert code == 0, err
    assert json.loads(profile.read_text())["prompt"] == pipeline_info(tiny_text_stream_pipeline_dir).example_prompts[0]


def test_a_prompt_without_a_model_goes_to_the_text_stream_model(monkeypatch, tmp_path, capsys) -> None:
    from vgen.apps import stream_cli

    def loaded(args, streaming):
        raise stream_cli.UsageError(f"would load {args.model}")

    monkeypatch.setattr(stream_cli, "load_pipeline", loaded)
    args = ["--prompt", "a red star", "--out", str(tmp_path / "x.mp4")]
    monkeypatch.setattr(stream_cli, "available_models", lambda: ["shapes-blockdiff", "shapes-t2v-stream"])
    assert run(args, capsys)[2] == "vgen: error: would load shapes-t2v-stream\n"
    assert run(args[2:], capsys)[2] == "vgen: error: would load shapes-blockdiff\n"  # no prompt: the class model
    monkeypatch.setattr(stream_cli, "available_models", lambda: ["shapes-blockdiff"])
    code, _, err = run(args, capsys)
    assert code == 2 and err.count("\n") == 1
    assert "shapes-t2v-stream is not installed, and --prompt needs a text streaming model: pass --model" in err


SWITCH_ROWS = [  # (model, flags, message): "text" is the tiny text model, "class" the tiny class model
    ("text", ["--prompt", ""], "--prompt is empty"),
    ("text", ["--prompt", "  "], "--prompt is empty"),
    ("text", ["--switch", "4:"], "--switch 4: is empty"),
    ("text", ["--switch", "0:a blue ring"], "switch at frame 0: a switch frame must lie in 1..7"),
    ("text", ["--switch", "8:a blue ring"], "switch at frame 8: a switch frame must lie in 1..7"),
    ("text", ["--switch=-2:a blue ring"], "switch at frame -2: a switch frame must lie in 1..7"),
    ("text", ["--switch", "4:a blue ring", "--switch", "2:a red star"],
     "switch at frame 2 comes after the switch at frame 4: switch frames must increase in the order given"),
    ("text", ["--switch", "4:a blue ring", "--switch", "4:a red star"], "switch at frame 4 comes after"),
    ("text", ["--switch", "4:2"], "--switch 4:2: tiny-text-stream is a text streaming model: switch to a prompt, "
                                  "not a class id"),
    ("text", ["--class-id", "1"], "is a text streaming model: it streams what --prompt says, not --class-id"),
    ("text", ["--switch", "four:a blue ring"], "expected FRAME:VALUE"),
    ("text", ["--switch", "a blue ring"], "expected FRAME:VALUE"),
    ("text", ["--switch-mode", "cut"], "argument --switch-mode: invalid choice: 'cut'"),
    ("class", ["--prompt", "a red star"], "tiny-stream is a class streaming model: it takes --class-id, not "
                                          "--prompt"),
    ("class", ["--switch", "4:a blue ring"], "unknown class 'a blue ring' for tiny-stream; classes: a, b, c"),
    ("class", ["--switch", "5:a", "--switch", "3:b"], "switch at frame 3 comes after the switch at frame 5"),
]


@pytest.mark.parametrize("kind, args, message", SWITCH_ROWS)
def test_a_bad_prompt_or_switch_gets_one_line_and_exit_2_before_the_file_is_opened(
        tiny_text_stream_pipeline_dir, tiny_stream_pipeline_dir, tmp_path, kind, args, message, capsys) -> None:
    folder = tiny_text_stream_pipeline_dir if kind == "text" else tiny_stream_pipeline_dir
    first = [] if kind == "class" or "--prompt" in args or "--class-id" in args else ["--prompt", "a red star"]
    code, _, err = run(["--model", str(folder), "--frames", "8", "--out", str(tmp_path / "x.mp4"), *first, *args],
                       capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("vgen: error: ") and message in lines[0]
    assert not (tmp_path / "x.mp4").exists()


def test_ctrl_c_during_a_switchs_re_cache_leaves_whole_blocks_only(tiny_text_stream_pipeline_dir, tmp_path,
                                                                   capsys, monkeypatch) -> None:
    """The stop request arrives while the cache is re-encoded for the switch at frame 4: the switch's block is
    finished and written, then the stream ends; the file holds every frame done and no part of a block."""
    from vgen.models.blockdiff import BlockDiffusionTransformer

    recache = BlockDiffusionTransformer.clean_context

    def interrupted(self, *args, **kwargs):
        signal.raise_signal(signal.SIGINT)  # what Ctrl-C does: graceful_stop takes it as a request
        return recache(self, *args, **kwargs)

    monkeypatch.setattr(BlockDiffusionTransformer, "clean_context", interrupted)
    out = tmp_path / "x.mp4"
    code, _, err = run(["--model", str(tiny_text_stream_pipeline_dir), "--prompt", "a red star", "--switch",
                        "4:a blue ring", "--frames", "40", "--out", str(out)], capsys)
    assert code == 130 and "interrupted: wrote 6 frames" in err
    assert read_video(out).shape == (6, 16, 16, 3)

def _start_long_stream(pipeline_dir, out):
    proc = subprocess.Popen([sys.executable, "-m", "vgen", "stream", "--model", str(pipeline_dir), "--frames",
                             "100000", "--out", str(out), "--fps", "4", "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and (not out.exists() or out.stat().st_size < 4000):
        time.sleep(0.2)
    assert out.exists() and out.stat().st_size >= 4000, "the stream wrote nothing"
    return proc


@pytest.mark.slow
def test_ctrl_c_leaves_a_playable_file_with_the_frames_done(tiny_stream_pipeline_dir, tmp_path) -> None:
    out = tmp_path / "interrupted.mp4"
    proc = _start_long_stream(tiny_stream_pipeline_dir, out)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "interrupted: wrote" in err
    written = int(err.split("interrupted: wrote ")[1].split()[0])
    assert read_video(out).shape[0] == written > 0


@pytest.mark.slow
def test_a_killed_stream_leaves_a_playable_file(tiny_stream_pipeline_dir, tmp_path) -> None:
    out = tmp_path / "killed.mp4"
    proc = _start_long_stream(tiny_stream_pipeline_dir, out)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    time.sleep(1.0)  # ffmpeg, orphaned, finishes the fragment it holds
    assert read_video(out).shape[0] > 0


def test_package_writes_a_streaming_pipeline_from_a_block_diffusion_export(tiny_blockdiff, tmp_path, capsys) -> None:
    import vgen
    from vgen.hub import save_pretrained
    from vgen.pipelines import StreamPipeline

    save_pretrained(tiny_blockdiff, tmp_path / "export")
    code = main(["train", "package", "--gpt", str(tmp_path / "export"), "--out", str(tmp_path / "pipe"), "--name",
                 "tiny-stream", "--stream-defaults", '{"steps": 3, "sink_frames": 0, "window_frames": 6}'])
    assert code == 0
    pipe = vgen.load(tmp_path / "pipe")
    assert isinstance(pipe, StreamPipeline) and pipe.stream_config().steps == 3
    bad = main(["train", "package", "--gpt", str(tmp_path / "export"), "--out", str(tmp_path / "p2"),
                "--stream-defaults", '{"window_frames": 8}'])
    assert bad == 2 and "exceed the 8 frames" in capsys.readouterr().err
    token = main(["train", "package", "--gpt", str(tmp_path / "export"), "--out", str(tmp_path / "p3"),
                  "--temperature", "0.6"])
    assert token == 2 and "takes its settings as --stream-defaults" in capsys.readouterr().err
    assert not (tmp_path / "p3").exists()


def test_package_puts_a_latent_models_kl_tokenizer_beside_it(tiny_blockdiff_factory, tmp_path, capsys) -> None:
    import vgen
    from vgen.hub import save_pretrained
    from vgen.models.blockdiff import BlockDiffConfig
    from vgen.tokenizers.kl import KLConfig, KLTokenizer
    from vgen.tokenizers.vq import VQConfig, VQModel

    latent = BlockDiffConfig(frame_size=8, channels=2, patch_size=2, frames_per_block=2, train_frames=8, dim=48,
                             n_layer=2, n_head=4, num_classes=3)
    save_pretrained(tiny_blockdiff_factory(latent), tmp_path / "export")
    save_pretrained(KLTokenizer(KLConfig(block_out_channels=(8, 8), norm_num_groups=4, image_size=16,
                                         latent_channels=2)), tmp_path / "kl")
    args = ["train", "package", "--gpt", str(tmp_path / "export"), "--name", "latent",
            "--stream-defaults", '{"sink_frames": 2, "window_frames": 4}']
    assert main([*args, "--vq", str(tmp_path / "kl"), "--out", str(tmp_path / "pipe")]) == 0
    pipe = vgen.load(tmp_path / "pipe")
    assert pipe.info.image_size == 16 and pipe(0, num_frames=2, seed=0).videos.shape == (1, 2, 16, 16, 3)
    save_pretrained(VQModel(VQConfig(codebook_size=8, codebook_embed_dim=4, ch=8, ch_mult=(1, 2), z_channels=4,
                                     num_res_blocks=1, norm_groups=4)), tmp_path / "vq")
    assert main([*args, "--vq", str(tmp_path / "vq"), "--out", str(tmp_path / "p2")]) == 2
    assert "holds a VQModel; a block-diffusion pipeline takes the KL tokenizer" in capsys.readouterr().err
    assert main([*args, "--out", str(tmp_path / "p3")]) == 2  # latent frames without their decoder
    assert "denoises 2-channel latent frames: it needs its KL tokenizer" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["sample"],
                                     ["bench", "--num-samples", "2", "--num-real", "2", "--out", "bench-out"]])
def test_image_commands_refuse_a_streaming_model_by_name(tiny_stream_pipeline_dir, tmp_path, command,
                                                         capsys) -> None:
    command = [str(tmp_path / c) if c == "bench-out" else c for c in command]
    code = main([*command, "--model", str(tiny_stream_pipeline_dir)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "streaming video model" in err[0]


def test_quality_of_a_streaming_model_judges_its_clips_like_the_token_video_models(tiny_stream_pipeline_dir,
                                                                                   tmp_path, capsys) -> None:
    report, grid = tmp_path / "q.json", tmp_path / "grid.png"
    code = main(["quality", "--model", str(tiny_stream_pipeline_dir), "--num-images", "5", "--batch-size", "2",
                 "--num-frames", "6", "--cfg-scale", "2", "--json", str(report), "--grid", str(grid)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    figures = json.loads(report.read_text())
    assert figures["num_clips"] == 5 and figures["num_frames"] == 6 and figures["sampling"]["cfg_scale"] == 2.0
    assert figures["sampling"]["window_frames"] == 4  # the pipeline's own defaults
    assert 0.0 <= figures["class_accuracy"] <= 1.0 and set(figures["per_class"]) == {"a", "b", "c"}
    lines = printed.out.splitlines()
    assert lines[0].startswith("tiny-stream: 5 clips, seed 0 (steps 2, ")
    assert "real_clips: class_accuracy" in printed.out
    assert lines[-2].split() == ["class", "a", "b", "c"] and lines[-1].split()[0] == "accuracy" and len(lines) <= 10
    assert figures["num_real_clips"] == 5 and figures["frame_change"] > 0
    from PIL import Image

    assert Image.open(grid).size == (6 * 16, 3 * 16)  # a row of 6 frames per class


def test_quality_of_a_streaming_model_takes_its_schedule_flags(tiny_stream_pipeline_dir, tmp_path, capsys) -> None:
    report = tmp_path / "q.json"
    code = main(["quality", "--model", str(tiny_stream_pipeline_dir), "--num-images", "3", "--batch-size", "3",
                 "--num-frames", "4", "--steps", "1", "--first-steps", "3", "--json", str(report), "--no-progress"])
    assert code == 0, capsys.readouterr().err
    sampling = json.loads(report.read_text())["sampling"]
    assert (sampling["steps"], sampling["first_steps"], sampling["window_frames"]) == (1, 3, 4)


def test_quality_of_a_token_model_refuses_stream_flags(tiny_pipeline_dir, capsys) -> None:
    assert main(["quality", "--model", str(tiny_pipeline_dir), "--num-images", "1", "--steps", "2",
                 "--sink-frames", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--steps, --sink-frames set a stream's schedule or context; tiny samples tokens" in err[0]


@pytest.mark.parametrize("args, message", [(["--num-frames", "1"], "--num-frames must be >= 2"),
                                           (["--num-frames", "0"], "--num-frames must be >= 2"),
                                           (["--cfg-scale", "-1"], "cfg_scale must be in [0, 100.0]"),
                                           (["--top-k", "5"], "--top-k sample tokens"),
                                           (["--temperature", "1", "--cfg-interval", "3"],
                                            "--cfg-interval, --temperature sample tokens"),
                                           (["--sampler", "ar"], "--sampler and its options are for token models"),
                                           (["--window", "4"], "--sampler and its options are for token models"),
                                           (["--steps", "0"], "steps must be an integer in [1, 1000], got 0")])
def test_quality_of_a_streaming_model_refuses_bad_settings(tiny_stream_pipeline_dir, args, message, capsys) -> None:
    assert main(["quality", "--model", str(tiny_stream_pipeline_dir), "--num-images", "1", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


@pytest.mark.parametrize("flag", ["--num-frames", "--window-context"])
def test_quality_of_an_image_model_refuses_a_clip_length(tiny_pipeline_dir, capsys, flag) -> None:
    assert main(["quality", "--model", str(tiny_pipeline_dir), "--num-images", "1", flag, "4"]) == 2
    assert f"{flag} is for video models; tiny generates images" in capsys.readouterr().err


def test_quality_of_a_streaming_model_refuses_a_window_context(tiny_stream_pipeline_dir, capsys) -> None:
    assert main(["quality", "--model", str(tiny_stream_pipeline_dir), "--num-images", "1", "--window-context",
                 "2"]) == 2
    assert "--window-context is for video token models" in capsys.readouterr().err


def test_the_default_output_names_the_model_and_an_existing_one_is_refused(tiny_stream_pipeline_dir, tmp_path,
                                                                          capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, stdout, _ = run(["--model", str(tiny_stream_pipeline_dir), "--frames", "2"], capsys)
    assert code == 0 and "to tiny-stream_stream.mp4" in stdout and (tmp_path / "tiny-stream_stream.mp4").is_file()
    code, _, err = run(["--model", str(tiny_stream_pipeline_dir), "--frames", "2"], capsys)
    assert code == 2 and err == ("vgen: error: tiny-stream_stream.mp4 exists; pass --overwrite to replace it, or "
                                 "name another file\n")
    assert run(["--model", str(tiny_stream_pipeline_dir), "--frames", "2", "--overwrite"], capsys)[0] == 0
