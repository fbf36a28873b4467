"""Recipe: train a continuous-token AR model with a diffusion head on KL-tokenised shapes (``vgen train mar``).

The training images are encoded once with the frozen KL tokenizer (posterior means, scaled to unit variance) and
cached next to the run. The loss is MAR's diffusion loss on every token given its prefix, with 10% class dropout
for the null class that guidance uses. Two sizes are defined: the target (``SHAPES_MAR``) and a much smaller
draft for CSpD (``SHAPES_MAR_DRAFT``); both share the tokenizer, so their tokens live in the same space. A
periodic probe samples a few images per class with the EMA model and reports the domain classifier's accuracy.
``class_repeats`` shows the images of the classes a model draws worst more often; ``context_noise`` trains the
trunk on perturbed prefixes, closer to the imperfect ones it reads when sampling.

A target can start from a trained discrete AR model of the same width and depth (``--init-from`` a pipeline folder
with ``gpt/`` and ``vq/``): its transformer blocks, class table and final norm carry over, and the token MLP is
first fitted to map each latent to the AR model's embedding of the VQ code at the same grid position, so the
trunk sees inputs close to the ones it was trained on. A linear projection cannot do that from 4 latent channels
(docs/models/shapes-c2i-continuous.md), hence the MLP of ``SHAPES_MAR``. ``--init-from`` a continuous target
trains it further, optionally with a deeper diffusion head (``--head-depth``) whose added blocks start as
identities.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from vgen.data.shapes import CLASS_NAMES, cached_split, data_config, to_tensor
from vgen.eval.quality import class_accuracy
from vgen.hub import CheckpointError, from_pretrained, load_weights, save_pretrained
from vgen.models.llamagen import LlamaGenGPT
from vgen.models.mar import ContinuousAR, MARConfig
from vgen.samplers import ContinuousARSampler, SamplingParams
from vgen.tokenizers.kl import KLTokenizer
from vgen.training.ar import cached_codes
from vgen.training.trainer import (
    RunDefaults,
    TrainConfig,
    Trainer,
    TrainingData,
    class_repeat_counts,
    every,
    index_batches,
    latest_checkpoint,
    repeated_items,
    save_array_atomic,
)

SHAPES_MAR = MARConfig(token_channels=4, grid_size=16, dim=256, n_layer=8, n_head=8, multiple_of=64, num_classes=8,
                       dropout_p=0.0, head_width=256, head_depth=3, diffusion_batch_mul=2,
                       clip_x0=5.0, token_hidden=512)  # the shapes AR model's trunk (vgen.training.ar.SHAPES_GPT)
SHAPES_MAR_DRAFT = MARConfig(token_channels=4, grid_size=16, dim=128, n_layer=2, n_head=2, multiple_of=64,
                             num_classes=8, dropout_p=0.0, head_width=128, head_depth=2, diffusion_batch_mul=2,
                             clip_x0=5.0)
SIZES = {"target": SHAPES_MAR, "draft": SHAPES_MAR_DRAFT}


MAR_RUN = RunDefaults(steps=3000, lr=1e-3, batch_size=32, warmup_steps=100, num_items=16000)


@dataclass(frozen=True)
class MARRecipe:
    """Images, batch, probe interval, ``class_repeats`` (class name -> how many times each of its images is shown
    an epoch; other classes once) and the token-MLP fit of a warm start."""

    num_images: int = 16000
    batch_size: int = 32
    eval_every: int = 500
    class_repeats: dict[str, int] = field(default_factory=dict)
    fit_images: int = 4000  # images whose token pairs fit the token MLP of a warm start
    fit_steps: int = 1500
    context_noise: float = 0.0  # largest std of the noise on the prefix the trunk reads (ContinuousAR.loss)

    def __post_init__(self) -> None:
        class_repeat_counts(self.class_repeats, CLASS_NAMES)
        if not 0 <= self.context_noise <= 1:
            raise ValueError(f"context_noise is a standard deviation in token units in [0, 1], "
                             f"got {self.context_noise}")


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
    """An ``evaluate(model)`` hook: the class accuracy of ``per_class`` target-only samples per class, sampled where
    the model is and decoded on the CPU."""
    tokenizer = from_pretrained(tokenizer_dir)

    def evaluate(model: ContinuousAR) -> dict:
        if classifier_dir is None or not (Path(classifier_dir) / "config.json").exists():
            return {}
        was_training = model.training
        model.eval()
        classes = torch.arange(model.num_classes).repeat_interleave(per_class)
        out = ContinuousARSampler().sample(model, classes.to(model.device), SamplingParams(cfg_scale=cfg_scale),
                                           generator=torch.Generator(model.device).manual_seed(seed))
        images = tokenizer.decode(out.tokens.float().cpu())
        model.train(was_training)
        acc = class_accuracy(from_pretrained(classifier_dir), images, classes.tolist())
        return {"probe_class_accuracy": acc["class_accuracy"]}

    return evaluate


def load_trunk(model: ContinuousAR, ar_state: dict[str, torch.Tensor], source: str = "AR model") -> None:
    """Copy a LlamaGen AR model's blocks, class table and final norm into ``model`` (token and output layers have
    no counterpart); a state of another size or depth is a :class:`~vgen.hub.CheckpointError`."""
    own = model.state_dict()
    trunk = [k for k in own if not k.startswith(("token_proj.", "head."))]
    missing = [k for k in trunk if k not in ar_state]
    if missing:
        raise CheckpointError(f"{source} has no {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}: "
                              f"its transformer is not the {model.config.n_layer}-layer LlamaGen trunk of this model")
    extra = [k for k in ar_state if k not in own and k not in ("tok_embeddings.weight", "output.weight")]
    if extra:
        raise CheckpointError(f"{source} has layers this model lacks ({', '.join(extra[:4])}): it is deeper or not "
                              f"a LlamaGen AR model")
    load_weights(model, {**own, **{k: ar_state[k].to(own[k].dtype) for k in trunk}}, source=source)


def fit_token_projection(model: ContinuousAR, tokens: torch.Tensor, targets: torch.Tensor, steps: int,
                         batch_size: int = 4096, lr: float = 1e-3, seed: int = 0) -> float:
    """Regress ``model.token_proj`` so that tokens [M, C] map to targets [M, dim] (mean squared error, Adam);
    returns the share of the targets' variance it explains on the last 10% of the pairs, held out."""
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(tokens), generator=gen)
    tokens, targets = tokens[order].float(), targets[order].float()
    n_fit = max(1, int(0.9 * len(tokens)))
    opt = torch.optim.Adam(model.token_proj.parameters(), lr=lr)
    for _ in tqdm(range(steps), desc="fit token projection", unit="step"):
        i = torch.randint(0, n_fit, (min(batch_size, n_fit),), generator=gen)
        loss = (model.token_proj(tokens[i]) - targets[i]).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    held_tokens, held = (tokens[n_fit:], targets[n_fit:]) if n_fit < len(tokens) else (tokens, targets)
    with torch.no_grad():
        residual = (model.token_proj(held_tokens) - held).pow(2).sum()
    return float(1 - residual / (held - held.mean(0)).pow(2).sum().clamp(min=1e-12))


def warm_start_from_ar(model: ContinuousAR, gpt: nn.Module, vq_dir: Path, data_dir: str | Path, tokens: np.ndarray,
                       run_dir: Path, recipe: MARRecipe) -> dict:
    """Start ``model`` from a discrete AR model and its VQ tokenizer: trunk by name (:func:`load_trunk`), token MLP
    fitted to the AR embeddings of the training images' VQ codes."""
    if not (vq_dir / "config.json").exists():
        raise CheckpointError(f"a warm start from a discrete AR model needs its pipeline folder (gpt/ and vq/); "
                              f"{vq_dir} is not there")
    load_trunk(model, gpt.float().state_dict())
    count = min(recipe.fit_images, len(tokens))
    codes, _ = cached_codes(vq_dir, data_dir, "train", count, run_dir)
    if codes.shape[1] != tokens.shape[1]:
        raise ValueError(f"the VQ tokenizer gives {codes.shape[1]} codes an image and the KL tokenizer "
                         f"{tokens.shape[1]} tokens: the grids must match for a warm start")
    embeddings = gpt.tok_embeddings.weight.detach().float()
    targets = embeddings[torch.from_numpy(codes.astype(np.int64)).reshape(-1)]
    r2 = fit_token_projection(model, torch.from_numpy(tokens[:count]).reshape(-1, tokens.shape[2]), targets,
                              recipe.fit_steps)
    return {"token_projection_r2": r2}


def load_continuous(model: ContinuousAR, source: ContinuousAR, name: str) -> dict:
    """Load a trained continuous target into ``model``, which may have a deeper diffusion head than ``source``
    (and must match it otherwise): the added residual blocks keep their initialisation, whose zero AdaLN gates make
    each an identity, so the grown model starts out computing exactly what ``source`` computes. Returns what the run
    logs about it."""
    added = model.config.head_depth - source.config.head_depth
    state = source.state_dict()
    if added > 0 and replace(source.config, head_depth=model.config.head_depth) == model.config:
        state = {**{k: v for k, v in model.state_dict().items() if k.startswith("head.res_blocks.")}, **state}
    load_weights(model, state, source=name)
    return {"head_blocks_added": added} if added > 0 else {}


def start_from(model: ContinuousAR, init_from: str | Path, data_dir: str | Path, tokens: np.ndarray, run_dir: Path,
               recipe: MARRecipe) -> dict:
    """A new run's first weights, from a model folder or a pipeline folder (its ``gpt/``): a continuous target
    loads as it is, to be trained further; a discrete LlamaGen AR model warm-starts it (:func:`warm_start_from_ar`,
    with the pipeline's ``vq/``). Returns what the run logs about it."""
    init_from = Path(init_from)
    folder = init_from / "gpt" if (init_from / "gpt").is_dir() else init_from
    source = from_pretrained(folder)
    if isinstance(source, ContinuousAR):
        return {"init_from": str(folder), **load_continuous(model, source, str(folder))}
    if isinstance(source, LlamaGenGPT):
        return {"warm_start": str(init_from), **warm_start_from_ar(model, source, init_from / "vq", data_dir, tokens,
                                                                   run_dir, recipe)}
    raise CheckpointError(f"{folder} holds a {type(source).__name__}: --init-from takes a continuous target or a "
                          f"discrete LlamaGen AR pipeline")


def train_mar(run_dir: str | Path, tokenizer_dir: str | Path, data_dir: str | Path, train: TrainConfig,
              recipe: MARRecipe = MARRecipe(), config: MARConfig = SHAPES_MAR, max_minutes: float | None = None,
              evaluate: Callable[[ContinuousAR], dict] | None = None,
              init_from: str | Path | None = None) -> ContinuousAR:
    """Train (or resume) a run; a new run with ``init_from`` starts from that model (:func:`start_from`). The EMA
    model goes to ``run_dir/export``."""
    run_dir = Path(run_dir)
    tokens, labels = cached_latents(tokenizer_dir, data_dir, "train", recipe.num_images, run_dir)
    if tokens.shape[1:] != (config.grid_size ** 2, config.token_channels):
        raise ValueError(f"the tokenizer gives tokens {tokens.shape[1:]}, the model expects "
                         f"{(config.grid_size ** 2, config.token_channels)}")
    tokens_t, labels_t = torch.from_numpy(tokens).to(train.device), torch.from_numpy(labels).to(train.device)
    model = ContinuousAR(config)
    started = None
    if init_from is not None and latest_checkpoint(run_dir) is None:
        started = start_from(model, init_from, data_dir, tokens, run_dir, recipe)
    trainer = Trainer(model, train, run_dir, recipe, TrainingData.of(data_dir, data_config(data_dir), tokens, labels))
    if started:
        trainer.log({"step": 0, **started})

    def step_fn(idx: torch.Tensor) -> tuple[torch.Tensor, dict]:
        return model.loss(labels_t[idx], tokens_t[idx].float(), context_noise=recipe.context_noise), {}

    items = torch.from_numpy(repeated_items(labels, class_repeat_counts(recipe.class_repeats, CLASS_NAMES)))
    batches = (items[idx] for idx in index_batches(len(items), recipe.batch_size, train.seed, trainer.step))
    trainer.fit(batches, step_fn, max_minutes, every(evaluate, recipe.eval_every))
    save_pretrained(trainer.ema.model, run_dir / "export")
    return trainer.ema.model
