"""benchmarks/gpu_train_t2i.sh, dry-run on the CPU: it trains the scene judge and the text-to-image model from the
shapes model's weights, packages the model with the judge beside it, splits the result into parts small enough to
come back from a device, and measures prompt faithfulness with the judge it trained."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from vgen import pipelines
from vgen.models.word_encoder import WordTextEncoder
from vgen.training.trainer import latest_checkpoint

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu_train_t2i.sh"


@pytest.mark.slow
def test_dry_run_trains_the_judge_and_the_model_packages_and_measures(tmp_path, unpack_device_result) -> None:
    settings = dict(OUT=str(tmp_path / "out"), RUN=str(tmp_path / "run"), JUDGE_RUN=str(tmp_path / "judge"),
                    DATA=str(tmp_path / "data"), DEVICE="cpu", PRECISION="fp32", NUM_IMAGES="8", JUDGE_IMAGES="8",
                    JUDGE_VAL="8", JUDGE_STEPS="1", JUDGE_BATCH="4", STEPS="1", BATCH="4", WARMUP="1", EVAL_EVERY="1",
                    NUM_EVAL="2", QUALITY_BATCH="2")
    out = subprocess.run(["bash", str(SCRIPT)], env={**os.environ, **settings}, capture_output=True, text=True,
                         timeout=1200)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    state = json.loads((latest_checkpoint(tmp_path / "run") / "state.json").read_text())
    assert state["step"] == 1 and state["recipe"]["batch_size"] == 4
    out_dir = tmp_path / "out"
    names = sorted(f.name for f in out_dir.iterdir())
    assert names[-3:] == ["result.tar.sha256", "summary.txt", "train.log"] and len(names) <= 8
    result = unpack_device_result(out_dir, tmp_path / "result")
    pipe = pipelines.load(str(result / "pipe"))
    assert isinstance(pipe.text_encoder, WordTextEncoder) and pipe.info.example_prompts
    quality = json.loads((result / "quality.json").read_text())
    assert quality["num_images"] == 2 and set(quality["attribute_accuracy"]) >= {"shape", "colour", "joint"}
    summary = (out_dir / "summary.txt").read_text()
    assert summary.startswith("scene judge (held out): ") and "quality {'attribute_accuracy'" in summary
    assert "probe_mean_entropy_nats" in (result / "t2i_log.jsonl").read_text()
