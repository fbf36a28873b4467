"""benchmarks/gpu_train_continuous.sh, dry-run on the CPU: it continues training the shipped continuous target,
packages it with the shipped tokenizer and draft, splits the result into parts small enough to come back from a
device, and measures class accuracy."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from vgen import pipelines
from vgen.training.trainer import latest_checkpoint

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu_train_continuous.sh"


@pytest.mark.slow
def test_dry_run_continues_the_shipped_target_packages_and_measures(tmp_path, unpack_device_result) -> None:
    settings = dict(OUT=str(tmp_path / "out"), RUN=str(tmp_path / "run"), DATA=str(tmp_path / "data"), DEVICE="cpu",
                    PRECISION="fp32", NUM_IMAGES="8", STEPS="1", BATCH="4", WARMUP="1", NUM_EVAL="2",
                    QUALITY_BATCH="2")
    out = subprocess.run(["bash", str(SCRIPT)], env={**os.environ, **settings}, capture_output=True, text=True,
                         timeout=1200)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    state = json.loads((latest_checkpoint(tmp_path / "run") / "state.json").read_text())
    assert state["step"] == 1 and state["recipe"]["batch_size"] == 4
    assert state["recipe"]["class_repeats"] == {"square": 3, "triangle": 3, "heart": 2}
    first = json.loads((tmp_path / "run" / "log.jsonl").read_text().splitlines()[0])
    assert first["init_from"].endswith("vgen/assets/shapes-c2i-continuous/gpt")  # the shipped target, not a new one
    out_dir = tmp_path / "out"
    names = sorted(f.name for f in out_dir.iterdir())
    assert names[-3:] == ["result.tar.sha256", "summary.txt", "train.log"] and len(names) <= 8
    result = unpack_device_result(out_dir, tmp_path / "result")
    pipe = pipelines.load(str(result / "pipe"))
    assert pipe.info.name == "shapes-c2i-continuous" and pipe.draft_head is not None
    assert pipe.info.defaults == {"cfg_scale": 3.0, "temperature": 0.7}
    quality = json.loads((result / "quality.json").read_text())
    assert quality["num_images"] == 2 and 0 <= quality["class_accuracy"] <= 1
    summary = (out_dir / "summary.txt").read_text()
    assert summary.startswith("last logged step: ") and "quality {'class_accuracy'" in summary
