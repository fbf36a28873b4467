"""Recipe: train an EAGLE-style draft head for a trained AR model (``vgen train drafter``).

The target is frozen. For a batch of tokenised training images (LlamaGen's 10% class dropout applied, so the
head also learns the null-class rows that guidance runs) the target's final features ``f_0 .. f_255`` are
computed once; the head reads ``(f_s, token s)`` and predicts ``f_{s+1}``. The loss is EAGLE's feature
regression (smooth L1) plus the cross-entropy of the head's draft distribution against the target's own
next-token distribution, which is what speculative acceptance rewards. The reported ``agree`` is how often the
head's top token equals the target's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from vgen.data.shapes import data_config
from vgen.hub import from_pretrained, load_weights, save_pretrained
from vgen.models.draft_head import DraftHead, DraftHeadConfig
from vgen.models.llamagen import LlamaGenGPT
from vgen.training.ar import cached_codes
from vgen.training.trainer import RunDefaults, TrainConfig, Trainer, TrainingData, index_batches, latest_checkpoint

DRAFTER_RUN = RunDefaults(steps=1500, lr=1e-3, batch_size=32, warmup_steps=100, num_items=16000, ema_decay=0.99)


@dataclass(frozen=True)
class DrafterRecipe:
    num_images: int = 16000
    batch_size: int = 32
    feature_weight: float = 1.0


def drafter_losses(head: DraftHead, target: LlamaGenGPT, class_ids: torch.Tensor, codes: torch.Tensor,
                   feature_weight: float = 1.0) -> tuple[torch.Tensor, dict]:
    """Loss of ``head`` on token sequences ``codes`` [B, N] of classes ``class_ids`` [B], and its figures."""
    with torch.no_grad():
        logits, features = target(class_ids, codes[:, :-1], return_hidden=True)  # slots 0 .. N-1
        teacher = logits[:, 1:].float().softmax(-1)  # the target's distribution of tokens 1 .. N-1
    predicted = head(features[:, :-1], codes[:, :-1], target)  # features of slots 1 .. N-1
    draft_logits = target.output(predicted).float()
    ce = -(teacher * draft_logits.log_softmax(-1)).sum(-1).mean()
    regression = F.smooth_l1_loss(predicted.float(), features[:, 1:].float())
    with torch.no_grad():
        agree = (draft_logits.argmax(-1) == logits[:, 1:].argmax(-1)).float().mean()
    figures = {"ce": ce.item(), "feat": regression.item(), "agree": agree.item()}
    return ce + feature_weight * regression, figures


def train_drafter(run_dir: str | Path, target_dir: str | Path, tokenizer_dir: str | Path, data_dir: str | Path,
                  codes_dir: str | Path, train: TrainConfig, recipe: DrafterRecipe = DrafterRecipe(),
                  max_minutes: float | None = None, init_from: str | Path | None = None) -> DraftHead:
    """Train a head for the model in ``target_dir`` on the tokenised split cached in ``codes_dir`` (the AR
    run's folder: tokenising is the expensive part) and export it (EMA weights) to ``run_dir/export``.

    ``init_from`` starts a new run from an exported head, e.g. the one of the model the target was fine-tuned
    from: its features drift little, so the old head is a far better start than random weights."""
    run_dir = Path(run_dir)
    target = from_pretrained(target_dir).eval().requires_grad_(False)
    codes, labels = cached_codes(tokenizer_dir, data_dir, "train", recipe.num_images, codes_dir)
    codes_t, labels_t = torch.from_numpy(codes.astype(np.int64)), torch.from_numpy(labels).long()
    head = DraftHead(DraftHeadConfig.for_target(target.config))
    if init_from is not None and latest_checkpoint(run_dir) is None:
        load_weights(head, from_pretrained(init_from).state_dict(), source=str(init_from))
    trainer = Trainer(head, train, run_dir, recipe, TrainingData.of(data_dir, data_config(data_dir), codes, labels))
    null = target.config.num_classes
    drop_generator = torch.Generator().manual_seed(train.seed)

    def step_fn(idx: torch.Tensor) -> tuple[torch.Tensor, dict]:
        y = labels_t[idx]
        dropped = torch.rand(y.shape, generator=drop_generator) < target.config.class_dropout_prob
        return drafter_losses(head, target, torch.where(dropped, null, y), codes_t[idx], recipe.feature_weight)

    batches = index_batches(len(codes), recipe.batch_size, train.seed, trainer.step)
    trainer.fit(batches, step_fn, max_minutes)
    save_pretrained(trainer.ema.model, run_dir / "export")
    return trainer.ema.model
