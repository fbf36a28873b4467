"""Recipe: train the shapes domain classifier (``vgen train classifier``).

It sees real images and, for a share of each batch, the tokenizer's reconstructions of them: generated samples
look like reconstructions (they pass through the same decoder), so the judge must be accurate on both. Shape
classes are invariant to flips and quarter turns, which serve as augmentation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from vgen.data.shapes import cached_split, data_config, to_tensor
from vgen.hub import from_pretrained, save_pretrained
from vgen.models.classifier import ClassifierConfig, ShapesClassifier
from vgen.tokenizers.vq import VQModel
from vgen.training.trainer import RunDefaults, TrainConfig, Trainer, TrainingData, index_batches

CLASSIFIER_RUN = RunDefaults(steps=3000, lr=2e-3, batch_size=64, warmup_steps=100, num_items=80000)


@dataclass(frozen=True)
class ClassifierRecipe:
    num_images: int = 80000
    num_reconstructions: int = 8000
    batch_size: int = 64
    num_val: int = 2048


@torch.no_grad()
def reconstruct(tokenizer: VQModel, images: np.ndarray, batch_size: int = 128) -> np.ndarray:
    """uint8 images -> uint8 tokenizer reconstructions (encode, quantise, decode), computed where the tokenizer
    lies."""
    tokenizer.eval()
    device = next(tokenizer.parameters()).device
    out = []
    for i in tqdm(range(0, len(images), batch_size), desc="reconstruct", unit="batch"):
        rec, _, _ = tokenizer(to_tensor(images[i:i + batch_size]).to(device))
        out.append(((rec.clamp(-1, 1) + 1) * 127.5 + 0.5).to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy())
    return np.concatenate(out)


def cached_reconstructions(tokenizer: VQModel, images: np.ndarray, count: int, run_dir: Path) -> np.ndarray:
    """The tokenizer's reconstructions of the first ``count`` images, computed once into ``run_dir``."""
    path = run_dir / f"train_recon_{count}.npy"
    if not path.exists():
        run_dir.mkdir(parents=True, exist_ok=True)
        np.save(path, reconstruct(tokenizer, images[:count]))
    return np.load(path)


def half_reconstructed(idx: torch.Tensor, images: np.ndarray, recon: np.ndarray,
                       labels: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """A judge's training batch: the first half of ``idx`` picks real images, the second half their
    reconstructions (modulo how many there are), each with its labels."""
    half = len(idx) // 2
    real_idx = np.sort(idx[:half].numpy())
    rec_idx = np.sort(idx[half:].numpy() % len(recon))
    x = torch.cat([to_tensor(images[real_idx]), to_tensor(recon[rec_idx])])
    return x, torch.from_numpy(np.concatenate([labels[real_idx], labels[rec_idx]]))


def _augment(x: torch.Tensor) -> torch.Tensor:
    """A random quarter turn and flip (the trainer seeds the global RNG per step, so runs resume exactly)."""
    x = torch.rot90(x, int(torch.randint(4, (1,))), dims=(2, 3))
    return x.flip(3) if bool(torch.randint(2, (1,))) else x


@torch.no_grad()
def accuracy(model: ShapesClassifier, images: np.ndarray, labels: np.ndarray) -> float:
    preds = model.predict(to_tensor(np.asarray(images)))
    return float((preds.numpy() == labels).mean())


def train_classifier(run_dir: str | Path, tokenizer_dir: str | Path, data_dir: str | Path, train: TrainConfig,
                     recipe: ClassifierRecipe = ClassifierRecipe(), max_minutes: float | None = None) -> dict:
    run_dir = Path(run_dir)
    images, labels = cached_split(data_dir, "train", recipe.num_images)
    val_images, val_labels = cached_split(data_dir, "val", recipe.num_val)
    tokenizer = from_pretrained(tokenizer_dir)
    recon = cached_reconstructions(tokenizer, images, recipe.num_reconstructions, run_dir)
    model = ShapesClassifier(ClassifierConfig()).to(memory_format=torch.channels_last)  # faster CPU convs
    trainer = Trainer(model, train, run_dir, recipe, TrainingData.of(data_dir, data_config(data_dir), images, labels))

    def step_fn(idx: torch.Tensor) -> tuple[torch.Tensor, dict]:
        x, y = half_reconstructed(idx, images, recon, labels)
        logits = model(_augment(x).contiguous(memory_format=torch.channels_last))
        return F.cross_entropy(logits.float(), y), {"acc": float((logits.argmax(-1) == y).float().mean())}

    trainer.fit(index_batches(len(images), recipe.batch_size, train.seed, trainer.step), step_fn, max_minutes)
    final = trainer.ema.model.eval()
    save_pretrained(final, run_dir / "export")
    val_recon = reconstruct(tokenizer, val_images)
    figures = {"val_accuracy_real": accuracy(final, val_images, val_labels),
               "val_accuracy_reconstructed": accuracy(final, val_recon, val_labels), "steps": trainer.step}
    trainer.log(figures)
    return figures
