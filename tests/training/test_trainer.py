"""The shared training loop: a run stopped and resumed ends exactly where an uninterrupted run ends; a checkpoint is
one unit, a resume takes only the settings and the data it was made with, and the log holds each step once."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from vgen.data.shapes import ShapesConfig
from vgen.hub import CheckpointError
from vgen.training import trainer as trainer_module
from vgen.training.trainer import (
    TrainConfig,
    Trainer,
    TrainingData,
    class_repeat_counts,
    every,
    fingerprint,
    index_batches,
    latest_checkpoint,
    repeated_items,
    steps_reachable,
)

DATA_X = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
DATA_Y = DATA_X @ torch.tensor([1.0, -2.0, 0.5, 3.0])
CFG = TrainConfig(steps=10, lr=0.05, warmup_steps=2, ema_decay=0.9, bf16=False, log_every=2)
DATA = TrainingData.of("data", ShapesConfig(), DATA_X, DATA_Y)


@dataclass(frozen=True)
class ToyConfig:
    width: int = 8

    def to_dict(self) -> dict:
        return asdict(self)


class Toy(nn.Sequential):
    """A regression MLP with a config, as the recipes' models have."""

    def __init__(self, config: ToyConfig = ToyConfig()) -> None:
        super().__init__(nn.Linear(4, config.width), nn.Dropout(0.2), nn.Linear(config.width, 1))
        self.config = config


@dataclass(frozen=True)
class ToyRecipe:
    batch_size: int = 8
    eval_every: int = 5


def _trainer(run_dir, cfg: TrainConfig = CFG, recipe: ToyRecipe = ToyRecipe(),
             config: ToyConfig = ToyConfig(), data: TrainingData | None = DATA) -> Trainer:
    """A Trainer as a fresh process builds it: the model's initialisation is overwritten by a resume."""
    torch.manual_seed(123)
    return Trainer(Toy(config), cfg, run_dir, recipe, data)


def _fit(trainer: Trainer, stop_at: int | None = None) -> Trainer:
    def step_fn(idx):
        pred = trainer.model(DATA_X[idx]).squeeze(-1)
        return nn.functional.mse_loss(pred, DATA_Y[idx]), {}

    batch_size = trainer.settings["recipe"]["batch_size"]
    trainer.fit(index_batches(64, batch_size, trainer.cfg.seed, trainer.step), step_fn, stop_at=stop_at)
    return trainer


def _run(run_dir, steps_per_call: list[int], total: int, log_every: int = 2) -> Trainer:
    cfg = replace(CFG, steps=total, log_every=log_every)
    trainer = None
    for stop_at in steps_per_call:
        trainer = _fit(_trainer(run_dir, cfg), stop_at)
    return trainer


def _log_steps(run_dir) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "log.jsonl").read_text().splitlines()]


def _assert_same_state(a: Trainer, b: Trainer) -> None:
    """Weights, EMA weights and optimizer moments equal bit for bit."""
    for x, y in zip([*a.model.state_dict().values(), *a.ema.model.state_dict().values()],
                    [*b.model.state_dict().values(), *b.ema.model.state_dict().values()]):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    for x, y in zip(a.optimizer.state_dict()["state"].values(), b.optimizer.state_dict()["state"].values()):
        for key in x:
            torch.testing.assert_close(x[key], y[key], rtol=0, atol=0)


def test_resumed_run_equals_uninterrupted_run(tmp_path):
    straight = _run(tmp_path / "a", [10], 10)
    resumed = _run(tmp_path / "b", [4, 7, 10], 10)
    assert resumed.step == straight.step == 10
    _assert_same_state(straight, resumed)
    assert _log_steps(tmp_path / "b") == [2, 4, 6, 8, 10]


def test_a_checkpoint_is_one_step_folder_that_latest_names(tmp_path):
    _run(tmp_path, [4, 10], 10)
    folder = tmp_path / "checkpoints" / "step-00000010"
    assert (tmp_path / "latest").read_text() == "step-00000010\n"
    assert latest_checkpoint(tmp_path) == folder
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == [folder.name]  # step 4 removed
    assert sorted(p.name for p in folder.iterdir()) == ["ema.safetensors", "model.safetensors", "optimizer.pt",
                                                        "state.json"]
    state = json.loads((folder / "state.json").read_text())
    assert state["step"] == 10 and state["train_config"]["lr"] == 0.05
    assert state["recipe"] == {"batch_size": 8, "eval_every": 5} and state["model_config"] == {"width": 8}
    assert not list(tmp_path.glob("*.safetensors")) and not (tmp_path / "state.json").exists()
    assert latest_checkpoint(tmp_path / "new") is None


@pytest.mark.parametrize("crash_in", ["model.safetensors", "ema.safetensors", "optimizer.pt", "state.json",
                                      "latest.tmp"])
def test_a_crash_while_checkpointing_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch, crash_in):
    """Killed while writing any file of the step-8 checkpoint, the run resumes at step 4 with the weights, EMA and
    optimizer of step 4 (not step 8's weights beside step 4's optimizer), and ends as an uninterrupted run."""
    cfg = replace(CFG, checkpoint_every_steps=4)
    trainer = _trainer(tmp_path / "run", cfg)
    write = trainer_module._write_synced

    def crash(path, data):
        if trainer.step == 8 and path.name == crash_in:
            raise OSError("killed")
        write(path, data)

    monkeypatch.setattr(trainer_module, "_write_synced", crash)
    with pytest.raises(OSError, match="killed"):
        _fit(trainer)
    monkeypatch.undo()
    assert latest_checkpoint(tmp_path / "run").name == "step-00000004"

    resumed = _trainer(tmp_path / "run", cfg)
    assert resumed.step == 4
    _assert_same_state(resumed, _fit(_trainer(tmp_path / "ref", cfg), stop_at=4))
    _fit(resumed)
    _assert_same_state(resumed, _fit(_trainer(tmp_path / "straight", cfg)))
    assert [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()] == ["step-00000010"]  # no .partial left


@pytest.mark.parametrize("change, message", [
    (dict(cfg=replace(CFG, lr=0.1)), "lr 0.05 -> 0.1"),
    (dict(cfg=replace(CFG, steps=20)), "steps 10 -> 20"),
    (dict(recipe=ToyRecipe(batch_size=4)), "batch_size 8 -> 4"),
    (dict(config=ToyConfig(width=16)), "model.width 8 -> 16"),
])
def test_a_resume_refuses_other_settings_naming_each_difference(tmp_path, change, message):
    _fit(_trainer(tmp_path), stop_at=4)
    with pytest.raises(CheckpointError) as error:
        _trainer(tmp_path, **change)
    text = str(error.value)
    assert "\n" not in text and message in text and "--override-config" in text
    assert text.count("->") == 1  # only what differs


@pytest.mark.parametrize("data, message", [
    (TrainingData.of("data", ShapesConfig(background="smooth"), DATA_X, DATA_Y),
     "data.background textured -> smooth"),
    (TrainingData.of("data", ShapesConfig(), DATA_X[:32], DATA_Y[:32]),
     f"data.fingerprint {DATA.fingerprint} -> {fingerprint(DATA_X[:32], DATA_Y[:32])}"),
])
def test_a_resume_refuses_other_data_naming_its_settings_or_fingerprint(tmp_path, data, message):
    _fit(_trainer(tmp_path), stop_at=4)
    with pytest.raises(CheckpointError) as error:
        _trainer(tmp_path, data=data)
    text = str(error.value)
    assert "\n" not in text and message in text and "--override-config" in text
    assert text.count("->") == 1


def test_a_resume_on_the_same_data_in_another_folder_goes_on(tmp_path):
    """The folder is recorded, the data compared: a copy of the data, or a folder rendered alike, is the same data."""
    _fit(_trainer(tmp_path), stop_at=4)
    moved = TrainingData.of(tmp_path / "elsewhere", ShapesConfig(), DATA_X.clone(), DATA_Y.numpy())
    assert _trainer(tmp_path, data=moved).step == 4
    state = json.loads((latest_checkpoint(tmp_path) / "state.json").read_text())
    assert state["data"] == {**json.loads(json.dumps(asdict(ShapesConfig()))), "fingerprint": DATA.fingerprint}
    assert state["data_dir"] == str(Path("data").resolve())


def test_an_overridden_resume_on_other_data_goes_on_and_records_it(tmp_path):
    _fit(_trainer(tmp_path), stop_at=4)
    other = TrainingData.of(tmp_path / "smooth", ShapesConfig(background="smooth"), DATA_X, DATA_Y)
    _fit(_trainer(tmp_path, replace(CFG, override_config=True), data=other), stop_at=6)
    state = json.loads((latest_checkpoint(tmp_path) / "state.json").read_text())
    assert state["step"] == 6 and state["data"]["background"] == "smooth"
    assert state["data_dir"] == str(tmp_path / "smooth")
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert {"step": 4, "settings_changed": ["data.background textured -> smooth"]} in records


def test_a_run_recorded_without_its_data_resumes_and_then_records_them(tmp_path):
    _fit(_trainer(tmp_path, data=None), stop_at=4)
    assert json.loads((latest_checkpoint(tmp_path) / "state.json").read_text())["data"] is None
    _fit(_trainer(tmp_path), stop_at=6)
    assert json.loads((latest_checkpoint(tmp_path) / "state.json").read_text())["data"]["fingerprint"] == \
        DATA.fingerprint


def test_the_fingerprint_tells_values_dtypes_and_shapes_apart_wherever_the_array_lies(tmp_path):
    images = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    np.save(tmp_path / "images.npy", images)
    same = [images.copy(), torch.from_numpy(images), np.load(tmp_path / "images.npy", mmap_mode="r"),
            np.asfortranarray(images)]
    assert {fingerprint(a) for a in same} == {fingerprint(images)}
    changed = images.copy()
    changed[1, 2, 3] += 1
    others = [changed, images.astype(np.int16), images.reshape(3, 2, 4), images[:1]]
    assert len({fingerprint(a) for a in [images, *others]}) == 5
    assert fingerprint(images, images) != fingerprint(images) and len(fingerprint(images)) == 16


def test_a_run_recorded_before_an_option_existed_resumes_at_the_option_default(tmp_path):
    """A record without a setting ran with its default: the same value resumes, another is named as a change."""
    _fit(_trainer(tmp_path), stop_at=4)
    state_file = latest_checkpoint(tmp_path) / "state.json"
    state = json.loads(state_file.read_text())
    del state["recipe"]["batch_size"], state["train_config"]["grad_clip"], state["train_config"]["ema_decay"]
    state_file.write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match=r"other settings \(ema_decay 0.999 -> 0.9\)"):
        _trainer(tmp_path)  # the record's ema_decay is gone: its default, not the 0.9 the run had
    state["train_config"]["ema_decay"] = 0.9
    state_file.write_text(json.dumps(state))
    assert _trainer(tmp_path).step == 4
    with pytest.raises(CheckpointError, match=r"other settings \(batch_size 8 -> 4\)"):
        _trainer(tmp_path, recipe=ToyRecipe(batch_size=4))


def test_a_resume_takes_other_runtime_settings(tmp_path):
    """Where and how often it logs, checkpoints and evaluates, and the precision, may change on a resume."""
    _fit(_trainer(tmp_path), stop_at=4)
    cfg = replace(CFG, log_every=1, checkpoint_every_steps=2, checkpoint_every_minutes=0.5, bf16=True)
    assert _trainer(tmp_path, cfg, ToyRecipe(eval_every=1)).step == 4


def test_an_overridden_resume_goes_on_with_the_new_settings_and_logs_them(tmp_path):
    _fit(_trainer(tmp_path), stop_at=4)
    cfg = replace(CFG, lr=0.1, override_config=True)
    resumed = _trainer(tmp_path, cfg, ToyRecipe(batch_size=4))
    assert resumed.step == 4
    _fit(resumed)
    state = json.loads((latest_checkpoint(tmp_path) / "state.json").read_text())
    assert state["step"] == 10 and state["train_config"]["lr"] == 0.1 and state["recipe"]["batch_size"] == 4
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert {"step": 4, "settings_changed": ["lr 0.05 -> 0.1", "batch_size 8 -> 4"]} in records
    assert _trainer(tmp_path, replace(cfg, override_config=False), ToyRecipe(batch_size=4)).step == 10


def test_an_overridden_resume_of_another_model_shape_names_the_mismatch(tmp_path):
    _fit(_trainer(tmp_path), stop_at=4)
    with pytest.raises(CheckpointError, match=r"step-00000004/model.safetensors does not match Toy"):
        _trainer(tmp_path, replace(CFG, override_config=True), config=ToyConfig(width=16))


def test_the_log_holds_each_step_once_after_a_crash_and_a_resume(tmp_path):
    """Crashed at step 7 with a checkpoint at 4 and a half-written record: the resume drops records 5-7 and the
    torn line, and writes steps 5-10 once."""
    cfg = replace(CFG, log_every=1, checkpoint_every_steps=4)
    trainer = _trainer(tmp_path, cfg)

    def step_fn(idx):
        if trainer.step == 7:
            raise RuntimeError("crash")
        return nn.functional.mse_loss(trainer.model(DATA_X[idx]).squeeze(-1), DATA_Y[idx]), {}

    with pytest.raises(RuntimeError, match="crash"):
        trainer.fit(index_batches(64, 8, 0), step_fn)
    with open(tmp_path / "log.jsonl", "a") as f:
        f.write('{"step": 8, "lo')
    resumed = _trainer(tmp_path, cfg)
    assert _log_steps(tmp_path) == [1, 2, 3, 4]
    _fit(resumed)
    assert _log_steps(tmp_path) == list(range(1, 11))


def test_a_new_run_in_a_folder_without_a_checkpoint_starts_a_new_log(tmp_path):
    (tmp_path / "log.jsonl").write_text('{"step": 3, "loss": 1.0}\n')  # a run killed before its first checkpoint
    _fit(_trainer(tmp_path, replace(CFG, steps=2)))
    assert _log_steps(tmp_path) == [2]


@pytest.mark.parametrize("every_steps, every_minutes, saved", [
    (3, 0.0, [3, 6, 7]),  # every multiple of 3, and at the end
    (0, 1.0, [2, 4, 6, 7]),  # a clock at 40 s a step: a minute has passed every second step, and at the end
    (0, 0.0, [7]),  # only at the end
    (3, 1.0, [2, 3, 5, 6, 7]),  # whichever comes first: the clock restarts at each checkpoint
])
def test_checkpoints_come_every_n_steps_and_every_m_minutes(tmp_path, monkeypatch, every_steps, every_minutes,
                                                            saved):
    cfg = replace(CFG, steps=7, checkpoint_every_steps=every_steps, checkpoint_every_minutes=every_minutes)
    trainer = _trainer(tmp_path, cfg)
    monkeypatch.setattr(trainer_module.time, "time", lambda: 40.0 * trainer.step)
    steps = []
    save = trainer.save
    monkeypatch.setattr(trainer, "save", lambda: (steps.append(trainer.step), save()))
    _fit(trainer)
    assert steps == saved


@pytest.mark.parametrize("field, value, message", [
    ("checkpoint_every_steps", -1, "checkpoint_every_steps must be an integer >= 0 (0 = none by steps), got -1"),
    ("checkpoint_every_minutes", -0.5, "checkpoint_every_minutes must be >= 0 (0 = none by time), got -0.5"),
    ("checkpoint_every_minutes", float("nan"),
     "checkpoint_every_minutes must be a finite number >= 0 (0 = none by time), got nan"),
    ("checkpoint_every_minutes", float("inf"),
     "checkpoint_every_minutes must be a finite number >= 0 (0 = none by time), got inf"),
    ("steps", -5, "steps must be an integer >= 0 (0 = export the starting weights), got -5"),
    ("lr", 0.0, "lr must be > 0, got 0.0"),
    ("lr", float("nan"), "lr must be a finite number > 0, got nan"),
    ("warmup_steps", -1, "warmup_steps must be an integer >= 0, got -1"),
    ("ema_decay", 1.5, "ema_decay must be in [0, 1], got 1.5"),
    ("log_every", 0, "log_every must be an integer >= 1, got 0"),
    ("seed", 2**32, "seed must be an integer in [0, 2**32), got 4294967296"),
    ("seed", 1.5, "seed must be an integer in [0, 2**32), got 1.5"),
])
def test_settings_out_of_range_are_refused_by_name(field, value, message):
    with pytest.raises(ValueError) as e:
        TrainConfig(**{"steps": 1, field: value})
    assert str(e.value) == message


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


def test_repeated_items_list_each_item_of_a_repeated_class_that_many_times():
    labels = np.array([0, 1, 2, 1, 0])
    items = repeated_items(labels, {1: 3, 2: 2})
    assert items.tolist() == [0, 1, 1, 1, 2, 2, 3, 3, 3, 4]
    assert repeated_items(labels, {}).tolist() == [0, 1, 2, 3, 4]


def test_class_repeats_map_class_names_to_their_indices():
    assert class_repeat_counts({"ring": 3, "circle": 2}, ["circle", "square", "ring"]) == {2: 3, 0: 2}
    assert class_repeat_counts({}, ["circle"]) == {}


@pytest.mark.parametrize(("repeats", "message"), [
    ({"hexagon": 2}, "class_repeats names an unknown class 'hexagon'; classes: circle, square"),
    ({"square": 0}, "class_repeats['square'] must be an integer >= 1, got 0"),
    ({"square": 1.5}, "class_repeats['square'] must be an integer >= 1, got 1.5"),
])
def test_class_repeats_must_name_known_classes_and_whole_counts(repeats, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        class_repeat_counts(repeats, ["circle", "square"])


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
    assert json.loads((latest_checkpoint(tmp_path) / "state.json").read_text())["step"] == 4
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


def write_log(run_dir, records) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_steps_reachable_extrapolates_the_speed_of_the_last_logged_steps(tmp_path):
    # an evaluation record between timed ones; the first window (with start-up) is slower and lies outside it
    write_log(tmp_path, [{"init_from": "x"}, {"step": 25, "time": 100.0}, {"step": 50, "time": 200.0},
                         {"step": 75, "time": 205.0}, {"step": 75, "probe": 1.0}, {"step": 100, "time": 210.0}])
    assert steps_reachable(tmp_path, 60, 10_000, window=2) == 100 + 5 * 60
    assert steps_reachable(tmp_path, 60, 250, window=2) == 250  # capped
    assert steps_reachable(tmp_path, -5, 10_000, window=2) == 100  # a deadline already past: no more steps


def test_steps_reachable_without_two_timed_records_is_the_cap(tmp_path):
    assert steps_reachable(tmp_path, 60, 400) == 400
    write_log(tmp_path, [{"step": 25, "time": 1.0}])
    assert steps_reachable(tmp_path, 60, 400) == 400
