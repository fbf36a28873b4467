"""benchmarks/gpu_train_t2v.sh, dry-run on the CPU: it fine-tunes the KL tokenizer on moving scenes, trains the
text teacher from the shipped class teacher, distils it into a student, packages both as prompt-conditioned
streaming pipelines with their text encoder and the tuned tokenizer, and splits the result into parts small enough
to come back from a device."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from vgen import pipelines
from vgen.training.trainer import latest_checkpoint

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu_train_t2v.sh"


@pytest.mark.slow
def test_dry_run_tunes_the_tokenizer_trains_teacher_then_student_and_packages_them(tmp_path,
                                                                                   unpack_device_result) -> None:
    run = tmp_path / "run"
    settings = dict(OUT=str(tmp_path / "out"), RUN=str(run), DATA=str(tmp_path / "data"), DEVICE="cpu",
                    PRECISION="fp32", KL_CLIPS="2", KL_STEPS="1", KL_BATCH="4", NUM_CLIPS="2", STEPS="1",
                    BATCH="2", WARMUP="1", PROBE_S="1")
    out = subprocess.run(["bash", str(SCRIPT)], env={**os.environ, **settings}, capture_output=True, text=True,
                         timeout=1200)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    for model in ("kl", "teacher", "student"):
        assert json.loads((latest_checkpoint(run / model) / "state.json").read_text())["step"] == 1
    first = json.loads((run / "teacher" / "log.jsonl").read_text().splitlines()[0])
    assert first["init_from"].endswith("vgen/assets/shapes-blockdiff-cfg")  # the shipped class teacher
    out_dir = tmp_path / "out"
    names = sorted(f.name for f in out_dir.iterdir())
    assert names[-3:] == ["result.tar.sha256", "summary.txt", "train.log"] and len(names) <= 8
    result = unpack_device_result(out_dir, tmp_path / "result")
    for model, name, cfg in (("teacher", "shapes-t2v-stream-cfg", 3.0), ("student", "shapes-t2v-stream", 1.0)):
        pipe = pipelines.load(str(result / model))
        assert pipe.info.name == name and pipe.is_text and pipe.example_prompts
        assert pipe.info.defaults["cfg_scale"] == cfg and pipe.info.defaults["window_frames"] == 4
        assert (result / model / "kl").is_dir() and (result / model / "text_encoder").is_dir()
    summary = (out_dir / "summary.txt").read_text().splitlines()
    assert [line.split(",")[0] for line in summary] == ["kl", "teacher", "student"]
