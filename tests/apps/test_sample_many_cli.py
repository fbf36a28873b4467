"""``vgen sample-many``: two gloo processes under torchrun pack the same .npz as one process, resume after lost
files or a stop, also for a COCO caption subset; the label options (class ids or names) hold in the packed file; a
text-to-image model draws a prompt file's or a prompt set's prompts in turn, one image a prompt by default, with
their ids and categories in the .npz and the manifest; every embedded model kind samples, a streaming model clips of
--num-frames; the README's command works in a fresh folder; damaged files, a full disk and prompt-file mistakes get
one line."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vgen.apps.cli import main

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def sample_many(*args):
    return [sys.executable, "-m", "vgen", "sample-many", *map(str, args), "--no-progress"]


def torchrun(nproc, *args):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m", "vgen",
            "sample-many", *map(str, args), "--no-progress"]


def check(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def packed(path):
    with np.load(path) as f:
        return f["arr_0"], f["arr_1"]


def packed_all(path):
    with np.load(path) as f:
        return {name: f[name] for name in f.files}


def write_coco(path, images=6, captions=3):
    """A COCO caption file: ``images`` images of ``captions`` captions each, made of the scene captions' words."""
    words = ["red", "blue", "green", "yellow"]
    annotations = [{"image_id": 100 + i, "id": 10 * i + c, "caption": f"a {words[(i + c) % 4]} star on a "
                                                                      f"{words[(i + 2 * c + 1) % 4]} background"}
                   for c in range(captions) for i in range(images)]
    path.write_text(json.dumps({"images": [{"id": 100 + i} for i in range(images)], "annotations": annotations}))
    return path


@pytest.mark.slow
def test_a_coco_subset_resumed_on_two_processes_packs_the_npz_of_one_ids_included(tiny_t2i_pipeline_dir, tmp_path):
    coco = write_coco(tmp_path / "captions_val2014.json")
    common = ["--model", tiny_t2i_pipeline_dir, "--prompts", coco, "--subset", 5, "--subset-seed", 3,
              "--batch-size", 2, "--seed", 1]
    assert "wrote 5 samples" in check(sample_many(*common, "--out", tmp_path / "one"))
    one = packed_all(tmp_path / "one.npz")
    assert set(one) == {"arr_0", "arr_1", "prompts", "ids"} and one["arr_0"].shape == (5, 16, 16, 3)
    assert len(set(one["ids"].tolist())) == 5 and set(one["ids"].tolist()) < {str(100 + i) for i in range(6)}
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    for i in (0, 2, 3):  # batch 0 (rank 0) and batch 1 (rank 1) lost, as by a stopped job; batch 2 kept
        (tmp_path / "two" / f"{i:06d}.png").unlink()
    assert "drew 4 in this run on 2 processes, kept 1" in check(torchrun(2, *common, "--out", tmp_path / "two"))
    two = packed_all(tmp_path / "two.npz")
    assert all(np.array_equal(one[k], two[k]) for k in one) and set(two) == set(one)


@pytest.mark.slow
def test_a_stopped_run_resumes_to_the_same_npz(tiny_pipeline_dir, tmp_path):
    common = ["--model", tiny_pipeline_dir, "--num-samples", 200, "--batch-size", 2]
    proc = subprocess.Popen(torchrun(2, *common, "--out", tmp_path / "run"), env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len(list((tmp_path / "run").glob("*.png"))) < 10 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # as a scheduler preempting the job: torchrun stops its workers
    proc.wait(timeout=60)
    names = {p.name for p in (tmp_path / "run").glob("*.png")}
    time.sleep(1)
    assert names == {p.name for p in (tmp_path / "run").glob("*.png")}  # nothing is still running
    assert 10 <= len(names) < 200 and not (tmp_path / "run.npz").exists()  # it was stopped part way
    whole = sum({f"{2 * k:06d}.png", f"{2 * k + 1:06d}.png"} <= names for k in range(100))
    assert f"drew {200 - 2 * whole} in this run on 2 processes, kept {2 * whole}" in check(
        torchrun(2, *common, "--out", tmp_path / "run"))
    check(sample_many(*common, "--out", tmp_path / "ref"))
    for a, b in zip(packed(tmp_path / "run.npz"), packed(tmp_path / "ref.npz")):
        assert np.array_equal(a, b)


def run(args, capsys):
    code = main(["sample-many", *map(str, args), "--no-progress"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_balanced_labels_and_class_restriction_hold_in_the_npz(tiny_pipeline_dir, tmp_path, capsys):
    code, out, _ = run(["--model", tiny_pipeline_dir, "--num-samples", 10, "--batch-size", 4, "--balanced",
                        "--out", tmp_path / "bal"], capsys)
    assert code == 0 and "wrote 10 samples" in out
    assert Counter(packed(tmp_path / "bal.npz")[1].tolist()) == {0: 4, 1: 3, 2: 3}
    code, _, _ = run(["--model", tiny_pipeline_dir, "--num-samples", 12, "--class-id", 2, "--class-id", 0,
                      "--out", tmp_path / "two-classes", "--npz", tmp_path / "x.npz"], capsys)
    labels = packed(tmp_path / "x.npz")[1]
    assert code == 0 and set(labels.tolist()) == {0, 2} and len(labels) == 12
    code, _, _ = run(["--model", tiny_pipeline_dir, "--num-samples", 6, "--class-id", 1, "--class-id", 2,
                      "--balanced", "--out", tmp_path / "bal2"], capsys)
    assert code == 0 and packed(tmp_path / "bal2.npz")[1].tolist() == [1, 2, 1, 2, 1, 2]


def test_classes_go_by_name_as_well_as_by_id(tiny_pipeline_dir, tmp_path, capsys):
    code, _, err = run(["--model", tiny_pipeline_dir, "--num-samples", 4, "--class-id", "c", "--class-id", 0,
                        "--balanced", "--out", tmp_path / "run"], capsys)
    assert code == 0, err
    assert packed(tmp_path / "run.npz")[1].tolist() == [2, 0, 2, 0]


def test_a_streaming_model_draws_clips_of_num_frames_with_its_cfg_scale(tiny_stream_pipeline_dir, tmp_path,
                                                                         capsys):
    args = ["--model", tiny_stream_pipeline_dir, "--num-samples", 3, "--batch-size", 2, "--class-id", "b",
            "--class-id", "c", "--balanced", "--num-frames", 3, "--cfg-scale", 2, "--out", tmp_path / "run"]
    code, out, err = run(args, capsys)
    assert code == 0 and "wrote 3 samples" in out, err
    clips, labels = packed(tmp_path / "run.npz")
    assert clips.shape == (3, 3, 16, 16, 3) and labels.tolist() == [1, 2, 1]
    settings = json.loads((tmp_path / "run" / "sample_many.json").read_text())["settings"]
    assert settings["frames"] == 3 and settings["stream"]["cfg_scale"] == 2.0 and settings["stream"]["steps"] == 2
    assert "drew 0 in this run on 1 process, kept 3" in run([*args, "--overwrite"], capsys)[1]
    code, _, err = run(["--model", tiny_stream_pipeline_dir, "--num-samples", 1, "--out", tmp_path / "default"],
                       capsys)
    assert code == 0 and packed(tmp_path / "default.npz")[0].shape == (1, 8, 16, 16, 3), err  # trained length


def test_a_video_token_model_draws_clips_longer_than_its_window(tiny_video_pipeline_dir, tmp_path, capsys):
    args = ["--model", tiny_video_pipeline_dir, "--num-samples", 3, "--batch-size", 2, "--balanced",
            "--num-frames", 5, "--window-context", 2, "--out", tmp_path / "run"]
    code, out, err = run(args, capsys)
    assert code == 0 and "wrote 3 samples" in out, err
    clips, labels = packed(tmp_path / "run.npz")
    assert clips.shape == (3, 5, 16, 16, 3) and labels.tolist() == [0, 1, 2]
    settings = json.loads((tmp_path / "run" / "sample_many.json").read_text())["settings"]
    assert settings["frames"] == 5 and settings["window_context"] == 2 and settings["sampler"]["name"] == "nbp"
    from vgen.eval.sample_many import SamplePlan
    from vgen.pipelines import load

    expected = load(tiny_video_pipeline_dir)([0, 1], seed=SamplePlan(0, 2, (0, 1, 2)).batch_seed(0), num_frames=5,
                                             window_context=2).videos
    np.testing.assert_array_equal(clips[:2], expected)  # batch 0 is the pipeline's windowed clips
    assert "drew 0 in this run on 1 process, kept 3" in run([*args, "--overwrite"], capsys)[1]
    code, _, err = run([*args[:-2], "--window-context", 1, "--out", tmp_path / "run", "--overwrite"], capsys)
    assert code == 2 and "other settings" in err, err


@pytest.mark.parametrize("model, args, message", [
    ("tiny_video_pipeline_dir", ["--window-context", "3"],
     "window_context must be a whole number of frames between 1 and 2"),
    ("tiny_video_pipeline_dir", ["--num-frames", "4", "--sampler", "ar"], "which the 'ar' sampler cannot do"),
    ("tiny_video_pipeline_dir", ["--num-frames", "0"], "--num-frames must be in [1, 10000000], got 0"),
    ("tiny_stream_pipeline_dir", ["--num-frames", "0"], "--num-frames must be in [1, 10000000], got 0"),
    ("tiny_stream_pipeline_dir", ["--top-k", "5", "--sampler", "sjd"],
     "--top-k, --sampler sample tokens; a streaming model denoises frames"),
    ("tiny_stream_pipeline_dir", ["--window", "4"], "--window sample tokens"),
    ("tiny_stream_pipeline_dir", ["--cfg-scale", "-1"], "cfg_scale must be in [0, 100.0]"),
    ("tiny_stream_pipeline_dir", ["--shift", "0"], "shift must be in (0, 100]"),
    ("tiny_video_pipeline_dir", ["--steps", "2"],
     "--steps sets a stream's schedule or context; tiny-video samples tokens"),
    ("tiny_stream_pipeline_dir", ["--class-id", "star"],
     "unknown class 'star' for tiny-stream; classes: a, b, c (or ids 0..2)"),
    ("tiny_stream_pipeline_dir", ["--window-context", "2"],
     "--window-context is for video token models; tiny-stream streams"),
])
def test_bad_video_input_gets_one_specific_line_and_leaves_no_files(request, tmp_path, model, args, message, capsys):
    full = ["--model", request.getfixturevalue(model), "--num-samples", 2, "--out", tmp_path / "new" / "run", *args]
    code, _, err = run(full, capsys)
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("args, message", [
    (["--num-samples", "0"], "--num-samples must be in [1, 10000000], got 0"),
    (["--num-samples", str(10**30)], "--num-samples must be in [1, 10000000], got 1" + "0" * 30),
    (["--class-id", "3"], "class id 3 is out of range"),
    (["--class-id", "star"], "unknown class 'star' for tiny; classes: a, b, c (or ids 0..2)"),
    (["--num-frames", "4"], "--num-frames is for video models; tiny generates images"),
    (["--window-context", "1"], "--window-context is for video models; tiny generates images"),
    (["--batch-size", "0"], "batch size must be >= 1"),
    (["--seed", "-1"], "seed must be in"),
    (["--sampler", "nope"], "unknown sampler 'nope'"),
    (["--npz", "x.txt"], "unsupported file type .txt"),
])
def test_bad_input_gets_one_specific_line_and_exit_2(tiny_pipeline_dir, tmp_path, args, message, capsys):
    full = ["--model", tiny_pipeline_dir, "--num-samples", 2, "--out", tmp_path / "new" / "run", *args]
    code, _, err = run(full, capsys)
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert not list(tmp_path.iterdir())  # no folder made for a refused command


def test_the_readmes_command_draws_exactly_the_samples_asked_for_into_new_folders(tiny_pipeline_dir, tmp_path,
                                                                                  monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # a fresh checkout: no samples/ folder yet
    code, out, err = run(["--model", tiny_pipeline_dir, "--num-samples", 5, "--balanced", "--out", "samples/run"],
                         capsys)
    assert code == 0 and "wrote 5 samples to samples/run.npz (drew 5 in this run" in out, err
    assert len(packed("samples/run.npz")[0]) == 5 and len(list(Path("samples/run").glob("*.png"))) == 5
    code, _, _ = run(["--model", tiny_pipeline_dir, "--num-samples", 2, "--out", "a/b/run", "--npz", "c/d/x.npz"],
                     capsys)
    assert code == 0 and len(packed("c/d/x.npz")[0]) == 2


def test_out_must_be_a_folder_that_can_be_made(tiny_pipeline_dir, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    for out, message in ((tmp_path / "file", "exists and is not a folder"),
                         (tmp_path / "file" / "run", "cannot create the folder of")):
        code, _, err = run(["--model", tiny_pipeline_dir, "--num-samples", 2, "--out", out], capsys)
        assert code == 2 and message in err and err.count("\n") == 1, err


def test_a_damaged_png_is_named_and_drawn_again(tiny_pipeline_dir, tmp_path, capsys):
    args = ["--model", tiny_pipeline_dir, "--num-samples", 4, "--batch-size", 2, "--out", tmp_path / "run"]
    assert run(args, capsys)[0] == 0
    reference = packed(tmp_path / "run.npz")
    (tmp_path / "run" / "000001.png").write_bytes(b"")
    code, out, err = run([*args, "--overwrite"], capsys)
    assert code == 0 and "drew 2 in this run on 1 process, kept 2" in out
    assert err.startswith(f"vgen: warning: {tmp_path / 'run' / '000001.png'} is damaged") and "drew it again" in err
    assert all(np.array_equal(a, b) for a, b in zip(packed(tmp_path / "run.npz"), reference))


def test_a_full_disk_gets_one_line_naming_the_file_and_leaves_no_part_files(tiny_pipeline_dir, tmp_path,
                                                                             monkeypatch, capsys):
    def no_space(self, fp, *args, **kwargs):
        fp.write(b"\x89PNG partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Image.Image, "save", no_space)
    code, _, err = run(["--model", tiny_pipeline_dir, "--num-samples", 2, "--out", tmp_path / "run"], capsys)
    png = tmp_path / "run" / "000000.png"
    assert code == 2 and err == f"vgen: error: cannot write {png}: No space left on device\n"
    assert not list(tmp_path.rglob("*.part"))


@pytest.mark.parametrize("model", ["shapes-nar", pytest.param("shapes-video-nar", marks=pytest.mark.slow),
                                   pytest.param("shapes-video-nbp", marks=pytest.mark.slow),
                                   pytest.param("shapes-c2i-continuous", marks=pytest.mark.slow)])
def test_every_embedded_model_kind_samples_into_a_fresh_folder(model, tmp_path, capsys):
    code, out, err = run(["--model", model, "--num-samples", 2, "--batch-size", 2, "--cfg-scale", 1,
                          "--out", tmp_path / "run"], capsys)
    assert code == 0 and "wrote 2 samples" in out, err
    images, labels = packed(tmp_path / "run.npz")
    frames = (8,) if "video" in model else ()
    assert images.shape == (2, *frames, 64, 64, 3) and len(labels) == 2


@pytest.mark.slow
def test_an_embedded_streaming_model_samples_into_a_fresh_folder(tmp_path, capsys):
    code, out, err = run(["--model", "shapes-blockdiff", "--num-samples", 1, "--num-frames", 2, "--class-id", "star",
                          "--out", tmp_path / "run"], capsys)
    assert code == 0 and "wrote 1 sample to" in out, err
    clips, labels = packed(tmp_path / "run.npz")
    assert clips.shape == (1, 2, 64, 64, 3) and labels.tolist() == [3]


def test_a_prompt_file_draws_its_prompts_in_turn_and_packs_them(tiny_t2i_pipeline_dir, tmp_path, capsys):
    prompts = tmp_path / "captions.txt"
    prompts.write_text("a large blue ring on a yellow background\n\n  a small red star  \n")
    args = ["--model", tiny_t2i_pipeline_dir, "--prompt-file", prompts, "--num-samples", 5, "--batch-size", 2,
            "--out", tmp_path / "run"]
    code, out, err = run(args, capsys)
    assert code == 0 and "wrote 5 samples" in out, err
    with np.load(tmp_path / "run.npz") as f:
        assert f["arr_0"].shape == (5, 16, 16, 3) and f["arr_1"].tolist() == [0, 1, 0, 1, 0]
        assert f["prompts"].tolist() == ["a large blue ring on a yellow background", "a small red star"] * 2 + [
            "a large blue ring on a yellow background"]
    prompts.write_text("a large blue ring on a yellow background\na small green star\n")
    code, _, err = run([*args, "--overwrite"], capsys)
    assert code == 2 and "holds samples made with other settings (plan: " in err and err.count("\n") == 1, err


def test_a_parti_set_draws_one_image_a_prompt_with_its_ids_and_columns_in_the_npz_and_manifest(
        tiny_t2i_pipeline_dir, tmp_path, capsys):
    parti = tmp_path / "PartiPrompts.tsv"
    parti.write_text("Prompt\tCategory\tChallenge\tNote\n"
                     "a large blue ring on a yellow background\tAbstract\tBasic\t\n"
                     "a small red star\tArtifacts\tColors\tnote\n"
                     "a green heart at the top left\tAnimals\tPerspective\t\n")

    def args(subset=2, seed=1, *more):
        return ["--model", tiny_t2i_pipeline_dir, "--prompts", parti, "--subset", subset, "--subset-seed", seed,
                "--batch-size", 2, "--out", tmp_path / "run", *more]

    code, out, err = run(args(), capsys)
    assert code == 0 and "wrote 2 samples" in out, err  # one image a prompt of the subset
    f = packed_all(tmp_path / "run.npz")
    rows = [int(i) - 1 for i in f["ids"]]
    table = [line.split("\t") for line in parti.read_text().splitlines()[1:]]
    assert len(rows) == 2 and rows == sorted(rows) and f["arr_1"].tolist() == [0, 1]
    for name, column in (("prompts", 0), ("categories", 1), ("challenges", 2)):
        assert f[name].tolist() == [table[r][column] for r in rows]
    manifest = json.loads((tmp_path / "run" / "sample_many.json").read_text())
    assert manifest["settings"]["plan"]["prompts"] | {"sha256": None} == {
        "count": 2, "sha256": None, "format": "parti", "subset": 2, "subset_seed": 1}
    recorded = manifest["prompt_set"]
    assert {k: recorded[k] for k in ("source", "format", "subset", "subset_seed")} == {
        "source": str(parti), "format": "parti", "subset": 2, "subset_seed": 1}
    assert recorded["prompts"] == [{"prompt": table[r][0], "id": str(r + 1), "category": table[r][1],
                                    "challenge": table[r][2]} for r in rows]
    code, _, err = run(args(2, 1, "--num-samples", 5, "--overwrite"), capsys)  # more samples than prompts, in turn
    assert code == 0 and packed_all(tmp_path / "run.npz")["ids"].tolist() == [str(r + 1) for r in rows * 3][:5]
    for other in (args(2, 2), args(3, 1), args(2, 1, "--format", "text")):
        code, _, err = run([*other, "--overwrite"], capsys)
        assert code == 2 and "holds samples made with other settings (plan: " in err, (other, err)


def test_a_geneval_set_keeps_its_tags_and_a_coco_file_one_caption_per_image(tiny_t2i_pipeline_dir, tmp_path,
                                                                            capsys):
    geneval = tmp_path / "evaluation_metadata.jsonl"
    geneval.write_text('{"tag": "single_object", "prompt": "a red star"}\n'
                       '{"tag": "colors", "prompt": "a blue ring"}\n')
    code, out, err = run(["--model", tiny_t2i_pipeline_dir, "--prompts", geneval, "--out", tmp_path / "gen"], capsys)
    assert code == 0 and "wrote 2 samples" in out, err
    f = packed_all(tmp_path / "gen.npz")
    assert f["categories"].tolist() == ["single_object", "colors"] and f["ids"].tolist() == ["1", "2"]
    assert "challenges" not in f
    coco = write_coco(tmp_path / "captions.json", images=3)
    code, out, err = run(["--model", tiny_t2i_pipeline_dir, "--prompts", coco, "--out", tmp_path / "coco"], capsys)
    assert code == 0 and "wrote 3 samples" in out, err
    f = packed_all(tmp_path / "coco.npz")
    assert f["ids"].tolist() == ["100", "101", "102"] and set(f) == {"arr_0", "arr_1", "prompts", "ids"}


@pytest.mark.parametrize("args, message", [
    (["--prompt-file", "EMPTY"], "holds no prompts: write one prompt a line"),
    (["--prompt-file", "MISSING"], "cannot read prompt file"),
    (["--num-samples", "2"], "tiny-t2i is a text-to-image model: give its prompts with --prompts FILE"),
    (["--prompt-file", "PROMPTS", "--class-id", "0"], "--class-id and --balanced are for a class model"),
    (["--prompt-file", "PROMPTS", "--balanced"], "--class-id and --balanced are for a class model"),
    (["--prompt-file", "PROMPTS", "--model", "CLASS"], "--prompt-file is for a text-to-image model; tiny is "
                                                       "class-conditional"),
    (["--prompts", "PROMPTS", "--model", "CLASS"], "--prompts is for a text-to-image model; tiny is "
                                                   "class-conditional"),
    (["--prompt-file", "PROMPTS", "--format", "parti"], "--prompt-file is plain text, one prompt a line: give "
                                                        "--prompts"),
    (["--subset", "2"], "--subset is for a prompt set: give --prompts FILE"),
    (["--format", "coco", "--subset-seed", "1"], "--format, --subset-seed are for a prompt set"),
    (["--prompts", "PROMPTS", "--subset", "3"], "a subset of 3 cannot be drawn from its 2 prompts (give 1 to 2)"),
    (["--prompts", "PROMPTS", "--subset", "0"], "a subset of 0 cannot be drawn"),
    (["--prompts", "PROMPTS", "--format", "coco"], "is not JSON"),
    (["--prompts", "NOTCOCO"], 'is not a COCO caption file: it has no "annotations" list'),
    (["--prompts", "NOPROMPT"], "is not a PartiPrompts table: its header has no Prompt column"),
])
def test_prompt_file_mistakes_get_one_line_and_exit_2(tiny_t2i_pipeline_dir, tiny_pipeline_dir, tmp_path, args,
                                                      message, capsys):
    (tmp_path / "empty.txt").write_text("\n  \n")
    (tmp_path / "prompts.txt").write_text("a red star\na blue ring\n")
    (tmp_path / "instances.json").write_text('{"images": []}')
    (tmp_path / "table.tsv").write_text("text\tlabel\na red star\tstar\n")
    paths = {"EMPTY": tmp_path / "empty.txt", "MISSING": tmp_path / "missing.txt",
             "NOTCOCO": tmp_path / "instances.json", "NOPROMPT": tmp_path / "table.tsv",
             "PROMPTS": tmp_path / "prompts.txt", "CLASS": tiny_pipeline_dir}
    code, _, err = run(["--model", tiny_t2i_pipeline_dir, "--out", tmp_path / "run",
                        *(paths.get(a, a) for a in args)], capsys)
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert not list(tmp_path.glob("run/*.png"))


@pytest.mark.parametrize("args, message", [
    (["--prompts", "a.txt", "--prompt-file", "a.txt"], "argument --prompt-file: not allowed with argument --prompts"),
    (["--prompts", "a.txt", "--format", "csv"], "argument --format: invalid choice: 'csv'"),
])
def test_two_prompt_files_or_an_unknown_format_are_refused_by_the_parser(tmp_path, args, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["sample-many", "--model", "shapes-t2i", "--out", str(tmp_path / "run"), *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and message in err, err
