"""Recipe: train the KL tokenizer on the shapes data (``vgen train kl``).

Loss: pixel MSE + L1 on the reconstruction of a posterior sample, plus ``kl_weight`` times the KL divergence of
the posterior from N(0, I) (both as means over elements). No perceptual or adversarial term: their feature
weights cannot be downloaded here. After training, ``latent_scale`` is set to 1 / std of the posterior means on
training images, so that the exported tokenizer hands unit-scale tokens to the AR model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from vgen.data.shapes import cached_split, data_config, to_tensor
from vgen.hub import save_pretrained
from vgen.tokenizers.kl import KLConfig, KLTokenizer
from vgen.training.tokenizer import psnr
from vgen.training.trainer import RunDefaults, TrainConfig, Trainer, TrainingData, index_batches

SHAPES_KL = KLConfig()


KL_RUN = RunDefaults(steps=800, lr=1e-3, batch_size=32, warmup_steps=50, num_items=16000, ema_decay=0.99,
                     weight_decay=0.0)


@dataclass(frozen=True)
class KLRecipe:
    num_images: int = 16000
    batch_size: int = 32
    l1_weight: float = 0.5
    kl_weight: float = 1e-5
    scale_images: int = 512


@torch.no_grad()
def fit_latent_scale(tokenizer: KLTokenizer, images: np.ndarray, batch_size: int = 128) -> float:
    """1 / standard deviation of the (unscaled) posterior means over ``images``."""
    tokenizer.eval()
    means = [tokenizer.posterior(to_tensor(images[i:i + batch_size])).mean for i in range(0, len(images), batch_size)]
    return float(1.0 / torch.cat(means).float().std())


def kl_loss(model: KLTokenizer, x: torch.Tensor, recipe: KLRecipe) -> tuple[torch.Tensor, dict]:
    """The recipe's loss on images ``x`` [B, 3, H, W] in [-1, 1], with the reconstruction's PSNR and the KL term."""
    post = model.posterior(x)
    rec = model.decode_latents(post.sample()).float()
    kl = post.kl().float().mean() / post.mean[0].numel()
    loss = F.mse_loss(rec, x) + recipe.l1_weight * F.l1_loss(rec, x) + recipe.kl_weight * kl
    return loss, {"psnr": psnr(rec.detach(), x), "kl": float(kl.detach())}


def train_kl(run_dir: str | Path, data_dir: str | Path, train: TrainConfig, recipe: KLRecipe = KLRecipe(),
             config: KLConfig = SHAPES_KL, max_minutes: float | None = None) -> KLTokenizer:
    images, _ = cached_split(data_dir, "train", recipe.num_images)
    model = KLTokenizer(config)
    trainer = Trainer(model, train, run_dir, recipe, TrainingData.of(data_dir, data_config(data_dir), images))

    def step_fn(idx: torch.Tensor) -> tuple[torch.Tensor, dict]:
        return kl_loss(model, to_tensor(images[np.sort(idx.numpy())]), recipe)

    batches = index_batches(len(images), recipe.batch_size, train.seed, trainer.step)
    trainer.fit(batches, step_fn, max_minutes)
    model = trainer.ema.model
    scale = fit_latent_scale(model, images[:recipe.scale_images])
    exported = KLTokenizer(replace(config, latent_scale=scale))
    exported.load_state_dict(model.state_dict())
    save_pretrained(exported.eval(), Path(run_dir) / "export")
    return exported
