"""Recipe: train a continuous-token AR model with a diffusion head on KL-tokenised shapes (``vgen train mar``).

The training images are encoded once with the frozen KL tokenizer (posterior means, scaled to unit variance) and
cached next to the run. The loss is MAR's diffusion loss on every token given its prefix, with 10% class dropout
for the null class that guidance uses. Two sizes are defined: the target (``SHAPES_MAR``) and a much smaller
draft for CSpD (``SHAPES_MAR_DRAFT``); both share the tokenizer, so their tokens live in the same space. A
periodic probe samples a few images per class with the EMA model and reports the domain classifier's accuracy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from vgen.data.shapes import cached_split, to_tensor
from vgen.hub import from_pretrained, save_pretrained
from vgen.models.mar import ContinuousAR, MARConfig
from vgen.tokenizers.kl import KLTokenizer
from vgen.training.trainer import TrainConfig, Trainer, every, index_batches, save_array_atomic

SHAPES_MAR = MARConfig(token_channels=4, grid_size=16, dim=256, n_layer=4, n_head=4, multiple_of=64, num_classes=8,
                       dropout_p=0.0, head_width=256, head_depth=3, diffusion_batch_mul=2,
                       clip_x0=5.0)
SHAPES_MAR_DRAFT = MARConfig(token_channels=4, grid_size=16, dim=128, n_layer=2, n_head=2, multiple_of=64,
                             num_classes=8, dropout_p=0.0, head_width=128, head_depth=2, diffusion_batch_mul=2,
                             clip_x0=5.0)
SIZES = {"target": SHAPES_MAR, "draft": SHAPES_MAR_DRAFT}


@dataclass(frozen=True)
class MARRecipe:
    num_images: int = 16000
    batch_size: int = 32
    eval_every: int = 500


@torch.no_grad()
def encode_split(tokenizer: KLTokenizer, images: np.ndarray, batch_size: int = 128) -> np.ndarray:
    """Tokens [N, h*w, C] (float16) of uint8 images [N, H, W, 3]."""
    tokenizer.eval()
    out = [tokenizer.encode(to_tensor(images[i:i + batch_size])).half().numpy()
           for i in tqdm(range(0, len(images), batch_size), desc="encode", unit="batch")]
    return np.concatenate(out)


def cached_latents(tokenizer_dir: str | Path, data_dir: str | Path, split: str, count: int,
                   cache_dir: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Tokens and labels of the first ``count`` images of a split, encoded once and cached in ``cache_dir``."""
    path = Path(cache_dir) / f"{split}_latents_{count}.npy"
    images, labels = cached_split(data_dir, split, count)
    if not path.exists():
        save_array_atomic(encode_split(from_pretrained(tokenizer_dir), images), path)
    return np.load(path), np.asarray(labels)


def mar_probe(tokenizer_dir: str | Path, classifier_dir: str | Path | None, per_class: int = 2,
              cfg_scale: float = 3.0, seed: int = 0) -> Callable[[ContinuousAR], dict]:
    """An ``evaluate(model)`` hook: the class accuracy of ``per_class`` target-only samples per class."""
    from vgen.eval.quality import class_accuracy
    from vgen.samplers import ContinuousARSampler, SamplingParams

    tokenizer = from_pretrained(tokenizer_dir)

    def evaluate(model: ContinuousAR) -> dict:
        if classifier_dir is None or not (Path(classifier_dir) / "config.json").exists():
            return {}
        was_training = model.training
        model.eval()
        classes = torch.arange(model.num_classes).repeat_interleave(per_class)
        out = ContinuousARSampler().sample(model, classes, SamplingParams(cfg_scale=cfg_scale),
                                           generator=torch.Generator().manual_seed(seed))
        images = tokenizer.decode(out.tokens)
        model.train(was_training)
        acc = class_accuracy(from_pretrained(classifier_dir), images, classes.tolist())
        return {"probe_class_accuracy": acc["class_accuracy"]}

    return evaluate


def train_mar(run_dir: str | Path, tokenizer_dir: str | Path, data_dir: str | Path, train: TrainConfig,
              recipe: MARRecipe = MARRecipe(), config: MARConfig = SHAPES_MAR, max_minutes: float | None = None,
              evaluate: Callable[[ContinuousAR], dict] | None = None) -> ContinuousAR:
    run_dir = Path(run_dir)
    tokens, labels = cached_latents(tokenizer_dir, data_dir, "train", recipe.num_images, run_dir)
    if tokens.shape[1:] != (config.grid_size ** 2, config.token_channels):
        raise ValueError(f"the tokenizer gives tokens {tokens.shape[1:]}, the model expects "
                         f"{(config.grid_size ** 2, config.token_channels)}")
    tokens_t, labels_t = torch.from_numpy(tokens), torch.from_numpy(labels)
    model = ContinuousAR(config)
    trainer = Trainer(model, train, run_dir)

    def step_fn(idx: torch.Tensor) -> tuple[torch.Tensor, dict]:
        return model.loss(labels_t[idx], tokens_t[idx].float()), {}

    batches = index_batches(len(tokens), recipe.batch_size, train.seed, trainer.step)
    trainer.fit(batches, step_fn, max_minutes, every(evaluate, recipe.eval_every))
    save_pretrained(trainer.ema.model, run_dir / "export")
    return trainer.ema.model
