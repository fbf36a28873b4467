"""benchmarks/kernel_speed.py without a GPU: it runs every kernel in Triton's interpreter, prints each one's agreement
with its reference and says that speed needs a GPU. Runs in a subprocess, as the script is run."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="the kernel tests need triton (pip install -e '.[triton]')")

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "kernel_speed.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the script times the kernels instead")
def test_the_benchmark_checks_every_kernel_in_the_interpreter() -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "--vocab", "100", "--window", "4", "--batch", "2",
                          "--lantern-k", "8"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith(("target_probs", "accept_drafts",
                                                                                 "recover"))]
    assert [row[0] for row in rows] == ["target_probs"] * 3 + ["accept_drafts", "accept_drafts", "recover"] * 3
    assert all("True" in row for row in rows)
    assert "speed-ups need a GPU" in out.stdout
