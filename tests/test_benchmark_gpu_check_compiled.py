"""benchmarks/gpu_check.sh's compiled step, dry-run on the CPU: both compiled_speed runs (the embedded default's
place and GPT-B's, here a tiny random model) leave their table, JSON and plot in their own folder."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu_check.sh"
DRY_RUN = "--gpt-model tiny --tokens 16 --device cpu --dtype fp32 --batch-sizes 1 --repeats 1 --samplers mcsjd"


@pytest.mark.slow
def test_the_compiled_step_returns_a_table_per_model(tmp_path) -> None:
    settings = dict(OUT=str(tmp_path / "out"), PYTHON=sys.executable, COMPILED_ARGS=DRY_RUN)
    out = subprocess.run(["bash", str(SCRIPT), "compiled"], env={**os.environ, **settings}, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for folder in ("compiled_default", "compiled_gptb"):
        files = sorted(f.name for f in (tmp_path / "out" / folder).iterdir())
        assert files == ["compiled_speed.json", "compiled_speed.md", "compiled_speed.png"]
        result = json.loads((tmp_path / "out" / folder / "compiled_speed.json").read_text())
        assert list(result["results"][0]["rows"]) == ["ar", "ar, compiled", "mcsjd", "mcsjd, compiled"]
        assert result["setup"]["compile"] == "default"  # CUDA graphs only on CUDA
    summary = (tmp_path / "out" / "summary.log").read_text().splitlines()
    assert [line.split()[:2] for line in summary[1:]] == [["compiled", "ok"], ["compiled", "ok"]]
