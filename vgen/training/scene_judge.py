"""Recipe: train the judge of prompt faithfulness on captioned scenes (``vgen train scene-judge``).

One network reads an image and names each attribute a prompt can state: shape, colour, size, place and
background. Like the class judge it sees real scenes and, for half of each batch, the tokenizer's
reconstructions of them, since generated images pass through the same decoder. Mirror flips serve as
augmentation, with the place label mirrored to match.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from vgen.data.scenes import ATTRIBUTES, BACKGROUND_NAMES, COLOUR_NAMES, POSITIONS, SIZES, cached_scenes
from vgen.data.shapes import CLASS_NAMES
from vgen.eval.quality import attribute_accuracy
from vgen.hub import from_pretrained, save_pretrained
from vgen.models.classifier import AttributeClassifier, AttributeClassifierConfig
from vgen.training.classifier import cached_reconstructions, half_reconstructed, reconstruct
from vgen.training.trainer import RunDefaults, TrainConfig, Trainer, TrainingData, index_batches

SCENE_JUDGE = AttributeClassifierConfig(attributes=tuple(zip(ATTRIBUTES, (
    len(CLASS_NAMES), len(COLOUR_NAMES), len(SIZES), len(POSITIONS), len(BACKGROUND_NAMES)))))
SCENE_JUDGE_RUN = RunDefaults(steps=3000, lr=2e-3, batch_size=64, warmup_steps=100, num_items=64000)
POSITION = ATTRIBUTES.index("position")


def mirror(images: torch.Tensor, attributes: torch.Tensor, horizontal: bool,
           vertical: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Flip images [B, 3, H, W] and mirror the place on the 3 x 3 grid to match."""
    row, col = attributes[:, POSITION] // 3, attributes[:, POSITION] % 3
    if horizontal:
        images, col = images.flip(3), 2 - col
    if vertical:
        images, row = images.flip(2), 2 - row
    attributes = attributes.clone()
    attributes[:, POSITION] = row * 3 + col
    return images, attributes


@dataclass(frozen=True)
class SceneJudgeRecipe:
    num_images: int = 64000
    num_reconstructions: int = 8000
    num_val: int = 2048
    batch_size: int = 64


def train_scene_judge(run_dir: str | Path, tokenizer_dir: str | Path, data_dir: str | Path, train: TrainConfig,
                      recipe: SceneJudgeRecipe = SceneJudgeRecipe(), max_minutes: float | None = None,
                      workers: int = 2) -> dict:
    """Train (or resume) the judge on ``train.device``; returns its held-out accuracy per attribute on real and
    reconstructed scenes. ``workers`` processes render the scenes; the EMA weights are exported to
    ``run_dir/export``."""
    run_dir = Path(run_dir)
    images, _, attributes = cached_scenes(data_dir, "train", recipe.num_images, workers=workers)
    val_images, _, val_attributes = cached_scenes(data_dir, "val", recipe.num_val, workers=workers)
    tokenizer = from_pretrained(tokenizer_dir, map_location=train.device)
    recon = cached_reconstructions(tokenizer, images, recipe.num_reconstructions, run_dir)
    model = AttributeClassifier(SCENE_JUDGE).to(memory_format=torch.channels_last)
    trainer = Trainer(model, train, run_dir, recipe, TrainingData.of(data_dir, None, images, attributes))

    def step_fn(idx: torch.Tensor) -> tuple[torch.Tensor, dict]:
        x, y = half_reconstructed(idx, images, recon, attributes)
        flips = torch.randint(2, (2,))
        x, y = mirror(x.to(train.device), y.to(train.device), bool(flips[0]), bool(flips[1]))
        logits = model(x.contiguous(memory_format=torch.channels_last))
        losses = [F.cross_entropy(logits[name].float(), y[:, i]) for i, name in enumerate(SCENE_JUDGE.names)]
        right = [(logits[name].argmax(-1) == y[:, i]).float().mean() for i, name in enumerate(SCENE_JUDGE.names)]
        return torch.stack(losses).sum(), {"acc": float(torch.stack(right).mean())}

    trainer.fit(index_batches(len(images), recipe.batch_size, train.seed, trainer.step), step_fn, max_minutes)
    save_pretrained(trainer.ema.model, run_dir / "export")
    final = trainer.ema.model.eval().cpu()
    tokenizer.cpu()
    figures = {"val_real": attribute_accuracy(final, val_images, val_attributes),
               "val_reconstructed": attribute_accuracy(final, reconstruct(tokenizer, val_images), val_attributes),
               "steps": trainer.step}
    trainer.log(figures)
    return figures
