"""The ``vgen`` command: end to end on a tiny pipeline folder, and one specific error line per bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from PIL import Image

from vgen.apps.cli import build_parser, main
from vgen.images import MARGIN
from vgen.visualize import LEGEND_HEIGHT


def run(args, capsys):
    code = main([*args, "--no-progress"] if args and args[0] == "sample" else args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_sample_writes_grid_and_stats(tiny_pipeline_dir, tmp_path, capsys):
    out, stats = tmp_path / "grid.png", tmp_path / "stats.json"
    code, stdout, _ = run(["sample", "--model", str(tiny_pipeline_dir), "--class-id", "1", "--class-id", "2",
                           "--num-images", "4", "--out", str(out), "--stats", str(stats), "--cols", "2"], capsys)
    assert code == 0 and "wrote 4 images to " in stdout
    assert ": 16 forward passes per image, one per token, in 1 batch of 4; " in stdout
    assert "next-token AR takes" not in stdout
    assert Image.open(out).size == (32, 32)  # 2 x 2 grid of 16 px images
    s = json.loads(stats.read_text())
    assert s["sampler"] == "ar" and s["forward_passes"] == 16 and s["tokens"] == 4 * 16
    assert s["next_token_forward_passes"] == 16
    assert s["wall_time_s"] > 0 and s["class_ids"] == [1, 2, 1, 2]


def test_same_seed_same_grid_other_seed_differs(tiny_pipeline_dir, tmp_path, capsys):
    paths = [tmp_path / f"{i}.png" for i in range(3)]
    for p, seed in zip(paths, [5, 5, 6]):
        assert run(["sample", "--model", str(tiny_pipeline_dir), "--seed", str(seed), "--out", str(p)], capsys)[0] == 0
    a, b, c = (Image.open(p).tobytes() for p in paths)
    assert a == b and a != c


@pytest.mark.parametrize("args, message", [
    (["--model", "no-such-model"], "unknown model 'no-such-model'"),
    (["--sampler", "nope"], "unknown sampler 'nope'"),
    (["--class-id", "3"], "class id 3 is out of range"),
    (["--class-id", "-1"], "class id -1 is out of range"),
    (["--top-k", "-1"], "top_k"),
    (["--top-p", "0"], "top_p"),
    (["--top-p", "1.5"], "top_p"),
    (["--temperature", "-0.5"], "temperature"),
    (["--cfg-scale", "-1"], "cfg_scale"),
    (["--num-images", "0"], "num_images must be an integer in [1, 10000000]"),
    (["--class-id", "star"], "unknown class 'star' for tiny; classes: a, b, c (or ids 0..2)"),
    (["--cfg-scale", "inf"], "cfg_scale must be a finite number in [0, 100.0]"),
    (["--temperature", "nan"], "temperature must be a finite number in [0, 100] (0 = greedy), got nan"),
    (["--seed", "-1"], "seed must be an integer in [0, 2**64), got -1"),
    (["--out", "/no/such/dir/x.png"], "directory /no/such/dir does not exist"),
    (["--out", "grid.txt"], "unsupported file type .txt"),
    (["--dtype", "int8"], "unknown dtype"),
    (["--sampler", "sjd", "--window", "-1"], "window must be an integer in [0, 65536]"),
    (["--sampler", "lantern", "--lantern-k", "-1"], "lantern_k must be an integer in [0, 262144]"),
    (["--sampler", "lantern", "--lantern-delta", "1.5"], "total-variation budget in [0, 1]"),
    (["--sampler", "sjd", "--drafter", "head"], "needs a draft head, and this model ships none"),
    (["--sampler", "sjd", "--accept", "nope"], "unknown acceptance rule 'nope'"),
    (["--sampler", "ar", "--window", "4"], "unknown sampler 'ar' field(s) ['window']"),
    (["--sampler", "gsd", "--draft-coupling", "x"], "draft_coupling must be one of"),
    (["--acceptance-map", "map.txt"], "unsupported file type .txt"),
    (["--fps", "0"], "--fps must be >= 1, got 0"),
])
def test_bad_input_gets_one_specific_line_and_exit_2(tiny_pipeline_dir, args, message, capsys):
    full = ["sample", "--model", str(tiny_pipeline_dir), *args] if "--model" not in args else ["sample", *args]
    code, _, err = run(full, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vgen: error: ") and message in lines[0]
    assert "Traceback" not in err


def test_unwritable_output_fails_before_any_work(tiny_pipeline_dir, tmp_path, capsys, monkeypatch):
    calls = []
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # CI runs as root, who may write anywhere
    monkeypatch.setattr("vgen.pipelines.load", lambda *a, **k: calls.append(a))
    code, _, err = run(["sample", "--model", str(tiny_pipeline_dir), "--out", str(tmp_path / "x.png")], capsys)
    assert code == 2 and "permission denied" in err
    assert calls == []  # nothing was loaded or generated


def test_output_path_that_is_a_directory_is_refused(tiny_pipeline_dir, tmp_path, capsys):
    d = tmp_path / "d.png"
    d.mkdir()
    code, _, err = run(["sample", "--model", str(tiny_pipeline_dir), "--out", str(d)], capsys)
    assert code == 2 and "is a directory" in err


def test_missing_corrupt_and_mismatched_checkpoints(tiny_pipeline_dir, tmp_path, capsys):
    missing = ["sample", "--gpt-ckpt", str(tmp_path / "gpt.pt"), "--vq-ckpt", str(tmp_path / "vq.pt")]
    code, _, err = run(missing, capsys)
    assert code == 2 and "checkpoint not found" in err and "Traceback" not in err

    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "pipeline.json").write_text((tiny_pipeline_dir / "pipeline.json").read_text())
    for sub in ("gpt", "vq"):
        (corrupt / sub).mkdir()
        (corrupt / sub / "config.json").write_text((tiny_pipeline_dir / sub / "config.json").read_text())
        (corrupt / sub / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    code, _, err = run(["sample", "--model", str(corrupt)], capsys)
    assert code == 2 and "the file is corrupt or not a safetensors checkpoint" in err

    mismatched = tmp_path / "mismatched"
    mismatched.mkdir()
    for sub in ("gpt", "vq"):
        (mismatched / sub).mkdir()
        weights = (tiny_pipeline_dir / sub / "model.safetensors").read_bytes()
        (mismatched / sub / "model.safetensors").write_bytes(weights)
    cfg = json.loads((tiny_pipeline_dir / "gpt" / "config.json").read_text())
    cfg["config"]["dim"] = 64
    (mismatched / "gpt" / "config.json").write_text(json.dumps(cfg))
    (mismatched / "vq" / "config.json").write_text((tiny_pipeline_dir / "vq" / "config.json").read_text())
    (mismatched / "pipeline.json").write_text((tiny_pipeline_dir / "pipeline.json").read_text())
    code, _, err = run(["sample", "--model", str(mismatched)], capsys)
    assert code == 2 and "shape mismatches" in err and "cls_embedding.embedding_table.weight" in err
    assert "gpt/model.safetensors" in err


def test_llamagen_image_size_must_divide_by_the_tokenizer(tmp_path, capsys):
    gpt, vq = tmp_path / "gpt.pt", tmp_path / "vq.pt"
    gpt.write_bytes(b"")
    vq.write_bytes(b"")
    code, _, err = run(["sample", "--gpt-ckpt", str(gpt), "--vq-ckpt", str(vq), "--image-size", "250"], capsys)
    assert code == 2 and "not divisible" in err


def test_python_dash_m_is_the_same_command(tiny_pipeline_dir, tmp_path):
    out = tmp_path / "m.png"
    proc = subprocess.run([sys.executable, "-m", "vgen", "sample", "--model", str(tiny_pipeline_dir), "--out",
                           str(out), "--no-progress"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.exists()
    bad = subprocess.run([sys.executable, "-m", "vgen", "sample", "--sampler", "x", "--model",
                          str(tiny_pipeline_dir)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip() == "vgen: error: unknown sampler 'x'; available: " + \
        ", ".join(__import__("vgen.samplers").samplers.available_samplers())


def test_speculative_sampling_writes_an_acceptance_map(tiny_pipeline_dir, tmp_path, capsys):
    out, amap, stats = tmp_path / "grid.png", tmp_path / "map.png", tmp_path / "stats.json"
    code, stdout, _ = run(["sample", "--model", str(tiny_pipeline_dir), "--num-images", "3", "--sampler", "lantern",
                           "--window", "4", "--lantern-k", "5", "--draft-coupling", "gumbel", "--out", str(out),
                           "--acceptance-map", str(amap), "--stats", str(stats)], capsys)
    assert code == 0 and "forward passes per image where next-token AR takes 16 (" in stdout
    assert "x fewer), in 3 batches of 1; " in stdout  # a speculative sampler on a CPU: one image at a time
    assert Image.open(amap).size == (3 * 2 * 128 + 2 * 8, 128 + LEGEND_HEIGHT)  # each sample beside its map
    s = json.loads(stats.read_text())
    assert s["sampler"] == "lantern" and s["details"]["drafter"] == "jacobi" and s["details"]["lantern_k"] == 5
    assert s["passes_per_image"] < 16 and len(s["accept_step"]) == 3


def test_classes_go_by_name_as_well_as_by_id(tiny_pipeline_dir, tmp_path, capsys):
    stats = tmp_path / "s.json"
    code, stdout, err = run(["sample", "--model", str(tiny_pipeline_dir), "--class-id", "c", "--class-id", "0",
                             "--out", str(tmp_path / "g.png"), "--stats", str(stats)], capsys)
    assert code == 0, err
    assert json.loads(stats.read_text())["class_ids"] == [2, 0] and stdout.startswith("wrote 2 images to ")


def test_one_image_is_one_image(tiny_pipeline_dir, tmp_path, capsys):
    code, stdout, _ = run(["sample", "--model", str(tiny_pipeline_dir), "--num-images", "1",
                           "--out", str(tmp_path / "g.png")], capsys)
    assert code == 0 and stdout.startswith("wrote 1 image to ")


def test_samplers_are_listed(capsys):
    assert main(["samplers"]) == 0
    assert "ar" in capsys.readouterr().out.split()


def test_app_rejects_a_bad_concurrency_before_starting(capsys):
    code, _, err = run(["app", "--max-concurrency", "0"], capsys)
    assert code == 2 and err.strip() == "vgen: error: --max-concurrency must be >= 1, got 0"


def test_train_refuses_to_rerender_a_data_folder_with_another_background(tmp_path, capsys):
    (tmp_path / "train_images.npy").write_bytes(b"")  # a folder already holding textured (default) renders
    code, _, err = run(["train", "tokenizer", "--data-dir", str(tmp_path), "--background", "smooth",
                        "--run-dir", str(tmp_path / "run")], capsys)
    assert code == 2 and err.startswith("vgen: error: ") and "already holds images rendered with" in err
    assert not (tmp_path / "run").exists()


def test_train_refuses_a_device_for_recipes_that_train_on_the_cpu_only(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # --device cuda is a device this machine has
    code, _, err = run(["train", "kl", "--device", "cuda", "--data-dir", str(tmp_path / "data"),
                        "--run-dir", str(tmp_path / "run")], capsys)
    assert code == 2 and err.strip() == ("vgen: error: --device cuda: only the recipes mar, nbp, nar, blockdiff, t2i, "
                                         "scene-judge, t2v-kl, t2v-stream, ar --video train off the CPU; train kl "
                                         "on the CPU")
    assert not (tmp_path / "run").exists() and not (tmp_path / "data").exists()


@pytest.mark.parametrize(("recipe", "extra", "message"), [
    ("scene-judge", ["--num-val", "0"], "--num-val must be >= 1, got 0"),
    ("kl", ["--max-minutes", "nan"], "--max-minutes must be a finite number > 0, got nan"),
    ("kl", ["--num-images", "0"], "--num-images must be >= 1, got 0"),
    ("kl", ["--log-every", "0"], "log_every must be an integer >= 1, got 0"),
    ("kl", ["--lr", "inf"], "lr must be a finite number > 0, got inf"),
    ("kl", ["--steps", "-5"], "steps must be an integer >= 0 (0 = export the starting weights), got -5"),
    ("nar", ["--background", "smooth", "--first-frames", "2"], "--image-first and --first-frames train a video"),
    ("nar", ["--background", "smooth", "--eval-every", "-1"], "--eval-every must be >= 0, got -1"),
    ("blockdiff", ["--background", "smooth", "--teacher-cfg", "nan"], "--teacher-cfg must be a finite number"),
    ("blockdiff", ["--noise-shift", "0"], "noise_shift must be a finite number > 0, got 0.0"),
    ("blockdiff", ["--lone-block-share", "1.5"], "lone_block_share must be in [0, 1], got 1.5"),
    ("blockdiff", ["--rollout-share", "0.5"], "--rollout-share trains a student on its own streams against a"),
    ("blockdiff", ["--rollout-blocks", "0"], "rollout_blocks must be >= 1, got 0"),
    ("blockdiff", ["--class-repeats", "square"], "--class-repeats takes CLASS=N pairs with an integer N, got 'square'"),
    ("blockdiff", ["--class-repeats", "hexagon=2"], "class_repeats names an unknown class 'hexagon'"),
    ("blockdiff", ["--class-repeats", "square=2", "square=3"], "--class-repeats names 'square' twice"),
    ("mar", ["--class-repeats", "hexagon=2"], "class_repeats names an unknown class 'hexagon'"),
    ("mar", ["--class-repeats", "heart=x"], "--class-repeats takes CLASS=N pairs with an integer N, got 'heart=x'"),
    ("mar", ["--context-noise", "1.5"], "context_noise is a standard deviation in token units in [0, 1], got 1.5"),
])
def test_train_refuses_bad_settings_before_writing_anything(tmp_path, capsys, recipe, extra, message):
    threads = torch.get_num_threads()
    code, _, err = run(["train", recipe, "--data-dir", str(tmp_path / "data"), "--run-dir", str(tmp_path / "run"),
                        *extra], capsys)
    assert code == 2 and err.startswith(f"vgen: error: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists() and not (tmp_path / "data").exists()
    assert torch.get_num_threads() == threads


def test_app_refuses_a_port_outside_the_tcp_range(capsys):
    code, _, err = run(["app", "--port", "70000"], capsys)
    assert code == 2 and err.strip() == "vgen: error: --port must be a TCP port in [1, 65535], got 70000"


def test_train_nbp_and_nar_each_take_their_own_layout_options():
    """NBP's block layout (--block, --hybrid-blocks, --rope) and NAR's --image-first belong to one recipe each; the
    first-frames count is both recipes'."""
    parser = build_parser()
    nbp = parser.parse_args(["train", "nbp", "--block", "row", "--hybrid-blocks", "16", "--rope", "spatial",
                             "--first-frames", "2"])
    assert (nbp.block, nbp.hybrid_blocks, nbp.rope, nbp.first_frames) == ("row", 16, "spatial", 2)
    nar = parser.parse_args(["train", "nar", "--video", "--image-first", "--first-frames", "3"])
    assert nar.image_first and nar.first_frames == 3 and not hasattr(nar, "block")
    for wrong in (["train", "nar", "--block", "row"], ["train", "nbp", "--image-first"]):
        with pytest.raises(SystemExit):
            parser.parse_args(wrong)


@pytest.mark.parametrize(("extra", "message"), [
    (["--image-first"], "--image-first and --first-frames train a video model: add --video"),
    (["--first-frames", "2"], "--image-first and --first-frames train a video model: add --video"),
    (["--video", "--first-frames", "2"], "--first-frames trains frame 0 alone, which needs --image-first")])
def test_train_nar_refuses_frame_0_options_it_cannot_use(tmp_path, capsys, extra, message):
    code, _, err = run(["train", "nar", "--data-dir", str(tmp_path / "data"), "--run-dir", str(tmp_path / "run"),
                        *extra], capsys)
    assert code == 2 and err.strip() == f"vgen: error: {message}"
    assert not (tmp_path / "run").exists() and not (tmp_path / "data").exists()


def test_package_assembles_a_loadable_pipeline_that_records_its_training_data(tiny_pipeline_dir, tmp_path, capsys):
    from vgen.data.shapes import ShapesConfig, set_data_config
    from vgen.pipelines import load

    set_data_config(tmp_path / "data", ShapesConfig(background="smooth"))
    out = tmp_path / "packaged"
    code, printed, _ = run(["train", "package", "--gpt", str(tiny_pipeline_dir / "gpt"), "--vq",
                            str(tiny_pipeline_dir / "vq"), "--data-dir", str(tmp_path / "data"), "--out", str(out),
                            "--name", "packaged", "--dtype", "bf16"], capsys)
    assert code == 0 and "wrote pipeline packaged" in printed
    pipe = load(out)
    assert pipe.info.data["background"] == "smooth" and pipe.info.defaults == {"cfg_scale": 2.0}
    original = load(tiny_pipeline_dir)
    for a, b in zip(original.model.state_dict().values(), pipe.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)  # bf16 storage


def test_package_records_sampling_defaults_that_quality_uses_unless_overridden(tiny_pipeline_dir, tmp_path, capsys):
    out, report = tmp_path / "packaged", tmp_path / "q.json"
    code, _, err = run(["train", "package", "--gpt", str(tiny_pipeline_dir / "gpt"), "--vq",
                        str(tiny_pipeline_dir / "vq"), "--out", str(out), "--cfg-scale", "3", "--temperature", "0.6",
                        "--top-k", "5"], capsys)
    assert code == 0, err
    defaults = json.loads((out / "pipeline.json").read_text())["defaults"]
    assert defaults == {"cfg_scale": 3.0, "temperature": 0.6, "top_k": 5}
    quality = ["quality", "--model", str(out), "--num-images", "2", "--batch-size", "2", "--json", str(report)]
    assert run(quality, capsys)[0] == 0
    assert json.loads(report.read_text())["sampling"] | defaults == json.loads(report.read_text())["sampling"]
    assert run([*quality, "--temperature", "1", "--top-p", "0.9", "--overwrite"], capsys)[0] == 0
    sampling = json.loads(report.read_text())["sampling"]
    assert (sampling["temperature"], sampling["top_k"], sampling["top_p"]) == (1.0, 5, 0.9)


def test_package_refuses_invalid_sampling_defaults_before_writing(tiny_pipeline_dir, tmp_path, capsys):
    out = tmp_path / "packaged"
    code, _, err = run(["train", "package", "--gpt", str(tiny_pipeline_dir / "gpt"), "--vq",
                        str(tiny_pipeline_dir / "vq"), "--out", str(out), "--top-p", "0"], capsys)
    assert code == 2 and "top_p must be in (0, 1]" in err and not out.exists()


def test_continuous_model_samples_with_cspd_and_its_own_default(tiny_continuous_pipeline_dir, tmp_path, capsys):
    model = str(tiny_continuous_pipeline_dir)
    out, stats, amap = tmp_path / "c.png", tmp_path / "c.json", tmp_path / "map.png"
    code, stdout, err = run(["sample", "--model", model, "--sampler", "cspd", "--draft-length", "3",
                             "--prefill-ratio", "0.25", "--num-images", "2", "--out", str(out), "--stats", str(stats),
                             "--acceptance-map", str(amap)], capsys)
    assert code == 0, err
    s = json.loads(stats.read_text())
    assert s["sampler"] == "cspd" and s["tokens"] == 2 * 16 and s["details"]["prefill_tokens"] == 4
    assert s["details"]["draft_length"] == 3 and Image.open(amap).size[0] > 0
    code, _, _ = run(["sample", "--model", model, "--num-images", "1", "--out", str(out), "--stats", str(stats),
                      "--overwrite"], capsys)
    assert code == 0 and json.loads(stats.read_text())["sampler"] == "continuous-ar"


def test_quality_of_a_continuous_model_reports_class_accuracy_without_token_statistics(tiny_continuous_pipeline_dir,
                                                                                       tmp_path, capsys):
    report = tmp_path / "q.json"
    code, _, err = run(["quality", "--model", str(tiny_continuous_pipeline_dir), "--num-images", "3",
                        "--batch-size", "2", "--json", str(report)], capsys)
    assert code == 0, err
    figures = json.loads(report.read_text())
    assert figures["per_class"] and 0.0 <= figures["class_accuracy"] <= 1.0
    assert "mean_entropy_nats" not in figures  # entropy and top-1 describe discrete distributions only


def test_quality_samples_with_the_sampler_and_options_asked_for(tiny_continuous_pipeline_dir, tmp_path, capsys):
    report = tmp_path / "q.json"
    code, printed, err = run(["quality", "--model", str(tiny_continuous_pipeline_dir), "--num-images", "2",
                              "--batch-size", "2", "--head-steps", "3", "--json", str(report)], capsys)
    assert code == 0, err
    figures = json.loads(report.read_text())
    assert figures["sampler"] == {"name": "continuous-ar", "options": {"head_steps": 3}}
    assert printed.startswith("tiny-continuous: 2 images, seed 0, continuous-ar head_steps=3 (")
    code, _, err = run(["quality", "--model", str(tiny_continuous_pipeline_dir), "--num-images", "2",
                        "--batch-size", "2", "--sampler", "cspd", "--inner-temperature", "4", "--draft-steps", "2",
                        "--json", str(report), "--overwrite"], capsys)
    assert code == 0, err
    assert json.loads(report.read_text())["sampler"] == {"name": "cspd",
                                                          "options": {"inner_temperature": 4.0, "draft_steps": 2}}


@pytest.mark.parametrize("args, message", [
    (["--sampler", "nope"], "unknown sampler 'nope'"),
    (["--sampler", "lantern", "--lantern-delta", "-1"], "lantern_delta must be in [0, 262144], got -1.0"),
    (["--sampler", "cspd"], "sampler 'cspd' does not fit LlamaGenGPT (raster tokens)"),
])
def test_quality_refuses_a_bad_sampler_in_one_line(tiny_pipeline_dir, args, message, capsys):
    code, _, err = run(["quality", "--model", str(tiny_pipeline_dir), "--num-images", "2", *args], capsys)
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_quality_draws_progress_bars_unless_told_not_to(tiny_pipeline_dir, capsys):
    args = ["quality", "--model", str(tiny_pipeline_dir), "--num-images", "2", "--batch-size", "2"]
    code, _, err = run(args, capsys)
    assert code == 0 and "tok/s" in err
    code, _, err = run([*args, "--no-progress"], capsys)
    assert code == 0 and "tok/s" not in err


def test_quality_prints_a_short_summary_with_classes_by_name(tiny_pipeline_dir, tmp_path, capsys):
    report = tmp_path / "q.json"
    code, printed, err = run(["quality", "--model", str(tiny_pipeline_dir), "--num-images", "3", "--batch-size", "3",
                              "--json", str(report)], capsys)
    assert code == 0, err
    lines = printed.splitlines()
    assert lines[0] == ("tiny: 3 images, seed 0, ar (temperature 1.0, top_k 0, top_p 1.0, cfg_scale 2.0, "
                        "cfg_interval -1)")
    assert lines[1].startswith("class_accuracy ") and "mean_entropy_nats" in printed and "confusion" not in printed
    assert lines[-2].split() == ["class", "a", "b", "c"] and lines[-1].split()[0] == "accuracy" and len(lines) <= 8
    figures = json.loads(report.read_text())
    assert list(figures["per_class"]) == ["a", "b", "c"] and len(figures["confusion"]) == 8
    assert ("misread: " in printed) == (figures["class_accuracy"] < 1)


def test_the_summary_names_what_each_missed_class_was_seen_as_most_often_first(tiny_pipeline_dir):
    from vgen.apps.quality_cli import misread
    from vgen.pipelines import load

    confusion = [[0] * 8 for _ in range(8)]
    confusion[0][0], confusion[0][1], confusion[0][5], confusion[2][2] = 3, 1, 2, 4  # class "a" missed 3 times
    assert misread(load(tiny_pipeline_dir), confusion) == "a as ring 2, square 1"
    confusion[1][0:8] = [1, 0, 1, 1, 1, 1, 1, 1]
    assert misread(load(tiny_pipeline_dir), confusion, most=2).endswith("; b as circle 1, triangle 1")


def test_quality_skips_the_token_statistics_when_told(tiny_pipeline_dir, tmp_path, capsys):
    report = tmp_path / "q.json"
    code, printed, err = run(["quality", "--model", str(tiny_pipeline_dir), "--num-images", "2", "--batch-size", "2",
                              "--no-token-stats", "--json", str(report)], capsys)
    assert code == 0, err
    figures = json.loads(report.read_text())
    assert "mean_entropy_nats" not in figures and "tokens_measured" not in figures
    assert "class_accuracy" in figures and "mean_entropy_nats" not in printed


@pytest.mark.parametrize("args, message", [
    (["--sampler", "cspd"], "sampler 'cspd' does not fit LlamaGenGPT (raster tokens); samplers that do: ar, "),
    (["--sampler", "cspd", "--prefill-ratio", "1.0"], "prefill_ratio must be in [0, 1)"),
])
def test_cspd_on_a_discrete_model_or_with_bad_settings_is_refused(tiny_pipeline_dir, tmp_path, args, message, capsys):
    code, _, err = run(["sample", "--model", str(tiny_pipeline_dir), *args, "--out", str(tmp_path / "x.png")], capsys)
    assert code == 2 and message in err and err.count("\n") == 1


@pytest.mark.parametrize("sampler", ["ar", "sjd"])
def test_a_discrete_sampler_on_a_continuous_model_names_the_samplers_that_fit(tiny_continuous_pipeline_dir, tmp_path,
                                                                              capsys, sampler):
    code, _, err = run(["sample", "--model", str(tiny_continuous_pipeline_dir), "--sampler", sampler,
                        "--out", str(tmp_path / "x.png")], capsys)
    assert code == 2 and err.count("\n") == 1
    assert (f"sampler '{sampler}' does not fit ContinuousAR (continuous tokens); samplers that do: continuous-ar, "
            f"cspd") in err


def test_a_nar_model_samples_with_nar_by_default_in_h_plus_w_minus_1_passes(tiny_pipeline_dir, tiny_nar_factory,
                                                                            tmp_path, capsys):
    from vgen.pipelines import load

    pipe = load(tiny_pipeline_dir)
    nar = type(pipe)(tiny_nar_factory((4, 4), vocab_size=32, num_classes=3), pipe.tokenizer, pipe.info)
    folder, out, stats = nar.save_pretrained(tmp_path / "nar"), tmp_path / "g.png", tmp_path / "s.json"
    code, stdout, err = run(["sample", "--model", str(folder), "--num-images", "2", "--out", str(out), "--stats",
                             str(stats)], capsys)
    assert code == 0, err
    assert "7 forward passes per image where next-token AR takes 16 (2.29x fewer), in 1 batch of 2" in stdout
    assert json.loads(stats.read_text())["sampler"] == "nar"


def test_sample_draws_the_prompts_of_a_janus_folder_with_any_sampler(tiny_janus_dir, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a big house under the moon\n\n")
    out, stats = tmp_path / "janus.png", tmp_path / "janus.json"
    code, printed, err = run(["sample", "--model", str(tiny_janus_dir), "--prompt", "a red cat", "--prompt-file",
                              str(prompts), "--sampler", "mcsjd", "--num-images", "3", "--out", str(out),
                              "--stats", str(stats), "--no-captions", "--no-progress"], capsys)
    assert code == 0, err
    recorded = json.loads(stats.read_text())
    assert recorded["prompts"] == ["a red cat", "a big house under the moon", "a red cat"]
    assert recorded["class_ids"] == [] and recorded["tokens"] == 3 * 16 and recorded["sampler"] == "mcsjd"
    assert Image.open(out).size == (3 * 8, 8) and "wrote 3 images" in printed


@pytest.mark.parametrize(("args", "message"), [
    (["--prompt", "a red square"], "is class-conditional: give class ids, not a prompt"),
    (["--t5-path", "t5"], "--t5-path goes with LlamaGen text-to-image checkpoints"),
    (["--prompt-file", "nowhere.txt"], "--prompt-file: cannot read prompt file nowhere.txt: No such file"),
])
def test_prompts_given_to_a_class_model_are_refused_in_one_line(tiny_pipeline_dir, tmp_path, capsys, args, message):
    code, _, err = run(["sample", "--model", str(tiny_pipeline_dir), "--out", str(tmp_path / "x.png"), *args], capsys)
    assert code == 2 and message in err and "Traceback" not in err and err.count("\n") == 1


def test_a_text_to_image_model_without_a_prompt_says_so(tiny_janus_dir, tmp_path, capsys):
    code, _, err = run(["sample", "--model", str(tiny_janus_dir), "--out", str(tmp_path / "x.png")], capsys)
    assert code == 2 and "is a text-to-image model: give --prompt or --prompt-file" in err


def test_t2i_config_writes_a_folder_that_model_loads_with_the_settings_given(llamagen_t2i_release, tmp_path, capsys):
    from vgen.pipelines import LLAMAGEN_T2I_CONFIG, load

    _, gpt_file, vq_file = llamagen_t2i_release(2048)  # the released caption width: the command takes no other
    folder = tmp_path / "t2i"
    code, printed, err = run(["t2i-config", str(folder), "--gpt-ckpt", str(gpt_file), "--vq-ckpt", str(vq_file),
                              "--top-k", "500", "--temperature", "0.9"], capsys)
    assert code == 0, err
    assert f"wrote {folder / LLAMAGEN_T2I_CONFIG}; sample with: vgen sample --model {folder}" in printed
    recorded = json.loads((folder / LLAMAGEN_T2I_CONFIG).read_text())
    assert recorded["gpt_ckpt"] == str(gpt_file) and recorded["t5_path"] is None and recorded["image_size"] == 256
    assert load(folder).info.defaults == {"cfg_scale": 7.5, "top_k": 500, "temperature": 0.9}


@pytest.mark.parametrize(("args", "message"), [
    (["--gpt-ckpt", "gpt.pt"], "vgen t2i-config needs --gpt-ckpt and --vq-ckpt"),
    (["--gpt-ckpt", "gpt.pt", "--vq-ckpt", "vq.pt"], "GPT checkpoint not found: gpt.pt"),
    (["--gpt-ckpt", "{gpt}", "--vq-ckpt", "{vq}", "--t5-path", "nowhere"], "no T5 folder at nowhere"),
    (["--gpt-ckpt", "{gpt}", "--vq-ckpt", "{vq}", "--top-p", "2"], "top_p must be in (0, 1] (1 = off), got 2.0"),
])
def test_t2i_config_refuses_missing_files_and_bad_settings_in_one_line(llamagen_t2i_release, tmp_path, capsys, args,
                                                                       message):
    _, gpt_file, vq_file = llamagen_t2i_release(2048)
    args = [a.format(gpt=gpt_file, vq=vq_file) for a in args]
    code, _, err = run(["t2i-config", str(tmp_path / "t2i"), *args], capsys)
    assert code == 2 and message in err and err.count("\n") == 1 and not (tmp_path / "t2i").exists()


def test_sample_draws_prompts_from_a_llamagen_t2i_folder(llamagen_t2i_release, tiny_t5_dir, tmp_path, capsys):
    from vgen.pipelines import write_llamagen_t2i_config

    folder = tmp_path / "t2i"
    _, gpt_file, vq_file = llamagen_t2i_release(32, folder)  # the tiny T5's width
    write_llamagen_t2i_config(folder, gpt_file, vq_file, t5_path=tiny_t5_dir, caption_dim=32)
    out, stats = tmp_path / "t2i.png", tmp_path / "t2i.json"
    code, _, err = run(["sample", "--model", str(folder), "--prompt", "a red square", "--out", str(out), "--stats",
                        str(stats)], capsys)
    assert code == 0, err
    recorded = json.loads(stats.read_text())
    assert recorded["prompts"] == ["a red square"] and recorded["tokens"] == 256
    width, height = Image.open(out).size  # the 256-px image at its own size, the prompt beneath it
    assert width == 256 + 2 * MARGIN and height > 256 + MARGIN
    vq_file.unlink()
    code, _, err = run(["sample", "--model", str(folder), "--prompt", "a red square"], capsys)
    assert code == 2 and "names vq_ckpt 'vq_ds16_t2i.pt', but" in err and err.count("\n") == 1


def test_a_class_given_to_a_text_model_is_refused_as_such(tiny_t2i_pipeline_dir, tmp_path, capsys):
    code, _, err = run(["sample", "--model", str(tiny_t2i_pipeline_dir), "--class-id", "star", "--out",
                        str(tmp_path / "x.png")], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "tiny-t2i is a text-to-image model: it draws what --prompt or --prompt-file describes, not --class-id" in err


def test_an_unknown_prompt_word_is_one_vgen_warning_line_with_what_to_say(tiny_t2i_pipeline_dir, tmp_path, capsys):
    code, _, err = run(["sample", "--model", str(tiny_t2i_pipeline_dir), "--prompt", "two red stars", "--out",
                        str(tmp_path / "x.png")], capsys)
    assert code == 0 and err.splitlines() == [
        "vgen: warning: prompt 0: words this model does not know, read as unknown: stars (say 'star'), two; stars, "
        "two: the model draws a single shape"]


def test_sample_help_opens_with_the_embedded_models_options_and_ends_with_llamagens():
    sample = build_parser()._subparsers._group_actions[0].choices["sample"]
    titles = [group.title for group in sample._action_groups if group._group_actions]
    assert titles[1:4] == ["model", "what to draw", titles[3]] and titles[3].startswith("generation")
    assert titles[4] == "output" and titles[-1] == "LlamaGen checkpoints (instead of --model)"
    assert {a.dest for a in sample._action_groups[-1]._group_actions} >= {"gpt_ckpt", "vq_ckpt", "num_classes"}


@pytest.mark.parametrize("model", ["class", "text"])
def test_a_negative_prompt_for_a_model_whose_guidance_takes_none_is_refused_in_one_line(model, tiny_pipeline_dir,
                                                                                        tiny_janus_dir, tmp_path,
                                                                                        capsys):
    args = ["--model", str(tiny_pipeline_dir)] if model == "class" else ["--model", str(tiny_janus_dir), "--prompt",
                                                                         "a red cat"]
    code, _, err = run(["sample", *args, "--negative-prompt", "blurry", "--out", str(tmp_path / "x.png")], capsys)
    last = err.strip().splitlines()[-1]  # after transformers' loading bar
    assert code == 2 and last.startswith("vgen: error: --negative-prompt is for a model whose guidance runs against "
                                         "a prompt (Emu3); ") and last.endswith("its own unconditional rows")
    assert not (tmp_path / "x.png").exists()


def test_the_app_serves_every_folder_vgen_load_reads_and_refuses_others_in_one_line(tiny_janus_dir, tiny_emu3_dir,
                                                                                     tiny_lumina_dir, tmp_path,
                                                                                     monkeypatch, capsys):
    pytest.importorskip("gradio")
    from vgen.apps import gradio_app

    built = []
    monkeypatch.setattr(gradio_app, "build_app", lambda *args: built.append(args))
    monkeypatch.setattr(gradio_app, "serve", lambda *args: None)
    folders = [str(tiny_janus_dir), str(tiny_emu3_dir), str(tiny_lumina_dir)]
    assert main(["app", *(f"--model-dir={f}" for f in folders), "--model", folders[1]]) == 0
    assert built[0][2].folders == tuple(folders)
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    code, _, err = run(["app", "--model-dir", str(tmp_path)], capsys)
    assert code == 2 and err.count("\n") == 1
    assert f"--model-dir {tmp_path} is not a model folder vgen.load reads" in err and "Janus-Pro" in err


def test_the_default_output_names_the_model_and_the_sampler(tiny_pipeline_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run(["sample", "--model", str(tiny_pipeline_dir)], capsys)[0] == 0
    code, stdout, _ = run(["sample", "--model", str(tiny_pipeline_dir), "--sampler", "sjd"], capsys)
    assert code == 0 and "to tiny_sjd.png" in stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny_ar.png", "tiny_sjd.png"]


@pytest.mark.parametrize(("given", "existing"), [
    (["--out", "grid.png"], "grid.png"), ([], "tiny_ar.png"), (["--out", "x.png", "--stats", "s.json"], "s.json"),
    (["--out", "x.png", "--acceptance-map", "map.png"], "map.png")])
def test_an_existing_output_is_refused_before_any_sampling_unless_overwrite(tiny_pipeline_dir, tmp_path, capsys,
                                                                            monkeypatch, given, existing):
    from vgen.samplers.ar import ARSampler

    monkeypatch.chdir(tmp_path)
    (tmp_path / existing).write_bytes(b"earlier work")
    sample = ARSampler.sample
    monkeypatch.setattr(ARSampler, "sample", lambda *a, **k: pytest.fail("sampled"))
    code, _, err = run(["sample", "--model", str(tiny_pipeline_dir), *given], capsys)
    assert code == 2
    assert err == f"vgen: error: {existing} exists; pass --overwrite to replace it, or name another file\n"
    assert (tmp_path / existing).read_bytes() == b"earlier work"
    monkeypatch.setattr(ARSampler, "sample", sample)
    assert run(["sample", "--model", str(tiny_pipeline_dir), *given, "--overwrite"], capsys)[0] == 0
    assert (tmp_path / existing).read_bytes() != b"earlier work"


def test_sample_help_says_captions_enlarge_the_images():
    text = " ".join(build_parser()._subparsers._group_actions[0].choices["sample"].format_help().split())
    assert "under it, the image enlarged to 160 px wide (nearest neighbour) so the words fit" in text


def test_sample_draws_a_lumina_folder_at_the_image_size_asked_with_mcsjd(tiny_lumina_dir, tmp_path, capsys):
    out, stats = tmp_path / "lumina.png", tmp_path / "lumina.json"
    code, printed, err = run(["sample", "--model", str(tiny_lumina_dir), "--image-size", "32", "--prompt", "a red star",
                              "--sampler", "mcsjd", "--out", str(out), "--stats", str(stats), "--no-captions"], capsys)
    assert code == 0, err
    recorded = json.loads(stats.read_text())
    assert recorded["sampler"] == "mcsjd" and recorded["tokens"] == 4 and recorded["prompts"] == ["a red star"]
    assert Image.open(out).size == (32, 32) and "wrote 1 image" in printed


def test_image_size_is_refused_in_one_line_for_a_model_of_one_size(tiny_janus_dir, tmp_path, capsys):
    code, _, err = run(["sample", "--model", str(tiny_janus_dir), "--image-size", "32", "--prompt", "a red cat",
                        "--out", str(tmp_path / "x.png")], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "--image-size is for LlamaGen checkpoints and Emu3, Lumina-mGPT or Anole folders" in err
    assert f"folders; {tiny_janus_dir} draws images of its own size" in err


@pytest.mark.parametrize("negative", [[], ["--negative-prompt", "lowres, blurry"]])
def test_sample_draws_an_emu3_folder_with_mcsjd_against_its_negative_prompt(negative, tiny_emu3_dir, tmp_path, capsys):
    out, stats = tmp_path / "emu3.png", tmp_path / "emu3.json"
    code, printed, err = run(["sample", "--model", str(tiny_emu3_dir), "--image-size", "32", "--prompt", "a red star",
                              "--sampler", "mcsjd", *negative, "--out", str(out), "--stats", str(stats),
                              "--no-captions"], capsys)
    assert code == 0, err
    recorded = json.loads(stats.read_text())
    assert recorded["sampler"] == "mcsjd" and recorded["tokens"] == 16 and recorded["prompts"] == ["a red star"]
    assert Image.open(out).size == (32, 32) and "wrote 1 image" in printed


def test_a_speculative_sampler_draws_one_image_at_a_time_on_a_cpu_unless_given_a_batch_size(tiny_pipeline_dir,
                                                                                            tmp_path, capsys):
    stats = tmp_path / "s.json"
    base = ["sample", "--model", str(tiny_pipeline_dir), "--num-images", "3", "--sampler", "mcsjd", "--out",
            str(tmp_path / "g.png"), "--stats", str(stats), "--overwrite"]
    assert run(base, capsys)[0] == 0
    one = json.loads(stats.read_text())
    assert (one["batches"], one["images_per_batch"]) == (3, 1)
    assert one["passes_per_image"] == pytest.approx(sum(max(row) for row in one["accept_step"]) / 3)
    assert one["step_compression"] == pytest.approx(16 / one["passes_per_image"])
    assert run([*base, "--batch-size", "3"], capsys)[0] == 0
    assert (json.loads(stats.read_text())["batches"], json.loads(stats.read_text())["images_per_batch"]) == (1, 3)
    assert run([*base, "--sampler", "ar"], capsys)[0] == 0
    assert json.loads(stats.read_text())["batches"] == 1  # a one-token-per-pass sampler: one batch


def test_compare_draws_the_same_images_with_ar_and_prints_figures_that_reconcile(tiny_pipeline_dir, tmp_path, capsys):
    stats = tmp_path / "s.json"
    code, stdout, err = run(["sample", "--model", str(tiny_pipeline_dir), "--num-images", "2", "--sampler", "sjd",
                             "--out", str(tmp_path / "g.png"), "--stats", str(stats), "--compare"], capsys)
    assert code == 0, err
    s = json.loads(stats.read_text())
    ref = s["compare"]
    assert ref["sampler"] == "ar" and ref["passes_per_image"] == 16
    assert ref["step_compression"] == pytest.approx(16 / s["passes_per_image"]) == pytest.approx(s["step_compression"])
    assert ref["latency_ratio"] == pytest.approx(ref["wall_time_s"] / s["wall_time_s"])
    assert stdout.splitlines()[-1] == (f"ar, same seed and batches: 16 forward passes per image, "
                                       f"{ref['wall_time_s']:.2f} s sampling; sjd took "
                                       f"{ref['step_compression']:.2f}x fewer passes and ran "
                                       f"{ref['latency_ratio']:.2f}x as fast")


@pytest.mark.parametrize(("args", "message"), [
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["--batch-size", "-3"], "--batch-size must be >= 1, got -3"),
])
def test_a_bad_batch_size_is_refused_in_one_line(tiny_pipeline_dir, tmp_path, capsys, args, message):
    code, _, err = run(["sample", "--model", str(tiny_pipeline_dir), "--out", str(tmp_path / "g.png"), *args], capsys)
    assert code == 2 and err.startswith(f"vgen: error: {message}") and err.count("\n") == 1, err
