"""Block-diffusion training: the diffusion-forcing loss ignores clean blocks and is the velocity error on the
others; augmentation keeps clips valid; a tiny run lowers the loss, resumes and exports a loadable model."""

from __future__ import annotations

import json

import pytest
import torch

from vgen.data.clips import ClipsConfig
from vgen.hub import from_pretrained
from vgen.models.blockdiff import BlockDiffConfig, BlockDiffusionTransformer
from vgen.training.blockdiff import BlockDiffRecipe, augment, diffusion_forcing_loss, train_blockdiff
from vgen.training.trainer import TrainConfig

TOY = BlockDiffConfig(frame_size=16, patch_size=4, frames_per_block=2, train_frames=4, dim=32, n_layer=1, n_head=2)


def test_clean_blocks_carry_no_loss_and_noisy_ones_the_velocity_error(monkeypatch) -> None:
    model = BlockDiffusionTransformer(TOY)  # adaLN-Zero init: the prediction is exactly 0
    frames = torch.rand(3, 4, 16, 16, 3) * 2 - 1
    torch.manual_seed(0)
    loss_all_clean, metrics = diffusion_forcing_loss(model, frames, torch.tensor([0, 1, 2]), clean_prob=1.0)
    assert loss_all_clean.item() == 0.0 and metrics["noisy_frac"] == 0.0
    torch.manual_seed(0)
    loss, metrics = diffusion_forcing_loss(model, frames, torch.tensor([0, 1, 2]), clean_prob=0.0)
    torch.manual_seed(0)
    torch.rand(3, 2), torch.rand(3, 2)  # the draws of sigma and of the clean mask
    noise = torch.randn_like(frames)
    assert metrics["noisy_frac"] == 1.0
    assert loss.item() == pytest.approx((noise - frames).pow(2).mean().item(), rel=1e-5)  # |v - 0|^2


def test_augment_flips_space_and_time_and_keeps_every_clip_intact() -> None:
    torch.manual_seed(0)
    clips = torch.rand(64, 4, 16, 16, 3)
    out = augment(clips)
    for a, b in zip(clips, out):
        assert any(torch.equal(b, c) for c in (a, a.flip(2), a.flip(0), a.flip(0).flip(2)))
    changed = sum(not torch.equal(a, b) for a, b in zip(clips, out))
    assert 32 < changed < 64  # about three quarters are flipped one way or the other


@pytest.mark.slow
def test_a_tiny_run_lowers_the_loss_resumes_and_exports(tmp_path) -> None:
    run, data = tmp_path / "run", tmp_path / "data"
    clips = ClipsConfig(num_frames=4, frame_size=16, supersample=1, min_scale=0.35, max_scale=0.5)
    recipe = BlockDiffRecipe(num_clips=16, batch_size=8)
    train = TrainConfig(steps=120, lr=3e-3, warmup_steps=5, log_every=10, bf16=False)
    train_blockdiff(run, data, train, recipe, TOY, clips, max_minutes=None)
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if "loss" in line]
    assert log[-1]["loss"] < 0.8 * log[0]["loss"]
    model = from_pretrained(run / "export")
    assert isinstance(model, BlockDiffusionTransformer) and model.config == TOY
    longer = TrainConfig(steps=125, lr=3e-3, warmup_steps=5, log_every=10, bf16=False)
    train_blockdiff(run, data, longer, recipe, TOY, clips)
    assert json.loads((run / "state.json").read_text())["step"] == 125
    with pytest.raises(ValueError, match="do not fit"):
        train_blockdiff(tmp_path / "r2", data, train, recipe, TOY, ClipsConfig(num_frames=4, frame_size=32))
