"""Recipe: train a LlamaGen-T2I model and its word-level text encoder on captioned scenes (``vgen train t2i``).

The image model is LlamaGen's text-to-image architecture (a caption prefix of ``cls_token_num`` positions,
left-padded and masked, with the ``uncond_embedding`` caption for CFG), at the size of the shapes AR model, whose
weights it starts from: the transformer blocks, the token table and the output layer carry over, the caption
embedder is new. The text encoder (:class:`~vgen.models.word_encoder.WordTextEncoder`) is trained with it, end to
end, through the next-token loss; LlamaGen's 10% caption dropout trains the unconditional branch. Scenes are
tokenised once with the frozen shapes VQ tokenizer and cached next to the run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vgen.data.scenes import cached_scenes, caption_vocabulary
from vgen.eval.quality import token_statistics
from vgen.hub import from_pretrained, save_pretrained
from vgen.models.checkpoint_io import copy_shared_tensors
from vgen.models.llamagen import GPTConfig, LlamaGenGPT
from vgen.models.word_encoder import WordEncoderConfig, WordTextEncoder
from vgen.samplers import ARSampler, SamplingParams
from vgen.training.ar import SHAPES_GPT, tokenize_split
from vgen.training.trainer import (
    RunDefaults,
    TrainConfig,
    Trainer,
    TrainingData,
    every,
    index_batches,
    latest_checkpoint,
    save_array_atomic,
)

CAPTION_LENGTH = 24
SHAPES_T2I_GPT = dataclasses.replace(SHAPES_GPT, model_type="t2i", caption_dim=256, cls_token_num=CAPTION_LENGTH,
                                     prefix_rope="identity")
SHAPES_WORD_ENCODER = WordEncoderConfig.for_words(caption_vocabulary(), dim=256, n_layer=2, n_head=4,
                                                  max_length=CAPTION_LENGTH)
T2I_CFG_SCALE = 3.0
T2I_RUN = RunDefaults(steps=4000, lr=5e-4, batch_size=32, warmup_steps=100, num_items=96000)
PROBE_PROMPTS = ("a large red circle in the centre on a white background",
                 "a small blue star in the top left corner on a black background",
                 "a big yellow heart at the bottom right over a striped backdrop",
                 "a tiny green triangle on the left against a grey background")


@dataclass(frozen=True)
class T2IRecipe:
    num_images: int = 96000
    batch_size: int = 32
    eval_every: int = 500


@dataclass(frozen=True)
class CaptionedConfig:
    """The two configs of a :class:`CaptionedGPT`, recorded with its checkpoints."""

    text_encoder: WordEncoderConfig
    gpt: GPTConfig

    def to_dict(self) -> dict:
        return {"text_encoder": self.text_encoder.to_dict(), "gpt": self.gpt.to_dict()}


class CaptionedGPT(nn.Module):
    """The text encoder and the image model as one module, for training: word ids and codes -> logits."""

    def __init__(self, text_encoder: WordTextEncoder, gpt: LlamaGenGPT) -> None:
        super().__init__()
        self.text_encoder, self.gpt = text_encoder, gpt
        self.config = CaptionedConfig(text_encoder.config, gpt.config)

    def forward(self, word_ids: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self.gpt(self.text_encoder(word_ids), tokens[:, :-1])


def start_from(model: CaptionedGPT, init_from: str | Path) -> None:
    """Seed a new run: from a text model's export or pipeline folder (``text_encoder/`` and ``gpt/``) both parts,
    from an AR model folder the image model alone. Settings the run changes (such as ``prefix_rope``) live in
    the config, not in the weights, so a text model can start a run that trains it under new ones."""
    folder = Path(init_from)
    if (folder / "text_encoder").is_dir():
        encoder = from_pretrained(folder / "text_encoder")
        if getattr(encoder, "config", None) != model.text_encoder.config:
            raise ValueError(f"the text encoder in {folder / 'text_encoder'} does not fit this run's: its "
                             f"vocabulary, size or caption length differ")
        model.text_encoder.load_state_dict(encoder.state_dict())
        folder = folder / "gpt"
    copy_shared_tensors(model.gpt, from_pretrained(folder))


def cached_scene_codes(tokenizer_dir: str | Path, data_dir: str | Path, count: int, run_dir: str | Path,
                       encoder: WordTextEncoder, device: str | torch.device = "cpu",
                       workers: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Codes [N, 256] of the first ``count`` training scenes (rendered by ``workers`` processes, tokenised on
    ``device``) and their captions' word ids [N, max_length], cached in ``run_dir``."""
    images, captions, _ = cached_scenes(data_dir, "train", count, workers=workers)
    path = Path(run_dir) / f"scene_codes_{count}.npy"
    if not path.exists():
        save_array_atomic(tokenize_split(from_pretrained(tokenizer_dir, map_location=device), images), path)
    return np.load(path), encoder.tokenize(captions).numpy()


def prompt_probe(tokenizer_dir: str | Path, prompts: tuple[str, ...] = PROBE_PROMPTS, per_prompt: int = 2,
                 cfg_scale: float = T2I_CFG_SCALE, seed: int = 0) -> Callable[[CaptionedGPT], dict]:
    """An ``evaluate(model)`` hook: sample the probe prompts and report the token statistics."""
    params = SamplingParams(cfg_scale=cfg_scale)

    def evaluate(model: CaptionedGPT) -> dict:
        was_training = model.training
        model.eval()
        cond = model.text_encoder.condition([p for p in prompts for _ in range(per_prompt)])
        generator = torch.Generator(device=cond.values.device).manual_seed(seed)  # where the model samples
        out = ARSampler().sample(model.gpt, cond, params, generator=generator)
        figures = {f"probe_{k}": v for k, v in token_statistics(model.gpt, out.tokens, cond, params).items()}
        model.train(was_training)
        return figures

    return evaluate


def t2i_loss(model: CaptionedGPT, word_ids: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Next-token cross-entropy over all codes after the caption, with the top-1 accuracy."""
    logits = model(word_ids, tokens)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1))
    return loss, {"acc": float((logits.argmax(-1) == tokens).float().mean())}


def train_t2i(run_dir: str | Path, tokenizer_dir: str | Path, data_dir: str | Path, train: TrainConfig,
              recipe: T2IRecipe = T2IRecipe(), gpt_config: GPTConfig = SHAPES_T2I_GPT,
              encoder_config: WordEncoderConfig = SHAPES_WORD_ENCODER, init_from: str | Path | None = None,
              max_minutes: float | None = None, evaluate: Callable[[CaptionedGPT], dict] | None = None,
              workers: int = 2) -> CaptionedGPT:
    """Train (or resume) the text encoder and image model together; ``init_from`` (an AR model folder, e.g. the
    shapes model's ``gpt``, or a text model's folder: :func:`start_from`) seeds a new run; ``workers`` processes
    render the scenes. The EMA weights are exported to ``run_dir/export/{text_encoder,gpt}``."""
    run_dir = Path(run_dir)
    model = CaptionedGPT(WordTextEncoder(encoder_config), LlamaGenGPT(gpt_config))
    if init_from is not None and latest_checkpoint(run_dir) is None:
        start_from(model, init_from)
    codes, word_ids = cached_scene_codes(tokenizer_dir, data_dir, recipe.num_images, run_dir, model.text_encoder,
                                         train.device, workers)
    codes_t = torch.from_numpy(codes.astype(np.int64)).to(train.device)
    words_t = torch.from_numpy(word_ids).to(train.device)
    trainer = Trainer(model, train, run_dir, recipe, TrainingData.of(data_dir, None, codes, word_ids))
    batches = index_batches(len(codes_t), recipe.batch_size, train.seed, trainer.step)
    trainer.fit(batches, lambda idx: t2i_loss(model, words_t[idx], codes_t[idx]), max_minutes,
                every(evaluate, recipe.eval_every))
    export(trainer.ema.model, run_dir / "export")
    return trainer.ema.model


def export(model: CaptionedGPT, folder: str | Path) -> Path:
    """Write the text encoder and the image model as two model folders."""
    folder = Path(folder)
    save_pretrained(model.text_encoder, folder / "text_encoder")
    save_pretrained(model.gpt, folder / "gpt")
    return folder

