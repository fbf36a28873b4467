"""A small resumable training loop shared by every ``vgen train`` recipe.

It owns what all recipes need and nothing model-specific: AdamW with warmup, an EMA copy, optional bf16 autocast
(faster for large matmuls on a CPU with native bf16 matmuls, AMX or AVX512-BF16; the small video, NAR and
frame-tokenizer models measured slower under it even there, and a CPU without them emulates bf16 at a fraction of
fp32's speed, so ``vgen train --precision auto`` picks fp32 in those cases), gradient clipping, a tqdm bar, a
JSON-lines loss log, and checkpoints written atomically to a run directory so that a killed run resumes where it
stopped. Model weights are saved with safetensors; the optimizer state with ``torch.save`` and read back with
``weights_only=True``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm.auto import tqdm

from vgen.hub import save_pretrained
from vgen.interrupts import graceful_stop


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings common to every recipe."""

    steps: int
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 200
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    ema_decay: float = 0.999
    bf16: bool = True
    checkpoint_every_s: float = 600.0
    log_every: int = 25
    seed: int = 0
    device: str = "cpu"



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


def _atomic_save_file(tensors: dict[str, torch.Tensor], path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(tmp))
    os.replace(tmp, path)


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
    is moved to ``cfg.device`` first, so its optimizer state and EMA copy live there too."""

    def __init__(self, model: nn.Module, cfg: TrainConfig, run_dir: str | Path,
                 param_groups: list[dict] | None = None) -> None:
        self.model, self.cfg, self.run_dir = model.to(cfg.device), cfg, Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        params = param_groups or self._decay_groups(model, cfg.weight_decay)
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas)
        self.ema = EMA(model, cfg.ema_decay)
        self.step = 0
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
        state_path = self.run_dir / "state.json"
        if not state_path.exists():
            return
        state = json.loads(state_path.read_text())
        self.model.load_state_dict(load_file(str(self.run_dir / "model.safetensors")))
        self.ema.model.load_state_dict(load_file(str(self.run_dir / "ema.safetensors")))
        self.optimizer.load_state_dict(torch.load(self.run_dir / "optimizer.pt", weights_only=True))
        self.step = int(state["step"])

    def save(self) -> None:
        _atomic_save_file(self.model.state_dict(), self.run_dir / "model.safetensors")
        _atomic_save_file(self.ema.model.state_dict(), self.run_dir / "ema.safetensors")
        tmp = self.run_dir / "optimizer.pt.tmp"
        torch.save(self.optimizer.state_dict(), tmp)
        os.replace(tmp, self.run_dir / "optimizer.pt")
        state = {"step": self.step, "train_config": asdict(self.cfg)}
        (self.run_dir / "state.json").write_text(json.dumps(state, indent=1))

    def log(self, record: dict) -> None:
        with open(self.run_dir / "log.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    # -- loop --------------------------------------------------------------------------------------------------
    def fit(self, batches: Iterator, step_fn: Callable[[object], tuple[torch.Tensor, dict]],
            max_minutes: float | None = None, on_step: Callable[[Trainer], dict | None] | None = None,
            stop_at: int | None = None) -> None:
        """Train until ``cfg.steps`` (or step ``stop_at``, or ``max_minutes``); ``step_fn(batch) -> (loss, metrics)``.

        ``on_step(trainer)`` runs after every step (restarting dead codes, periodic evaluation); a dict it returns
        is added to the log.
        """
        start = last_ckpt = time.time()
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
                if now - last_ckpt > self.cfg.checkpoint_every_s:
                    self.save()
                    last_ckpt = now
                if max_minutes is not None and now - start > 60 * max_minutes:
                    break
        bar.close()
        self.save()

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
                 batch_size: int, max_minutes: float | None = None,
                 loss_fn: TokenLoss = token_grid_loss,
                 on_step: Callable[[Trainer], dict | None] | None = None) -> nn.Module:
    """Train (or resume) ``model`` on token ``codes`` [N, L] with class ``labels`` [N] in ``run_dir``; the EMA
    model is exported to ``run_dir/export`` and returned."""
    codes_t = torch.from_numpy(codes.astype(np.int64)).to(train.device)
    labels_t = torch.from_numpy(np.asarray(labels)).to(train.device)
    trainer = Trainer(model, train, run_dir)
    batches = index_batches(len(codes_t), batch_size, train.seed, trainer.step)
    trainer.fit(batches, lambda idx: loss_fn(model, labels_t[idx], codes_t[idx]), max_minutes, on_step)
    save_pretrained(trainer.ema.model, Path(run_dir) / "export")
    return trainer.ema.model
