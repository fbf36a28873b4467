"""Recipe: train a LlamaGen-architecture class-conditional AR model on tokenised shapes (``vgen train ar``).

The training images are tokenised once with the (frozen) tokenizer and cached next to the run. Loss is
next-token cross-entropy over all 256 codes with LlamaGen's 10% class dropout, which trains the null class used by
classifier-free guidance. During training the recipe periodically samples a few images per class with the EMA
model and reports the domain classifier's accuracy on them, since the loss alone says little about whether shapes
are coming out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from vgen.data.shapes import cached_split, data_config, to_tensor
from vgen.eval.quality import class_accuracy, token_statistics
from vgen.hub import from_pretrained, load_weights
from vgen.models.llamagen import GPTConfig, LlamaGenGPT
from vgen.samplers import ARSampler, SamplingParams
from vgen.tokenizers.vq import VQModel
from vgen.training.trainer import (
    RunDefaults,
    TrainConfig,
    TrainingData,
    every,
    fit_on_codes,
    latest_checkpoint,
    save_array_atomic,
)

SHAPES_GPT = GPTConfig(vocab_size=4096, dim=256, n_layer=8, n_head=8, multiple_of=64, num_classes=8,
                       block_size=256, class_dropout_prob=0.1, token_dropout_p=0.0, resid_dropout_p=0.0,
                       ffn_dropout_p=0.0)


# the guidance the AR run's sample probe draws with, and what `vgen train package` records unless told
AR_CFG_SCALE = 2.0
AR_RUN = RunDefaults(steps=40000, lr=1e-3, batch_size=32, warmup_steps=500, num_items=80000)


@dataclass(frozen=True)
class ARRecipe:
    num_images: int = 80000
    batch_size: int = 32
    eval_every: int = 1000


@torch.no_grad()
def tokenize_split(tokenizer: VQModel, images: np.ndarray, batch_size: int = 256) -> np.ndarray:
    """Codes [N, h*w] (int16) of uint8 images [N, H, W, 3], encoded where the tokenizer lies."""
    tokenizer.eval()
    device = next(tokenizer.parameters()).device
    out = []
    for i in tqdm(range(0, len(images), batch_size), desc="tokenize", unit="batch"):
        _, codes, _ = tokenizer.encode(to_tensor(images[i:i + batch_size]).to(device))
        out.append(codes.flatten(1).to(torch.int16).cpu().numpy())
    return np.concatenate(out)


def cached_codes(tokenizer_dir: str | Path, data_dir: str | Path, split: str, count: int,
                 cache_dir: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Token codes and labels of the first ``count`` images of a split, cached in ``cache_dir``.

    A smaller cache from an earlier call is extended rather than recomputed, so a run can start on a first
    chunk of the data while the rest is tokenised.
    """
    cache_dir = Path(cache_dir)
    path = cache_dir / f"{split}_codes_{count}.npy"
    images, labels = cached_split(data_dir, split, count)
    if not path.exists():
        smaller = sorted((int(p.stem.rsplit("_", 1)[1]), p) for p in cache_dir.glob(f"{split}_codes_*.npy")
                         if int(p.stem.rsplit("_", 1)[1]) < count)
        done = np.load(smaller[-1][1]) if smaller else np.zeros((0, 0), np.int16)
        rest = tokenize_split(from_pretrained(tokenizer_dir), images[len(done):])
        save_array_atomic(np.concatenate([done, rest]) if len(done) else rest, path)
    return np.load(path), np.asarray(labels)


def sample_probe(tokenizer_dir: str | Path, classifier_dir: str | Path | None, per_class: int = 2,
                 cfg_scale: float = AR_CFG_SCALE, seed: int = 0) -> Callable[[LlamaGenGPT], dict]:
    """An ``evaluate(model)`` hook: sample ``per_class`` images per class, report class accuracy and token stats.

    The classifier is loaded when its folder exists at evaluation time, so it may finish training after the AR
    run started.
    """
    tokenizer = from_pretrained(tokenizer_dir)
    params = SamplingParams(cfg_scale=cfg_scale)

    def evaluate(model: LlamaGenGPT) -> dict:
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device  # the probe samples where the model is
        classes = torch.arange(model.num_classes, device=device).repeat_interleave(per_class)
        out = ARSampler().sample(model, classes, params, generator=torch.Generator(device=device).manual_seed(seed))
        figures = {f"probe_{k}": v for k, v in token_statistics(model, out.tokens, classes, params).items()}
        if classifier_dir is not None and (Path(classifier_dir) / "config.json").exists():
            with torch.no_grad():
                images = tokenizer.decode_code(out.tokens, model.grid).clamp(-1, 1)
            acc = class_accuracy(from_pretrained(classifier_dir), images, classes.tolist())
            figures["probe_class_accuracy"] = acc["class_accuracy"]
        model.train(was_training)
        return figures

    return evaluate


def train_ar(run_dir: str | Path, tokenizer_dir: str | Path, data_dir: str | Path, train: TrainConfig,
             recipe: ARRecipe = ARRecipe(), gpt_config: GPTConfig = SHAPES_GPT, max_minutes: float | None = None,
             evaluate: Callable[[LlamaGenGPT], dict] | None = None,
             init_from: str | Path | None = None) -> LlamaGenGPT:
    """Train (or resume) an AR run; ``init_from`` starts a new run from an exported model's weights (fine-tuning)."""
    run_dir = Path(run_dir)
    codes, labels = cached_codes(tokenizer_dir, data_dir, "train", recipe.num_images, run_dir)
    model = LlamaGenGPT(gpt_config)
    if init_from is not None and latest_checkpoint(run_dir) is None:
        load_weights(model, from_pretrained(init_from).state_dict(), source=str(init_from))
    data = TrainingData.of(data_dir, data_config(data_dir), codes, labels)
    return fit_on_codes(run_dir, model, codes, labels, train, recipe, data, max_minutes, next_token_loss,
                        every(evaluate, recipe.eval_every))


def next_token_loss(model: LlamaGenGPT, class_ids: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Next-token cross-entropy over all codes after the class token, with the top-1 accuracy."""
    logits = model(class_ids, tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1))
    return loss, {"acc": float((logits.argmax(-1) == tokens).float().mean())}
