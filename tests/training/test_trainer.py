"""The shared training loop: a run stopped and resumed ends exactly where an uninterrupted run ends."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from vgen.training.trainer import TrainConfig, Trainer, every, index_batches


def _run(run_dir, steps_per_call: list[int], total: int, log_every: int = 2) -> Trainer:
    data_x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    data_y = data_x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
    cfg = TrainConfig(steps=total, lr=0.05, warmup_steps=2, ema_decay=0.9, bf16=False, log_every=log_every)
    trainer = None
    for stop_at in steps_per_call:
        torch.manual_seed(123)  # a fresh process: model init is overwritten by the resume
        model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.2), nn.Linear(8, 1))
        trainer = Trainer(model, cfg, run_dir)

        def step_fn(idx, model=model):
            pred = model(data_x[idx]).squeeze(-1)
            return nn.functional.mse_loss(pred, data_y[idx]), {}

        trainer.fit(index_batches(64, 8, cfg.seed, trainer.step), step_fn, stop_at=stop_at)
    return trainer


def test_resumed_run_equals_uninterrupted_run(tmp_path):
    straight = _run(tmp_path / "a", [10], 10)
    resumed = _run(tmp_path / "b", [4, 7, 10], 10)
    assert resumed.step == straight.step == 10
    for a, b in zip(straight.model.state_dict().values(), resumed.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b in zip(straight.ema.model.state_dict().values(), resumed.ema.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    log = [json.loads(line) for line in (tmp_path / "b" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [2, 4, 6, 8, 10]


def test_learning_rate_warms_up_then_decays_to_the_floor(tmp_path):
    cfg = TrainConfig(steps=100, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    t = Trainer(nn.Linear(2, 2), cfg, tmp_path)
    assert t.lr_at(0) == pytest.approx(0.1)
    assert t.lr_at(9) == pytest.approx(1.0)
    assert t.lr_at(10) == pytest.approx(1.0)
    assert t.lr_at(100) == pytest.approx(0.1)
    assert all(t.lr_at(s) >= t.lr_at(s + 1) for s in range(10, 100))


def test_index_batches_cover_each_epoch_once_and_resume_mid_epoch():
    full = index_batches(20, 5, seed=3)
    first_epoch = torch.cat([next(full) for _ in range(4)])
    assert sorted(first_epoch.tolist()) == list(range(20))
    later = [next(full) for _ in range(3)]
    resumed = index_batches(20, 5, seed=3, start_step=4)
    for batch in later:
        assert torch.equal(batch, next(resumed))
    with pytest.raises(ValueError, match="at least batch_size"):
        next(index_batches(3, 5, seed=0))


def test_sigint_stops_after_the_current_step_and_saves(tmp_path):
    """Ctrl-C (or SIGTERM) mid-run finishes the step in flight, checkpoints, and a rerun resumes from there."""
    import os
    import signal

    model = nn.Linear(2, 1)
    trainer = Trainer(model, TrainConfig(steps=100, bf16=False, log_every=1000), tmp_path)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)  # ignored in a background job

    def step_fn(idx):
        if trainer.step == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return model(torch.ones(2, 2)).pow(2).mean(), {}

    trainer.fit(index_batches(8, 2, 0), step_fn)
    assert trainer.step == 4
    assert json.loads((tmp_path / "state.json").read_text())["step"] == 4
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before  # handlers restored


def test_the_first_log_after_a_mid_window_resume_averages_only_the_steps_it_ran(tmp_path):
    """log_every 2, stopped at step 3: the step-4 entry after the resume is the loss of step 4 alone."""
    _run(tmp_path / "resumed", [3, 6], 6)
    _run(tmp_path / "every", [6], 6, log_every=1)
    logs = {name: [json.loads(line) for line in (tmp_path / name / "log.jsonl").read_text().splitlines()]
            for name in ("resumed", "every")}
    resumed, every = ({r["step"]: r for r in rows} for rows in logs.values())
    assert resumed[4]["loss"] == pytest.approx(every[4]["loss"], rel=1e-6)
    assert resumed[6]["loss"] == pytest.approx((every[5]["loss"] + every[6]["loss"]) / 2, rel=1e-6)


def test_every_runs_the_evaluation_on_the_ema_model_at_multiples_of_its_interval_and_logs_it(tmp_path):
    seen = []

    def evaluate(model):
        seen.append(model)
        return {"probe": float(len(seen))}

    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    trainer = Trainer(model, TrainConfig(steps=7, lr=0.01, warmup_steps=1, bf16=False, log_every=10), tmp_path)
    x = torch.randn(16, 4)
    trainer.fit(index_batches(16, 4, 0), lambda idx: (model(x[idx]).square().mean(), {}), on_step=every(evaluate, 3))
    assert len(seen) == 2 and all(m is trainer.ema.model for m in seen)  # after steps 3 and 6
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [(r["step"], r["probe"]) for r in log if "probe" in r] == [(3, 1.0), (6, 2.0)]
    assert every(None, 3) is None
    with pytest.raises(ValueError, match="evaluation interval must be >= 1 step, got 0"):
        every(evaluate, 0)


@pytest.mark.parametrize("native", [True, False])
def test_auto_precision_takes_bf16_only_on_a_cpu_with_native_bf16_matmuls(monkeypatch, native):
    from vgen.training import trainer as trainer_module

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: native)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    assert trainer_module.native_bf16_cpu() is native
    assert trainer_module.use_bf16("auto") is native
    assert trainer_module.use_bf16("bf16") is True
    assert trainer_module.use_bf16("fp32") is False
    with pytest.raises(ValueError, match="precision must be"):
        trainer_module.use_bf16("fp16")
