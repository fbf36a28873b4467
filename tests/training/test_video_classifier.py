"""The video feature network's recipe at toy scale: the corruptions, a run that lowers its loss, exact resume."""

from __future__ import annotations

import json

import numpy as np
import torch

from vgen.data.clips import ClipsConfig
from vgen.hub import from_pretrained
from vgen.models.classifier import ShapesVideoClassifier, VideoClassifierConfig
from vgen.training.trainer import TrainConfig, latest_checkpoint
from vgen.training.video_classifier import CORRUPTIONS, VideoClassifierRecipe, corrupt, train_video_classifier

TOY = VideoClassifierConfig(stages=((8,), (16,)), image_size=16, num_frames=4)
CLIPS = ClipsConfig(num_frames=4, frame_size=16)
RECIPE = VideoClassifierRecipe(num_clips=16, batch_size=8, num_val=8)


def test_corruptions_keep_the_frames_and_break_their_order() -> None:
    clips = torch.arange(2 * 8, dtype=torch.float32).reshape(2, 1, 8, 1, 1).expand(2, 3, 8, 2, 2)
    for name, fn in CORRUPTIONS.items():
        out = fn(clips, torch.Generator().manual_seed(0))
        frames = out[:, 0, :, 0, 0]
        assert out.shape == clips.shape and not torch.equal(out, clips), name
        assert set(frames[0].tolist()) <= set(range(8)), name  # every frame comes from its own clip
    assert sorted(CORRUPTIONS["shuffled"](clips)[0, 0, :, 0, 0].tolist()) == list(range(8))
    assert CORRUPTIONS["frozen"](clips)[0, 0, :, 0, 0].unique().numel() == 1
    stutter = CORRUPTIONS["stuttering"](clips)[0, 0, :, 0, 0]
    assert torch.equal(stutter[0::2], stutter[1::2]) or torch.equal(stutter[1:-1:2], stutter[2::2])
    mixed = corrupt(clips.repeat(3, 1, 1, 1, 1))
    assert mixed[1, 0, :, 0, 0].unique().numel() == 1  # the second clip is frozen (corruptions dealt in turn)


def test_toy_run_lowers_its_loss_resumes_exactly_and_reports_figures(tmp_path) -> None:
    torch.manual_seed(0)
    cfg = TrainConfig(steps=80, lr=1e-2, warmup_steps=1, bf16=False, log_every=1, ema_decay=0.5)
    figures = train_video_classifier(tmp_path / "run", tmp_path / "clips", cfg, RECIPE, TOY, CLIPS)
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in log if "loss" in r]
    assert len(losses) == 80 and np.mean(losses[-10:]) < 0.8 * np.mean(losses[:10])
    assert figures["steps"] == 80 and 0 <= figures["class_accuracy"] <= 1
    assert {f"real_accuracy_on_{name}" for name in CORRUPTIONS} < set(figures)

    short = TrainConfig(steps=6, lr=1e-2, warmup_steps=1, bf16=False)
    torch.manual_seed(1)
    train_video_classifier(tmp_path / "a", tmp_path / "clips", short, RECIPE, TOY, CLIPS)
    torch.manual_seed(1)  # the same initial weights
    train_video_classifier(tmp_path / "b", tmp_path / "clips", short, RECIPE, TOY, CLIPS, max_minutes=0)  # 1 step
    assert json.loads((latest_checkpoint(tmp_path / "b") / "state.json").read_text())["step"] == 1
    train_video_classifier(tmp_path / "b", tmp_path / "clips", short, RECIPE, TOY, CLIPS)  # resumes to step 6
    a, b = from_pretrained(tmp_path / "a" / "export"), from_pretrained(tmp_path / "b" / "export")
    assert isinstance(a, ShapesVideoClassifier) and a.config == TOY
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(x, y, msg=name)
