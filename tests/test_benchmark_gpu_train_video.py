"""benchmarks/gpu_train_video.sh, dry-run on the CPU: from carried clip codes it trains the shipped video NAR model
(or the NBP model, on the carried clips' 16 frames), packages it with its weights split into parts small enough to
come back from a device, and measures it at each sampling asked for; without the carried files it stops before doing
anything."""

import json
import os
import subprocess
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from vgen import pipelines
from vgen.data.clips import SHAPES_CLIPS_64, SHAPES_CLIPS_64_LONG, ClipsConfig
from vgen.training.trainer import latest_checkpoint

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu_train_video.sh"


def run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    settings = dict(OUT=str(tmp_path / "out"), RUN=str(tmp_path / "run"), CARRY=str(tmp_path / "carry"),
                    DEVICE="cpu", PRECISION="fp32", STEPS="1", BATCH="2", WARMUP="1", TRAIN_MIN="3", NUM_CLIPS="2",
                    QUALITY_BATCH="2", SAMPLINGS="0.7:40 1.0:0")
    return subprocess.run(["bash", str(SCRIPT)], env={**os.environ, **settings, **env}, capture_output=True,
                          text=True, timeout=900)


def carry(tmp_path: Path, clips: int = 4, geometry: ClipsConfig = SHAPES_CLIPS_64) -> None:
    folder = tmp_path / "carry"
    folder.mkdir()
    (folder / "clips.json").write_text(json.dumps(asdict(geometry)))
    codes = np.random.default_rng(0).integers(0, 4096, (clips, geometry.num_frames * 16 * 16)).astype(np.int16)
    np.save(folder / f"train_clip_codes_{clips}.npy", codes)


@pytest.mark.slow
def test_dry_run_trains_packages_splits_and_measures(tmp_path, unpack_device_result) -> None:
    carry(tmp_path)
    out = run(tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    state = json.loads((latest_checkpoint(tmp_path / "run") / "state.json").read_text())
    assert state["step"] == 1 and state["train_config"]["device"] == "cpu"
    out_dir = tmp_path / "out"
    assert sorted(f.name for f in out_dir.iterdir()) == [  # the device returns at most 8 files of 16 MiB
        "result.tar.part-00", "result.tar.part-01", "result.tar.sha256", "summary.txt", "train.log"]
    result = unpack_device_result(out_dir, tmp_path / "result")
    pipe = pipelines.load(str(result / "pipe"))
    assert pipe.model.config.image_first and pipe.model.num_steps == 68
    defaults = json.loads((result / "pipe" / "pipeline.json").read_text())["defaults"]
    assert defaults == {"cfg_scale": 3.0, "temperature": 0.7, "top_k": 40}  # the first sampling measured
    summary = (out_dir / "summary.txt").read_text()
    for t, k in (("0.7", "40"), ("1.0", "0")):
        quality = json.loads((result / f"quality_t{t}_k{k}.json").read_text())
        assert quality["num_clips"] == 2
        assert (quality["sampling"]["temperature"], quality["sampling"]["top_k"]) == (float(t), int(k))
        assert (result / f"grid_t{t}_k{k}.png").stat().st_size > 0
        assert f"quality_t{t}_k{k} {{'class_accuracy'" in summary


@pytest.mark.slow
def test_nbp_on_carried_16_frame_codes_trains_a_16_frame_model_from_the_shipped_8_frame_one(
        tmp_path, unpack_device_result) -> None:
    carry(tmp_path, clips=2, geometry=SHAPES_CLIPS_64_LONG)
    out = run(tmp_path, KIND="nbp", NUM_CLIPS="1", QUALITY_BATCH="1", SAMPLINGS="1.0:0")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    result = unpack_device_result(tmp_path / "out", tmp_path / "result")
    pipe = pipelines.load(str(result / "pipe"))
    assert pipe.model.grid == (16, 16, 16) and pipe.model.num_steps == 256 + 15 * 16
    quality = json.loads((result / "quality_t1.0_k0.json").read_text())
    assert quality["num_clips"] == 1 and quality["num_frames"] == 16
    assert "quality_t1.0_k0 {'class_accuracy'" in (tmp_path / "out" / "summary.txt").read_text()


@pytest.mark.slow
def test_a_failed_measurement_still_returns_the_packaged_weights(tmp_path, unpack_device_result) -> None:
    carry(tmp_path)
    out = run(tmp_path, QUALITY_BATCH="0", SAMPLINGS="0.7:40")  # vgen quality refuses a batch of 0
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert summary.startswith("quality_t0.7_k40 failed:") and "--batch-size must be >= 1" in summary
    result = unpack_device_result(tmp_path / "out", tmp_path / "result")
    assert (result / "pipe" / "gpt" / "model.safetensors").is_file()


def test_missing_carried_files_stop_it_before_training(tmp_path) -> None:
    out = run(tmp_path)
    assert out.returncode == 2 and "needs clips.json and one train_clip_codes_<N>.npy, found 0" in out.stderr
    assert not (tmp_path / "run").exists()


def test_two_codes_files_are_refused_rather_than_one_picked(tmp_path) -> None:
    carry(tmp_path)
    np.save(tmp_path / "carry" / "train_clip_codes_2.npy", np.zeros((2, 2048), dtype=np.int16))
    out = run(tmp_path)
    assert out.returncode == 2 and "found 2 codes files" in out.stderr
    assert not (tmp_path / "run").exists()


def test_an_unknown_layout_or_kind_is_refused(tmp_path) -> None:
    carry(tmp_path)
    out = run(tmp_path, LAYOUT="raster")
    assert out.returncode == 2 and "LAYOUT must be image-first or 3d, got raster" in out.stderr
    out = run(tmp_path, KIND="mar")
    assert out.returncode == 2 and "KIND must be nar or nbp, got mar" in out.stderr
    assert not (tmp_path / "run").exists()
