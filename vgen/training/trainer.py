"""A small resumable training loop shared by every ``vgen train`` recipe.

It owns what all recipes need and nothing model-specific: AdamW with warmup, an EMA copy, optional bf16 autocast
(faster for large matmuls on a CPU with native bf16 matmuls, AMX or AVX512-BF16; the small video, NAR and
frame-tokenizer models measured slower under it even there, and a CPU without them emulates bf16 at a fraction of
fp32's speed, so ``vgen train --precision auto`` picks fp32 in those cases), gradient clipping, a tqdm bar, a
JSON-lines loss log (``log.jsonl``), and checkpoints in a run directory from which a killed run resumes.

A checkpoint is one unit: ``checkpoints/step-<step>/`` holds ``model.safetensors``, ``ema.safetensors``,
``optimizer.pt`` (``torch.save``, read back with ``weights_only=True``) and ``state.json`` (the step and the
run's settings, the data's among them: :class:`TrainingData`). The folder is written under a temporary name, every
file synced to disk, then renamed; only after that does the small file ``latest`` switch to it (``os.replace``)
and older step folders go. A resume reads the folder ``latest`` names, so a crash at any point leaves the previous
checkpoint whole. A resume refuses settings or data other than the recorded ones (:data:`RUNTIME_SETTINGS` aside)
unless ``TrainConfig.override_config``, and drops the log's records past the checkpoint's step, which the resumed
run writes again.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import math
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import MISSING, asdict, dataclass, fields, is_dataclass
from pathlib import Path

import numpy as np
import safetensors.torch
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from vgen.hub import CheckpointError, load_weights, save_pretrained
from vgen.interrupts import graceful_stop
from vgen.samplers.options import check_options, option


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings common to every recipe, each checked against its declaration on construction (a
    ValueError names the first bad one)."""

    steps: int = option(MISSING, "optimizer steps in all", at_least=0, note="0 = export the starting weights")
    lr: float = option(1e-3, "peak learning rate", above=0)
    min_lr_ratio: float = option(0.1, "final learning rate as a fraction of the peak", at_least=0, at_most=1)
    warmup_steps: int = option(200, "steps of linear learning-rate warmup", at_least=0)
    weight_decay: float = option(0.05, "AdamW weight decay", at_least=0)
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = option(1.0, "gradient norm clip", above=0)
    ema_decay: float = option(0.999, "decay of the EMA copy", at_least=0, at_most=1)
    bf16: bool = True
    checkpoint_every_steps: int = option(1000, "checkpoint at every multiple of this step", at_least=0,
                                         note="0 = none by steps")
    checkpoint_every_minutes: float = option(2.0, "checkpoint once this long has passed since the last one",
                                             at_least=0, note="0 = none by time")
    log_every: int = option(25, "steps between log records", at_least=1)
    seed: int = option(0, "random seed of the initialisation and the batches", at_least=0, below=2**32)
    device: str = "cpu"
    override_config: bool = False  # resume a checkpoint recorded with other settings, going on with these

    def __post_init__(self) -> None:
        check_options(self)


@dataclass(frozen=True)
class RunDefaults:
    """A recipe's defaults for ``vgen train <recipe>``: its optimisation settings, the training images (or clips)
    it draws, ``num_items``, and its ``precision`` (``auto``, or ``fp32`` where bf16 autocast measured slower)."""

    steps: int
    lr: float
    batch_size: int
    warmup_steps: int
    num_items: int
    precision: str = "auto"
    ema_decay: float = TrainConfig.ema_decay
    weight_decay: float = TrainConfig.weight_decay

    def train_config(self, **settings) -> TrainConfig:
        """A :class:`TrainConfig` with this recipe's EMA and weight decay and the run's ``settings``."""
        return TrainConfig(ema_decay=self.ema_decay, weight_decay=self.weight_decay, **settings)

def native_bf16_cpu() -> bool:
    """Whether this CPU multiplies bf16 matrices natively (AMX tiles or AVX512-BF16).

    Without either, PyTorch emulates bf16 matmuls: a training step of the shapes AR model took 125 s under bf16
    autocast against 5.8 s in fp32 on a 2-core AVX2 EPYC, where AMX had made bf16 3x faster than fp32.
    """
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


def use_bf16(precision: str) -> bool:
    """``vgen train --precision``: ``"bf16"``, ``"fp32"``, or ``"auto"`` (bf16 only on a native-bf16 CPU)."""
    if precision not in ("auto", "bf16", "fp32"):
        raise ValueError(f"precision must be 'auto', 'bf16' or 'fp32', not {precision!r}")
    return native_bf16_cpu() if precision == "auto" else precision == "bf16"


class EMA:
    """Exponential moving average of a model's floating-point parameters and buffers."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.model = copy.deepcopy(model).eval().requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module, step: int) -> None:
        d = min(self.decay, (1 + step) / (10 + step))
        for ema_t, t in zip(self.model.state_dict().values(), model.state_dict().values()):
            if ema_t.dtype.is_floating_point:
                ema_t.lerp_(t.detach(), 1 - d)
            else:
                ema_t.copy_(t)


CHECKPOINTS = "checkpoints"  # run_dir/checkpoints/step-<step>/: one complete checkpoint
LATEST = "latest"  # run_dir/latest: the name of the step folder a resume reads
STATE = "state.json"
LOG = "log.jsonl"
# settings a resumed run may change: where and how fast it runs, what it logs and when it checkpoints or evaluates
# (TrainConfig and recipe fields; bf16 too, as --precision auto picks it per machine)
RUNTIME_SETTINGS = frozenset({"device", "bf16", "log_every", "checkpoint_every_steps", "checkpoint_every_minutes",
                              "override_config", "eval_every", "num_val"})


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The step folder that ``run_dir/latest`` names, the checkpoint a resume reads (None: no checkpoint yet)."""
    pointer = Path(run_dir) / LATEST
    if not pointer.exists():
        return None
    name = pointer.read_text().strip()
    folder = Path(run_dir) / CHECKPOINTS / name
    if not re.fullmatch(r"step-\d+", name) or not (folder / STATE).is_file():
        raise CheckpointError(f"{pointer} names {name!r}, which is not a checkpoint in {folder.parent}; remove "
                              f"{pointer} to start the run afresh")
    return folder


def steps_reachable(run_dir: str | Path, seconds: float, max_steps: int, window: int = 5) -> int:
    """The step a run reaches ``seconds`` after its last log record at the speed of its last ``window`` logged
    intervals, at most ``max_steps`` (``max_steps`` when the log times fewer than two records): the length to lay
    a resumed run's schedule over so that it ends annealed at a wall-clock deadline (the one-call GPU scripts)."""
    path = Path(run_dir) / LOG
    lines = path.read_text().splitlines() if path.exists() else []
    timed = [r for r in map(json.loads, lines) if "time" in r]
    if len(timed) < 2:
        return max_steps
    first, last = timed[-min(len(timed), window + 1)], timed[-1]
    if last["time"] <= first["time"]:
        return max_steps
    rate = (last["step"] - first["step"]) / (last["time"] - first["time"])
    return int(min(max_steps, last["step"] + rate * max(seconds, 0.0)))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and wait until it is on disk."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _replace_synced(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file synced to disk, then rename it over ``path``."""
    tmp = path.with_name(path.name + ".tmp")
    _write_synced(tmp, data)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _safetensors_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    return safetensors.torch.save({k: v.detach().contiguous() for k, v in tensors.items()})


def _torch_bytes(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def fingerprint(*arrays: np.ndarray | torch.Tensor) -> str:
    """SHA-256 of the arrays' dtypes, shapes and values, as 16 hex digits: what tells two data sets apart (a
    gigabyte of images takes about 0.6 s: SHA-256 ran at 1.8 GB/s on a 2-core AMD EPYC)."""
    digest = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(array.detach().cpu().numpy() if isinstance(array, torch.Tensor) else array)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.reshape(-1).view(np.uint8))
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class TrainingData:
    """What a run trains on, recorded with its checkpoints: the data folder (``--data-dir``), the rendering
    settings the data was made with (``settings``: a folder's ``shapes.json`` or ``clips.json``, with the
    background; empty for the captioned scenes, which have one rendering) and the :func:`fingerprint` of the arrays
    the training steps read. A resume compares the settings and the fingerprint, not the folder: a copy of the data,
    or a folder rendered alike, holds the same data."""

    folder: str
    settings: dict
    fingerprint: str

    @classmethod
    def of(cls, folder: str | Path, rendering: object | None, *arrays: np.ndarray | torch.Tensor) -> TrainingData:
        """The data in ``folder`` rendered with the dataclass ``rendering`` (None: no settings), read as
        ``arrays``."""
        settings = json.loads(json.dumps(asdict(rendering))) if rendering is not None else {}
        return cls(str(Path(folder).resolve()), settings, fingerprint(*arrays))


def run_settings(cfg: TrainConfig, model: nn.Module, recipe: object | None = None,
                 data: TrainingData | None = None) -> dict:
    """What defines a run, as its checkpoints record it (JSON types): the optimisation settings, the recipe (a
    dataclass: batch size, number of images...), the model's config and the data (its settings and fingerprint
    under ``data``, its folder under ``data_dir``)."""
    config = getattr(model, "config", None)
    settings = {"train_config": asdict(cfg), "recipe": asdict(recipe) if recipe is not None else None,
                "model_config": config.to_dict() if config is not None else None,
                "data": {**data.settings, "fingerprint": data.fingerprint} if data is not None else None,
                "data_dir": data.folder if data is not None else None}
    return json.loads(json.dumps(settings))


def setting_defaults(settings: object | None) -> dict:
    """The default of every field of a dataclass instance (JSON types): what a run recorded before a field existed
    ran with."""
    defaults = {}
    for f in fields(settings) if is_dataclass(settings) else ():
        if f.default is not MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not MISSING:
            defaults[f.name] = f.default_factory()
    return json.loads(json.dumps(defaults))


def changed_settings(recorded: dict, current: dict, defaults: dict | None = None) -> list[str]:
    """``"name old -> new"`` for each setting of :func:`run_settings` that differs, :data:`RUNTIME_SETTINGS` aside
    (model config fields are named ``model.<field>``, the data's ``data.<setting>`` and ``data.fingerprint``). A
    setting the record lacks counts as its value in ``defaults[section]`` (:func:`setting_defaults`), so a run
    recorded before an option existed resumes; the data are compared where both record them."""
    changes = []
    for section, prefix in (("train_config", ""), ("recipe", ""), ("model_config", "model."), ("data", "data.")):
        if section == "data" and not (recorded.get(section) and current.get(section)):
            continue
        old, new = recorded.get(section) or {}, current.get(section) or {}
        old = {**(defaults or {}).get(section, {}), **old}
        for key in [*new, *(k for k in old if k not in new)]:
            if (prefix or key not in RUNTIME_SETTINGS) and old.get(key) != new.get(key):
                changes.append(f"{prefix}{key} {old.get(key, 'unset')} -> {new.get(key, 'unset')}")
    return changes


def save_array_atomic(array: np.ndarray, path: str | Path) -> None:
    """``np.save`` to a temporary name, then rename: a killed run never leaves a truncated cache behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        np.save(f, array)
    tmp.replace(path)


class Trainer:
    """Runs ``step_fn`` for ``cfg.steps`` steps with checkpoints in ``run_dir``; resumes if one is there. The model
    is moved to ``cfg.device`` first, so its optimizer state and EMA copy live there too. ``recipe`` (a dataclass:
    batch size, number of images...) and ``data`` (what it trains on: :class:`TrainingData`) are recorded with
    ``cfg`` and the model's config, and a resume checks them all (:func:`changed_settings`)."""

    def __init__(self, model: nn.Module, cfg: TrainConfig, run_dir: str | Path, recipe: object | None = None,
                 data: TrainingData | None = None) -> None:
        self.model, self.cfg, self.run_dir = model.to(cfg.device), cfg, Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.optimizer = torch.optim.AdamW(self._decay_groups(model, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas)
        self.ema = EMA(model, cfg.ema_decay)
        self.settings = run_settings(cfg, model, recipe, data)
        self._defaults = {"train_config": setting_defaults(cfg), "recipe": setting_defaults(recipe)}
        self.step = 0
        self._saved_step: int | None = None  # the step of the checkpoint on disk
        self._resume()

    @staticmethod
    def _decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
        """Weight decay on matrices only (not on norms, biases or 1-d tensors), as LlamaGen and nanoGPT do."""
        params = [p for p in model.parameters() if p.requires_grad]
        return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]

    def lr_at(self, step: int) -> float:
        """Linear warmup, then cosine decay to ``min_lr_ratio * lr``."""
        c = self.cfg
        if step < c.warmup_steps:
            return c.lr * (step + 1) / c.warmup_steps
        t = min(1.0, (step - c.warmup_steps) / max(1, c.steps - c.warmup_steps))
        return c.lr * (c.min_lr_ratio + (1 - c.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))

    def autocast(self) -> contextlib.AbstractContextManager:
        device = next(self.model.parameters()).device.type
        return torch.autocast(device, dtype=torch.bfloat16, enabled=self.cfg.bf16)

    # -- checkpoints -------------------------------------------------------------------------------------------
    def _resume(self) -> None:
        """Load the checkpoint ``latest`` names, if any, after checking its settings; cut the log back to it."""
        folder = latest_checkpoint(self.run_dir)
        if folder is None:
            (self.run_dir / LOG).unlink(missing_ok=True)  # records of a run that never checkpointed
            return
        state = json.loads((folder / STATE).read_text())
        changes = changed_settings(state, self.settings, self._defaults)
        if changes and not self.cfg.override_config:
            raise CheckpointError(f"{self.run_dir} was trained with other settings ({', '.join(changes)}): rerun "
                                  f"with those, or override them (--override-config) to go on with these")
        device = self.cfg.device
        for model, name in ((self.model, "model.safetensors"), (self.ema.model, "ema.safetensors")):
            load_weights(model, safetensors.torch.load_file(folder / name, device=device), source=str(folder / name))
        self.optimizer.load_state_dict(torch.load(folder / "optimizer.pt", map_location=device, weights_only=True))
        self.step = self._saved_step = int(state["step"])
        self._truncate_log()
        if changes:
            self.log({"step": self.step, "settings_changed": changes})

    def _truncate_log(self) -> None:
        """Drop the log's records past the checkpoint's step (and a line a crash left half-written)."""
        path = self.run_dir / LOG
        if not path.exists():
            return
        lines = path.read_text().splitlines(keepends=True)
        kept = []
        for line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("step", self.step) <= self.step and line.endswith("\n"):
                kept.append(line)
        if len(kept) < len(lines):
            _replace_synced(path, "".join(kept).encode())

    def save(self) -> None:
        """Checkpoint this step as one unit: write ``checkpoints/step-<step>.partial/`` with every file synced,
        rename it to ``step-<step>``, switch ``latest`` to it, then remove the other step folders."""
        if self._saved_step == self.step:
            return
        checkpoints = self.run_dir / CHECKPOINTS
        name = f"step-{self.step:08d}"
        folder, partial = checkpoints / name, checkpoints / f"{name}.partial"
        shutil.rmtree(partial, ignore_errors=True)  # a write a crash interrupted
        partial.mkdir(parents=True)
        _write_synced(partial / "model.safetensors", _safetensors_bytes(self.model.state_dict()))
        _write_synced(partial / "ema.safetensors", _safetensors_bytes(self.ema.model.state_dict()))
        _write_synced(partial / "optimizer.pt", _torch_bytes(self.optimizer.state_dict()))
        _write_synced(partial / STATE, json.dumps({"step": self.step, **self.settings}, indent=1).encode())
        _fsync_dir(partial)
        shutil.rmtree(folder, ignore_errors=True)  # this step written before, by a run that crashed before the switch
        os.replace(partial, folder)
        _fsync_dir(checkpoints)
        _replace_synced(self.run_dir / LATEST, f"{name}\n".encode())
        for old in checkpoints.glob("step-*"):
            if old != folder:
                shutil.rmtree(old)
        self._saved_step = self.step

    def log(self, record: dict) -> None:
        with open(self.run_dir / LOG, "a") as f:
            f.write(json.dumps(record) + "\n")

    # -- loop --------------------------------------------------------------------------------------------------
    def fit(self, batches: Iterator, step_fn: Callable[[object], tuple[torch.Tensor, dict]],
            max_minutes: float | None = None, on_step: Callable[[Trainer], dict | None] | None = None,
            stop_at: int | None = None) -> None:
        """Train until ``cfg.steps`` (or step ``stop_at``, or ``max_minutes``); ``step_fn(batch) -> (loss, metrics)``.

        ``on_step(trainer)`` runs after every step (restarting dead codes, periodic evaluation); a dict it returns
        is added to the log.
        """
        start = last_checkpoint = time.time()
        bar = tqdm(total=self.cfg.steps, initial=self.step, desc=self.run_dir.name, dynamic_ncols=True)
        running: dict[str, float] = {}
        counted = 0  # steps in ``running``: fewer than log_every in the first window after a resume
        self.model.train()
        last = min(self.cfg.steps, stop_at if stop_at is not None else self.cfg.steps)
        with graceful_stop() as stop_requested:
            while self.step < last and not stop_requested():
                metrics = self._step(next(batches), step_fn)
                for k, v in metrics.items():
                    running[k] = running.get(k, 0.0) + v
                counted += 1
                extra = on_step(self) if on_step else None
                if extra:
                    self.log({"step": self.step, **extra})
                if self.step % self.cfg.log_every == 0:
                    avg = {k: v / counted for k, v in running.items()}
                    self.log({"step": self.step, "lr": self.lr_at(self.step), "time": time.time(), **avg})
                    bar.set_postfix({k: f"{v:.4g}" for k, v in avg.items() if k in ("loss", "acc", "psnr")})
                    running.clear()
                    counted = 0
                bar.update(1)
                now = time.time()
                if self._checkpoint_due(now - last_checkpoint):
                    self.save()
                    last_checkpoint = now
                if max_minutes is not None and now - start > 60 * max_minutes:
                    break
        bar.close()
        self.save()

    def _checkpoint_due(self, elapsed_s: float) -> bool:
        """At a multiple of ``checkpoint_every_steps``, or ``checkpoint_every_minutes`` after the last checkpoint."""
        c = self.cfg
        by_steps = c.checkpoint_every_steps > 0 and self.step % c.checkpoint_every_steps == 0
        return by_steps or 0 < 60 * c.checkpoint_every_minutes <= elapsed_s

    def _step(self, batch: object, step_fn: Callable[[object], tuple[torch.Tensor, dict]]) -> dict[str, float]:
        """One optimisation step at ``self.step`` (seeded by it, so resumed runs repeat it exactly)."""
        torch.manual_seed(self.cfg.seed * 1_000_003 + self.step)  # dropout, class dropout, augmentation
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(self.step)
        with self.autocast():
            loss, metrics = step_fn(batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.ema.update(self.model, self.step)
        self.step += 1
        return {"loss": float(loss.detach()), "grad_norm": float(grad_norm), **metrics}


def index_batches(n: int, batch_size: int, seed: int, start_step: int = 0) -> Iterator[torch.Tensor]:
    """Endless shuffled index batches over ``range(n)`` (one permutation per epoch, dropping the remainder).

    Batch ``k`` depends only on ``(seed, k)``, so a run resumed at step ``start_step`` sees the same data as one
    that never stopped.
    """
    if n < batch_size:
        raise ValueError(f"need at least batch_size={batch_size} items, got {n}")
    per_epoch = n // batch_size
    step = start_step
    while True:
        epoch, i = divmod(step, per_epoch)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
        for j in range(i, per_epoch):
            yield perm[j * batch_size:(j + 1) * batch_size]
        step = (epoch + 1) * per_epoch


def class_repeat_counts(class_repeats: dict[str, int], class_names: Sequence[str]) -> dict[int, int]:
    """A recipe's ``class_repeats`` (class name -> how many times each of its items is shown an epoch), checked,
    as class index -> count for :func:`repeated_items`."""
    for name, repeats in class_repeats.items():
        if name not in class_names:
            raise ValueError(f"class_repeats names an unknown class {name!r}; classes: {', '.join(class_names)}")
        if not (isinstance(repeats, int) and repeats >= 1):
            raise ValueError(f"class_repeats[{name!r}] must be an integer >= 1, got {repeats!r}")
    return {list(class_names).index(name): repeats for name, repeats in class_repeats.items()}


def repeated_items(labels: np.ndarray, repeats: dict[int, int]) -> np.ndarray:
    """Item indices with each item of class ``c`` listed ``repeats[c]`` times (other classes once): what
    :func:`index_batches` shuffles to show some classes more often, without replacement inside an epoch."""
    counts = np.array([repeats.get(int(c), 1) for c in labels])
    return np.repeat(np.arange(len(labels)), counts)


TokenLoss = Callable[[nn.Module, torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict]]  # (model, classes, codes)


def token_grid_loss(model: nn.Module, class_ids: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Teacher-forced cross-entropy of ``model(class_ids, tokens)`` (logits for every one of the N tokens, as NBP
    and NAR give them) against ``tokens`` [B, N], with the top-1 accuracy: a Trainer step's ``(loss, figures)``."""
    logits = model(class_ids, tokens)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1))
    return loss, {"acc": float((logits.argmax(-1) == tokens).float().mean())}


def every(evaluate: Callable[[nn.Module], dict] | None, steps: int) -> Callable[[Trainer], dict | None] | None:
    """A Trainer ``on_step`` hook that runs ``evaluate`` on the EMA model every ``steps`` steps (None: no hook)."""
    if evaluate is None:
        return None
    if steps < 1:
        raise ValueError(f"the evaluation interval must be >= 1 step, got {steps}")
    return lambda t: None if t.step % steps else evaluate(t.ema.model)


def fit_on_codes(run_dir: str | Path, model: nn.Module, codes: np.ndarray, labels: np.ndarray, train: TrainConfig,
                 recipe: object, data: TrainingData, max_minutes: float | None = None,
                 loss_fn: TokenLoss = token_grid_loss,
                 on_step: Callable[[Trainer], dict | None] | None = None) -> nn.Module:
    """Train (or resume) ``model`` on token ``codes`` [N, L] with class ``labels`` [N] in ``run_dir``, in batches of
    ``recipe.batch_size`` (the recipe dataclass and the ``data`` are recorded with the checkpoints); the EMA model
    is exported to ``run_dir/export`` and returned."""
    codes_t = torch.from_numpy(codes.astype(np.int64)).to(train.device)
    labels_t = torch.from_numpy(np.asarray(labels)).to(train.device)
    trainer = Trainer(model, train, run_dir, recipe, data)
    batches = index_batches(len(codes_t), recipe.batch_size, train.seed, trainer.step)
    trainer.fit(batches, lambda idx: loss_fn(model, labels_t[idx], codes_t[idx]), max_minutes, on_step)
    save_pretrained(trainer.ema.model, Path(run_dir) / "export")
    return trainer.ema.model
