"""Every kernel variant the samplers launch compiles for sm_90 (the interpreter runs the Python, not the
compiler). Compiling needs no GPU: triton ships ptxas. Runs in a subprocess, away from the interpreter mode."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton", reason="the kernel tests need triton (pip install -e '.[triton]')")


@pytest.mark.slow
def test_every_launched_variant_compiles_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "vgen.kernels.aot"], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    kernels = [line.split()[0] for line in lines]
    # 3 logits settings; 5 rules x (1 acceptance + 2 residual: sampled, greedy)
    assert (kernels.count("probs_kernel"), kernels.count("accept_kernel"), kernels.count("residual_kernel")) == \
        (3, 5, 10)
    assert all(int(line.split("registers")[1].split()[0]) > 0 for line in lines)  # ptxas reported on each
