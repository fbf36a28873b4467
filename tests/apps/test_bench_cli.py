"""``vgen bench``: one run writes consistent JSON, Markdown and plot files, for a class or a text-to-image model; bad
input gets one specific line."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from vgen.apps.cli import main
from vgen.eval import bench
from vgen.samplers import available_samplers


def run(args, capsys):
    code = main(["bench", *map(str, args), "--no-progress"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_bench_writes_json_table_and_plot(tiny_shapes_pipeline_dir, tmp_path, capsys):
    code, out, err = run(["--model", tiny_shapes_pipeline_dir, "--samplers", "sjd,ar", "gsd4=gsd:window=4",
                          "--num-samples", 4, "--batch-size", 2, "--num-real", 32, "--cfg-scale", 3.0,
                          "--out", tmp_path / "b"], capsys)
    assert code == 0, err
    result = json.loads((tmp_path / "b" / "bench.json").read_text())
    rows = result["results"]
    assert [r["label"] for r in rows] == ["sjd", "ar", "gsd4"] and rows[2]["options"] == {"window": 4}
    ar = rows[1]
    assert ar["step_compression"] == 1 and result["setup"]["reference"] == "ar"
    assert all(r["step_compression"] == ar["forward_passes"] / r["forward_passes"] for r in rows)
    assert result["setup"]["sampling"]["cfg_scale"] == 3.0 and result["setup"]["num_samples"] == 4
    assert result["setup"]["real_count"] == 32  # --num-real rendered validation images
    table = (tmp_path / "b" / "bench.md").read_text()
    assert [line.split("|")[1].strip() for line in table.splitlines()[4:]] == ["sjd", "ar", "gsd4"]
    assert table.split("\n\n", 1)[1] in out and Image.open(tmp_path / "b" / "bench.png").size == (1560, 400)
    assert "vgen: warning: only 4 samples for 192-d features" in err  # and it is recorded
    assert any(w.startswith("only 4 samples") for w in result["warnings"])


def test_default_samplers_are_every_registered_one_for_the_model(tiny_shapes_pipeline_dir, tmp_path, capsys):
    code, _, err = run(["--model", tiny_shapes_pipeline_dir, "--num-samples", 2, "--batch-size", 2,
                        "--num-real", 8, "--out", tmp_path / "b"], capsys)
    assert code == 0, err
    labels = [r["label"] for r in json.loads((tmp_path / "b" / "bench.json").read_text())["results"]]
    assert labels == available_samplers("raster") and labels[0] == "ar" and "nar" not in labels


@pytest.mark.parametrize("args, message", [
    (["--samplers", "ar,nope"], "sampler 'nope': unknown sampler 'nope'; available: "),
    (["--samplers", "sjd:window=-1"], "window must be an integer in [0, "),
    (["--samplers", "sjd,sjd"], "labels must be unique; repeated: sjd"),
    (["--num-samples", "1"], "--num-samples must be in [2, 10000000], got 1"),
    (["--real", "/no/such/images"], "--real /no/such/images does not exist"),
    (["--reference", "fast=nope:window=2"], "sampler 'fast=nope:window=2': unknown sampler 'nope'"),
    (["--reference", "ar", "--reference-model", "shapes-c2i"], "--reference picks the reference row's sampler"),
    (["--samplers", "ar", "--reference", "ar"], "the reference row's label 'ar' is also a sampler row's"),
])
def test_bad_input_gets_one_specific_line_and_exit_2(tiny_shapes_pipeline_dir, tmp_path, args, message, capsys):
    code, out, err = run(["--model", tiny_shapes_pipeline_dir, "--out", tmp_path / "b", *args], capsys)
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "b").exists()


def test_a_model_without_a_data_set_needs_real_images(tiny_pipeline_dir, tmp_path, capsys):
    code, _, err = run(["--model", tiny_pipeline_dir, "--samplers", "ar", "--out", tmp_path / "b"], capsys)
    assert code == 2 and "records no vgen.data set to render real images from; give real images" in err


def test_a_text_model_is_benched_on_held_out_prompts_with_accuracy_per_attribute(tiny_t2i_pipeline_dir,
                                                                                  tiny_scene_judge, tmp_path,
                                                                                  monkeypatch, capsys):
    monkeypatch.setattr(bench, "load_scene_judge", lambda: tiny_scene_judge)  # the shipped one is 64-px
    code, out, err = run(["--model", tiny_t2i_pipeline_dir, "--samplers", "ar,sjd", "--num-samples", 4,
                          "--batch-size", 2, "--num-real", 8, "--out", tmp_path / "b"], capsys)
    assert code == 0, err
    result = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert result["setup"]["conditioning"] == "prompts" and result["setup"]["reference_token_statistics"]
    assert all(set(r["attribute_accuracy"]) == {"shape", "colour", "size", "position", "background", "position_row",
                                                "position_column", "joint"}
               and r["class_accuracy"] is None for r in result["results"])
    setup, header = out.splitlines()[:2]
    assert "(one per held-out scene prompt)" in setup and "whose next-token distributions have mean entropy" in setup
    assert header.endswith("| FID vs AR | shape | colour | size | position | background | position_row "
                           "| position_column | joint |")


def test_a_text_model_whose_judge_is_missing_gets_one_line_before_sampling(tiny_t2i_pipeline_dir, tmp_path,
                                                                           monkeypatch, capsys):
    from vgen.hub import from_pretrained

    monkeypatch.setattr(bench, "load_scene_judge", lambda: from_pretrained(tmp_path / "shapes-scene-judge"))
    code, _, err = run(["--model", tiny_t2i_pipeline_dir, "--samplers", "ar", "--num-samples", 2, "--num-real", 4,
                        "--out", tmp_path / "b"], capsys)
    assert code == 2 and err.count("\n") == 1 and "no config.json in " in err and "shapes-scene-judge" in err, err
    assert not (tmp_path / "b").exists()


PARTI = "Prompt\tCategory\tChallenge\tNote\na red cat\tAnimals\tBasic\t\na map of the river\tArtifacts\tComplex\t\n"


@pytest.fixture
def no_inception_weights(tmp_path, monkeypatch):
    """No Inception-v3 weights file where vgen looks for one."""
    from vgen.eval import weights

    monkeypatch.setenv(weights.WEIGHTS_ENV, str(tmp_path / "no-weights"))
    monkeypatch.setattr(weights, "CACHE_DIR", tmp_path / "no-cache")


def test_any_text_model_is_benched_on_a_prompt_set_with_the_clip_score(llamagen_t2i_folder, tiny_clip_dir, tmp_path,
                                                                       no_inception_weights, capsys):
    (tmp_path / "parti.tsv").write_text(PARTI)
    code, out, err = run(["--model", llamagen_t2i_folder, "--prompts", tmp_path / "parti.tsv", "--clip", tiny_clip_dir,
                          "--samplers", "ar,sjd", "--window", 3, "--batch-size", 2, "--num-samples", 4,
                          "--by-category", "--out", tmp_path / "b"], capsys)
    assert code == 0, err
    result = json.loads((tmp_path / "b" / "bench.json").read_text())
    ar, sjd = result["results"]
    assert sjd["options"] == {"window": 3} and ar["options"] == {}  # the flag reaches the rows that take it
    assert ar["clip_score"] is not None and sjd["mean_entropy_nats"] is not None and ar["fid"] is None
    assert list(result["categories"]) == ["Animals", "Artifacts"]
    assert result["setup"]["num_samples"] == 4 and result["setup"]["prompt_set"]["count"] == 2
    assert "vgen: warning: no FID columns: Inception-v3" in err and "put the file there" in err
    assert "| CLIP score by category | samples | ar | sjd |" in out and "| CLIP score |" in out
    assert Image.open(tmp_path / "b" / "bench.png").size == (1040, 400)


def test_a_janus_model_is_benched_with_every_column_a_text_model_has(tiny_janus_dir, tiny_clip_dir, tmp_path,
                                                                     no_inception_weights, capsys):
    (tmp_path / "prompts.txt").write_text("a red cat\na blue dog on the moon\n")
    code, out, err = run(["--model", tiny_janus_dir, "--prompts", tmp_path / "prompts.txt", "--clip", tiny_clip_dir,
                          "--samplers", "ar,mcsjd,lantern", "--batch-size", 2, "--out", tmp_path / "b"], capsys)
    assert code == 0, err
    rows = json.loads((tmp_path / "b" / "bench.json").read_text())["results"]
    assert [r["label"] for r in rows] == ["ar", "mcsjd", "lantern"]
    assert all(r["clip_score"] is not None and r["mean_entropy_nats"] > 0 and r["tokens_per_second"] > 0
               for r in rows)
    assert rows[1]["step_compression"] > 1
    assert out.splitlines()[1].endswith("| entropy (nats) | top-1 | CLIP score |")


def test_one_image_per_prompt_by_default(llamagen_t2i_folder, tmp_path, no_inception_weights, capsys):
    (tmp_path / "prompts.txt").write_text("a red cat\na blue dog\na map\n")
    code, _, err = run(["--model", llamagen_t2i_folder, "--prompts", tmp_path / "prompts.txt", "--samplers", "ar",
                        "--batch-size", 3, "--out", tmp_path / "b"], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "b" / "bench.json").read_text())["setup"]["num_samples"] == 3


@pytest.mark.parametrize("args, message", [
    (["--samplers", "ar", "--window", 4], "--window: none of the benchmarked samplers (ar) takes it"),
    (["--prompts", "{tmp}/prompts.txt", "--by-category"], "--by-category needs a --prompts set with categories"),
    (["--clip", "{tmp}/nowhere"], "--clip {tmp}/nowhere does not exist"),
    (["--subset", 2], "--subset is for a prompt set: give --prompts FILE"),
    (["--features", "inception", "--weights", "{tmp}/none.pth"], "weights file not found: {tmp}/none.pth"),
])
def test_bad_text_benchmark_input_gets_one_line(llamagen_t2i_folder, tmp_path, args, message, capsys):
    (tmp_path / "prompts.txt").write_text("a red cat\n")
    args = [str(a).format(tmp=tmp_path) for a in args]
    code, _, err = run(["--model", llamagen_t2i_folder, "--num-samples", 2, "--out", tmp_path / "b", *args], capsys)
    assert code == 2 and err.count("vgen: error") == 1 and message.format(tmp=tmp_path) in err, err
    assert not (tmp_path / "b").exists()


def test_a_class_model_refuses_a_prompt_set(tiny_shapes_pipeline_dir, tmp_path, capsys):
    (tmp_path / "prompts.txt").write_text("a red cat\n")
    code, _, err = run(["--model", tiny_shapes_pipeline_dir, "--prompts", tmp_path / "prompts.txt", "--num-samples",
                        2, "--num-real", 4, "--out", tmp_path / "b"], capsys)
    assert code == 2 and "is class-conditional: it draws classes, not a prompt set" in err, err
