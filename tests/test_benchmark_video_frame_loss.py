"""benchmarks/video_frame_loss.py: run as a script on a saved model, it prints each frame's mean teacher-forced
loss over evenly spaced clips, each scored under its own class."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from vgen.hub import save_pretrained
from vgen.training.clip_codes import clip_classes

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "video_frame_loss.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


@torch.no_grad()
def test_per_frame_losses_match_the_model_clip_by_clip(tiny_nar_factory, tmp_path) -> None:
    model = tiny_nar_factory((3, 2, 2), image_first=True, num_classes=8)
    save_pretrained(model, tmp_path / "gpt")
    codes = np.random.default_rng(0).integers(0, model.vocab_size, (12, model.num_tokens)).astype(np.int16)
    np.save(tmp_path / "codes.npy", codes)
    out = run("--gpt", str(tmp_path / "gpt"), "--codes", str(tmp_path / "codes.npy"), "--count", "4",
              "--batch-size", "3")
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    expected = torch.zeros(3)
    for index in (0, 3, 6, 9):  # every 12 // 4-th clip
        x = torch.as_tensor(codes[index:index + 1].astype(np.int64))
        logits = model(torch.as_tensor(clip_classes(np.array([index]))), x)
        expected += F.cross_entropy(logits[0], x[0], reduction="none").view(3, 4).mean(1) / 4
    assert result["clips"] == 4
    np.testing.assert_allclose(result["per_frame"], expected.numpy(), atol=1e-3)
    assert abs(result["mean"] - expected.mean().item()) < 1e-3
    assert all(abs(v - math.log(model.vocab_size)) > 0.05 for v in result["per_frame"])  # not uniform guesses


def test_a_count_beyond_the_codes_is_refused(tiny_nar_factory, tmp_path) -> None:
    save_pretrained(tiny_nar_factory((2, 2, 2)), tmp_path / "gpt")
    np.save(tmp_path / "codes.npy", np.zeros((3, 8), dtype=np.int16))
    out = run("--gpt", str(tmp_path / "gpt"), "--codes", str(tmp_path / "codes.npy"), "--count", "4")
    assert out.returncode != 0 and "--count must be in 1..3" in out.stderr
