"""Recipe: train a VQ tokenizer on the shapes images (``vgen train tokenizer``) or on the frames of the moving-shapes
clips (``vgen train frame-tokenizer``, the per-frame tokenizer of the video models).

Loss: pixel MSE + L1 on the reconstruction plus the codebook and commitment terms. Codes unused over the last
``restart_every`` steps are restarted on encoder outputs of the current batch, which keeps codebook usage high
with an L2-normalised codebook. The exported tokenizer is the raw (not EMA) model: an EMA of a codebook whose
rows are restarted would mix unrelated codes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from vgen.data.clips import SHAPES_CLIPS, ClipsConfig, cached_clips
from vgen.data.shapes import cached_split, data_config, to_tensor
from vgen.hub import save_pretrained
from vgen.tokenizers.vq import VQConfig, VQModel
from vgen.training.trainer import RunDefaults, TrainConfig, Trainer, TrainingData, index_batches

SHAPES_VQ = VQConfig(codebook_size=4096, codebook_embed_dim=8, ch=32, ch_mult=(1, 2, 4), num_res_blocks=1,
                     z_channels=64, norm_groups=8)
# the per-frame VQ of the 32-px video recipes: downsample 4 -> 8 x 8 codes for a 32-px clip frame (ch=64 measured
# 4x slower per step). Patch encoder: a code reads only its own 4x4 pixels, so 70.3% of the codes stay the same
# between frames against 33.4% with LlamaGen's conv encoder, at 27.7 against 28.9 dB (docs/video.md)
SHAPES_FRAME_VQ = VQConfig(codebook_size=1024, codebook_embed_dim=8, ch=32, ch_mult=(1, 2, 2), num_res_blocks=1,
                           z_channels=64, norm_groups=16, encoder="patch")


TOKENIZER_RUN = RunDefaults(steps=900, lr=1e-3, batch_size=32, warmup_steps=100, num_items=80000, ema_decay=0.99,
                            weight_decay=0.0)
# fp32: bf16 autocast measured about 1.5x slower on the 32-px frames
FRAME_TOKENIZER_RUN = RunDefaults(steps=3000, lr=1e-3, batch_size=32, warmup_steps=100, num_items=5000,
                                  precision="fp32", ema_decay=0.99, weight_decay=0.0)


@dataclass(frozen=True)
class TokenizerRecipe:
    num_images: int = 80000
    batch_size: int = 32
    restart_every: int = 50
    l1_weight: float = 0.5


def psnr(x: torch.Tensor, y: torch.Tensor) -> float:
    """PSNR in dB of images in [-1, 1]."""
    mse = F.mse_loss(x.float().clamp(-1, 1), y.float()).item() / 4.0
    return 10 * float(np.log10(1.0 / max(mse, 1e-10)))


def train_tokenizer(run_dir: str | Path, data_dir: str | Path, train: TrainConfig,
                    recipe: TokenizerRecipe = TokenizerRecipe(), vq_config: VQConfig = SHAPES_VQ,
                    max_minutes: float | None = None) -> VQModel:
    """Train (or resume) a VQ on the first ``recipe.num_images`` shapes training images."""
    images, _ = cached_split(data_dir, "train", recipe.num_images)
    data = TrainingData.of(data_dir, data_config(data_dir), images)
    return fit_tokenizer(run_dir, images, train, recipe, vq_config, data, max_minutes)


def train_frame_tokenizer(run_dir: str | Path, data_dir: str | Path, train: TrainConfig,
                          recipe: TokenizerRecipe = TokenizerRecipe(), vq_config: VQConfig = SHAPES_FRAME_VQ,
                          clips: ClipsConfig = SHAPES_CLIPS, max_minutes: float | None = None) -> VQModel:
    """Train (or resume) a VQ on every frame of the first ``recipe.num_images`` training clips."""
    videos, _ = cached_clips(data_dir, "train", recipe.num_images, clips)
    frames = videos.reshape(-1, clips.frame_size, clips.frame_size, 3)  # a view of the memory map
    return fit_tokenizer(run_dir, frames, train, recipe, vq_config, TrainingData.of(data_dir, clips, videos),
                         max_minutes)


def fit_tokenizer(run_dir: str | Path, images: np.ndarray, train: TrainConfig, recipe: TokenizerRecipe,
                  vq_config: VQConfig, data: TrainingData, max_minutes: float | None = None) -> VQModel:
    """The training loop over uint8 images [N, H, W, 3] (recorded as ``data``); the raw model is exported to
    ``run_dir/export``."""
    model = VQModel(vq_config)
    trainer = Trainer(model, train, run_dir, recipe, data)
    usage = torch.zeros(vq_config.codebook_size)
    last: dict[str, torch.Tensor] = {}

    def step_fn(idx: torch.Tensor) -> tuple[torch.Tensor, dict]:
        x = to_tensor(images[np.sort(idx.numpy())])
        z = model.quant_conv(model.encoder(x))
        quant, codes, vq_loss = model.quantize(z)
        rec = model.decode(quant).float()
        loss = F.mse_loss(rec, x) + recipe.l1_weight * F.l1_loss(rec, x) + vq_loss.float()
        usage.add_(torch.bincount(codes.flatten(), minlength=vq_config.codebook_size).float())
        last["z"] = z.detach().float().permute(0, 2, 3, 1).reshape(-1, z.shape[1])
        return loss, {"psnr": psnr(rec.detach(), x), "vq": float(vq_loss.detach())}

    def restart_dead_codes(t: Trainer) -> dict | None:
        if t.step % recipe.restart_every:
            return None
        dead = (usage == 0).nonzero().flatten()
        used_fraction = 1.0 - len(dead) / vq_config.codebook_size
        if len(dead):
            pool = last["z"]
            picks = pool[torch.randint(len(pool), (len(dead),))]
            picks = picks + 0.01 * picks.std() * torch.randn_like(picks)
            with torch.no_grad():
                model.quantize.embedding.weight[dead] = F.normalize(picks, dim=-1)
        usage.zero_()
        return {"codebook_usage_window": used_fraction, "restarted": len(dead)}

    batches = index_batches(len(images), recipe.batch_size, train.seed, trainer.step)
    trainer.fit(batches, step_fn, max_minutes, restart_dead_codes)
    model.eval()
    save_pretrained(model, Path(run_dir) / "export")
    return model
