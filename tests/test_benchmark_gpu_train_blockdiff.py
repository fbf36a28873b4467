"""benchmarks/gpu_train_blockdiff.sh, dry-run on the CPU: it continues the shipped streaming teacher on 16-frame
clips, distils the new teacher into a student, packages both as streaming pipelines of 16 trained frames, splits
the result into parts small enough to come back from a device, and measures each model's streams."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from vgen import pipelines
from vgen.training.trainer import latest_checkpoint

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu_train_blockdiff.sh"


@pytest.mark.slow
def test_dry_run_trains_teacher_then_student_on_long_clips_packages_and_measures(tmp_path,
                                                                                  unpack_device_result) -> None:
    run = tmp_path / "run"
    settings = dict(OUT=str(tmp_path / "out"), RUN=str(run), DATA=str(tmp_path / "data"), DEVICE="cpu",
                    PRECISION="fp32", NUM_CLIPS="2", STEPS="1", BATCH="2", WARMUP="1", PROBE_S="1", NUM_EVAL="2",
                    EVAL_FRAMES="4", QUALITY_BATCH="2")
    out = subprocess.run(["bash", str(SCRIPT)], env={**os.environ, **settings}, capture_output=True, text=True,
                         timeout=1200)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    for model in ("teacher", "student"):
        assert json.loads((latest_checkpoint(run / model) / "state.json").read_text())["step"] == 1
    first = json.loads((run / "teacher" / "log.jsonl").read_text().splitlines()[0])
    assert first["init_from"].endswith("vgen/assets/shapes-blockdiff-cfg/blockdiff")  # the shipped teacher
    out_dir = tmp_path / "out"
    names = sorted(f.name for f in out_dir.iterdir())
    assert names[-3:] == ["result.tar.sha256", "summary.txt", "train.log"] and len(names) <= 8
    result = unpack_device_result(out_dir, tmp_path / "result")
    for model, name, cfg in (("teacher", "shapes-blockdiff-cfg", 5.0), ("student", "shapes-blockdiff", 1.0)):
        pipe = pipelines.load(str(result / model))
        assert pipe.info.name == name and pipe.model.config.train_frames == 16
        assert pipe.info.defaults["cfg_scale"] == cfg and pipe.info.defaults["window_frames"] == 4
        quality = json.loads((result / f"{model}_quality.json").read_text())
        assert quality["num_clips"] == 2 and quality["num_frames"] == 4 and 0 <= quality["class_accuracy"] <= 1
    summary = (out_dir / "summary.txt").read_text()
    assert summary.startswith("teacher, last logged step: ") and "student {'class_accuracy'" in summary
