"""Recipe: the prompt-conditioned streaming model ``shapes-t2v-stream`` (``vgen train t2v-stream``).

Data. Moving captioned scenes (:mod:`vgen.data.moving_scenes`: 16-frame 64-px clips, a caption each) as latent
frames of a KL tokenizer, encoded once into the run folder (:func:`cached_moving_latents`). The class models' KL
tokenizer saw only smooth backgrounds; on the scenes' textured backgrounds its reconstructions lose much of what
the scene judge reads, so :func:`train_stream_kl` first fine-tunes it on moving-scene frames (the KL recipe's loss,
from the shipped weights, the latent scale refitted). A window of ``train_frames`` frames is cut from each clip at
a random start. No time reversal: a reversed clip's caption would need its motion, its size change and its stated
size swapped (right and left, growing and shrinking, small and large), and the grammar already draws every motion
and its opposite.

Teacher. The block-diffusion transformer with a caption condition (``text_dim > 0``), started from the class
teacher ``shapes-blockdiff-cfg`` (:func:`~vgen.models.blockdiff.start_from_class`: every shared tensor copied, the
cross-attention closed), and a :class:`~vgen.models.word_encoder.WordTextEncoder` whose vocabulary is
``shapes-t2i``'s encoder's words and the moving captions' (the known words' rows copied from ``shapes-t2i``'s
encoder: :func:`extend_vocabulary`), trained together end to end, as the text-to-image recipe trains its encoder.
The loss is :mod:`vgen.training.blockdiff`'s diffusion forcing, with its first-block levers (``noise_shift``,
``lone_block_share``); the model's ``class_dropout_prob`` drops captions (to its null caption) for CFG.

Student (``teacher``). Guidance distillation as for the class student: the student starts from the teacher's
transformer and regresses the teacher's guided velocity, the text encoder frozen (the teacher's). On
``rollout_share`` of the steps the clips are the student's own streams of training captions
(:class:`TextRollouts`); on ``switch_share`` of those streams the prompt switches at a random block under the
LongLive re-cache, and the loss then conditions the whole clip on the new prompt, which is what the re-cached
context was computed under.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from vgen.data.moving_scenes import ATTRIBUTES, MovingScenesConfig, cached_moving_scenes, caption_vocabulary
from vgen.data.shapes import to_tensor
from vgen.eval.quality import attribute_accuracy
from vgen.hub import ASSETS, CheckpointError, from_pretrained, load_weights, save_pretrained
from vgen.models.blockdiff import BlockDiffConfig, BlockDiffusionTransformer, start_from_class
from vgen.models.classifier import AttributeClassifier
from vgen.models.word_encoder import SPECIAL_WORDS, WordEncoderConfig, WordTextEncoder
from vgen.samplers.streaming import BlockStreamer, StreamBlock, StreamConfig
from vgen.tokenizers.kl import KLTokenizer
from vgen.training.blockdiff import (
    Rollouts,
    clips_to_tensor,
    diffusion_forcing_loss,
    guidance_distillation_loss,
    lone_blocks,
    random_windows,
)
from vgen.training.kl import KLRecipe, fit_latent_scale, kl_loss
from vgen.training.trainer import (
    RunDefaults,
    TrainConfig,
    Trainer,
    TrainingData,
    index_batches,
    latest_checkpoint,
    save_array_atomic,
)

CLASS_TEACHER = ASSETS / "shapes-blockdiff-cfg"
T2I_TEXT_ENCODER = ASSETS / "shapes-t2i" / "text_encoder"
TEXT_ENCODER, TRANSFORMER = "text_encoder", "blockdiff"  # the export's two model folders
STREAM_KL_RUN = RunDefaults(steps=600, lr=3e-4, batch_size=32, warmup_steps=20, num_items=1024, ema_decay=0.99,
                            weight_decay=0.0)
T2V_RUN = RunDefaults(steps=4000, lr=3e-4, batch_size=16, warmup_steps=50, num_items=8000, precision="auto")
T2V_TEACHER_CFG = 3.0
SCENES = MovingScenesConfig()  # 16-frame 64-px clips


# -- the KL tokenizer ------------------------------------------------------------------------------------------


def load_kl(kl_dir: str | Path, device: str = "cpu") -> KLTokenizer:
    """The KL tokenizer in ``kl_dir``, or a :class:`~vgen.hub.CheckpointError` naming the folder."""
    kl = from_pretrained(kl_dir, map_location=device)
    if not isinstance(kl, KLTokenizer):
        raise CheckpointError(f"{kl_dir} holds a {type(kl).__name__}, not a KL tokenizer")
    return kl


def moving_frames(data_dir: str | Path, num_clips: int, scenes: MovingScenesConfig = SCENES,
                  workers: int = 1) -> np.ndarray:
    """Every frame of the first ``num_clips`` training clips, uint8 [num_clips * T, S, S, 3] (memory-mapped)."""
    clips, _, _ = cached_moving_scenes(data_dir, "train", num_clips, scenes, workers=workers)
    return clips.reshape(-1, *clips.shape[2:])


def train_stream_kl(run_dir: str | Path, kl_dir: str | Path, data_dir: str | Path, train: TrainConfig,
                    num_clips: int = STREAM_KL_RUN.num_items, batch_size: int = STREAM_KL_RUN.batch_size,
                    scenes: MovingScenesConfig = SCENES, max_minutes: float | None = None, workers: int = 1,
                    judge: AttributeClassifier | None = None, num_val: int = 32) -> dict:
    """Fine-tune (or resume fine-tuning) the KL tokenizer in ``kl_dir`` on the frames of ``num_clips`` moving
    scenes with the KL recipe's loss; the EMA weights, with the latent scale refitted to the scenes, are exported to
    ``run_dir/export``. Returns the steps trained and, with a scene ``judge``, the :func:`tokenizer_fidelity` of
    the starting and the tuned tokenizer on ``num_val`` validation clips (logged too)."""
    frames = moving_frames(data_dir, num_clips, scenes, workers)
    recipe = KLRecipe(num_images=len(frames), batch_size=batch_size)
    start = load_kl(kl_dir)
    model = KLTokenizer(start.config)
    load_weights(model, start.state_dict(), source=str(kl_dir))
    started = latest_checkpoint(run_dir) is None
    trainer = Trainer(model, train, run_dir, recipe, TrainingData.of(data_dir, scenes, frames))
    if started:  # the log says what the run started from
        trainer.log({"step": 0, "init_from": str(kl_dir)})

    def step_fn(idx: torch.Tensor) -> tuple[torch.Tensor, dict]:
        return kl_loss(model, to_tensor(frames[np.sort(idx.numpy())]).to(train.device), recipe)

    trainer.fit(index_batches(len(frames), batch_size, train.seed, trainer.step), step_fn, max_minutes)
    tuned = trainer.ema.model.cpu()
    exported = KLTokenizer(replace(start.config, latent_scale=fit_latent_scale(tuned, frames[:recipe.scale_images])))
    exported.load_state_dict(tuned.state_dict())
    save_pretrained(exported.eval(), Path(run_dir) / "export")
    figures: dict = {"steps": trainer.step}
    if judge is not None:
        clips, _, attributes = cached_moving_scenes(data_dir, "val", num_val, scenes, workers=workers)
        judge = judge.cpu().eval()
        for name, kl in (("start", start), ("tuned", exported)):
            figures[name] = tokenizer_fidelity(kl.to(train.device), judge, clips, attributes)
    trainer.log(figures)
    return figures


FIDELITY_ATTRIBUTES = ("shape", "colour", "background")  # what a moving clip keeps in every frame


@torch.no_grad()
def tokenizer_fidelity(kl: KLTokenizer, judge: AttributeClassifier, clips: np.ndarray, attributes: np.ndarray,
                       batch_size: int = 4) -> dict:
    """How well moving scenes survive the tokenizer: the mean PSNR (dB, uint8 frames) of its reconstructions of
    every frame of ``clips`` (uint8 [N, T, S, S, 3]), and the share of real and of reconstructed frames whose shape,
    colour and background the scene ``judge`` (on the CPU) reads as the clip's ``attributes`` ([N, >= 5], the
    scene's first). The tokenizer runs where it lies."""
    kl.eval()
    device = next(kl.parameters()).device
    frames = np.asarray(clips).reshape(-1, *clips.shape[2:])
    step = batch_size * clips.shape[1]
    rebuilt = np.concatenate([
        ((kl.decode_frames(kl.encode_frames(clips_to_tensor(frames[i:i + step]).to(device))).clamp(-1, 1) + 1)
         * 127.5 + 0.5).to(torch.uint8).cpu().numpy()
        for i in range(0, len(frames), step)])
    mse = ((frames.astype(np.float64) - rebuilt) ** 2).reshape(len(frames), -1).mean(1)
    wanted = np.repeat(np.asarray(attributes)[:, :len(judge.config.names)], clips.shape[1], axis=0)
    figures = {"psnr": float(np.mean(10 * np.log10(255.0 ** 2 / np.maximum(mse, 1e-10))))}
    for name, images in (("real", frames), ("reconstructed", rebuilt)):
        read = attribute_accuracy(judge, images, wanted)
        figures[name] = {a: read[a] for a in FIDELITY_ATTRIBUTES}
    return figures


def cached_moving_latents(kl_dir: str | Path, data_dir: str | Path, count: int, cache_dir: str | Path,
                          split: str = "train", scenes: MovingScenesConfig = SCENES,
                          workers: int = 1, batch_size: int = 16,
                          device: str = "cpu") -> tuple[np.ndarray, list[str]]:
    """Latent frames [N, T, h, w, C] (float16, the KL tokenizer's scaled posterior means) of the first ``count``
    moving scenes of ``split`` (rendered into ``data_dir`` on first use by ``workers`` processes) and their
    captions; the latents are encoded on ``device`` once into ``cache_dir`` (the run folder: one tokenizer per
    run)."""
    clips, captions, _ = cached_moving_scenes(data_dir, split, count, scenes, workers=workers)
    path = Path(cache_dir) / f"moving_latents_{split}_{count}.npy"
    if not path.exists():
        kl = load_kl(kl_dir, device).eval()
        latents = [kl.encode_frames(clips_to_tensor(clips[i:i + batch_size]).to(device)).half().cpu().numpy()
                   for i in tqdm(range(0, count, batch_size), desc="encode moving scenes", unit="batch")]
        save_array_atomic(np.concatenate(latents), path)
    return np.load(path, mmap_mode="r"), list(captions)


# -- the text encoder ------------------------------------------------------------------------------------------


def stream_vocabulary(encoder: WordEncoderConfig) -> tuple[str, ...]:
    """``encoder``'s words (special words first) followed by the moving captions' words it lacks, sorted."""
    known = set(encoder.vocabulary)
    return tuple(encoder.vocabulary) + tuple(w for w in caption_vocabulary() if w not in known)


def extend_vocabulary(source: WordTextEncoder, words: Sequence[str]) -> WordTextEncoder:
    """A text encoder of ``source``'s sizes over ``words`` (special words added first): every tensor copied from
    ``source``, the word table row by row for the words both know; the other rows as initialised."""
    config = WordEncoderConfig.for_words([w for w in words if w not in SPECIAL_WORDS],
                                         **{k: getattr(source.config, k) for k in ("dim", "n_layer", "n_head",
                                                                                   "max_length")})
    encoder = WordTextEncoder(config)
    state = {k: v for k, v in source.state_dict().items() if k != "embed.weight"}
    encoder.load_state_dict(state, strict=False)
    with torch.no_grad():
        for word, row in encoder.index.items():
            if word in source.index:
                encoder.embed.weight[row] = source.embed.weight[source.index[word]]
    return encoder


@dataclass(frozen=True)
class TextStreamConfig:
    """The two configs of a :class:`TextStreamModel`, recorded with its checkpoints."""

    text_encoder: WordEncoderConfig
    blockdiff: BlockDiffConfig

    def to_dict(self) -> dict:
        return {"text_encoder": self.text_encoder.to_dict(), "blockdiff": self.blockdiff.to_dict()}


class TextStreamModel(nn.Module):
    """The text encoder and the text block-diffusion transformer as one module, for training them together."""

    def __init__(self, text_encoder: WordTextEncoder, model: BlockDiffusionTransformer) -> None:
        super().__init__()
        if not model.is_text or model.config.text_dim != text_encoder.caption_dim:
            raise ValueError(f"the transformer takes captions of {model.config.text_dim} features; the text encoder "
                             f"gives {text_encoder.caption_dim}")
        self.text_encoder, self.model = text_encoder, model
        self.config = TextStreamConfig(text_encoder.config, model.config)


def text_config(class_config: BlockDiffConfig, encoder: WordEncoderConfig) -> BlockDiffConfig:
    """The text model of a class model's architecture, taking ``encoder``'s captions."""
    return replace(class_config, text_dim=encoder.dim, text_tokens=encoder.max_length)


def model_folders(folder: str | Path) -> tuple[Path, Path | None]:
    """The transformer folder and the text encoder folder (None: none there) of a pipeline or export folder
    (``blockdiff/`` and ``text_encoder/``), or of a transformer folder itself."""
    folder = Path(folder)
    encoder = folder / TEXT_ENCODER
    if (folder / TRANSFORMER).is_dir():
        return folder / TRANSFORMER, encoder if encoder.is_dir() else None
    return folder, None


def load_blockdiff(folder: str | Path, device: str = "cpu") -> BlockDiffusionTransformer:
    """The block-diffusion model in ``folder``, or a :class:`~vgen.hub.CheckpointError` naming the folder."""
    model = from_pretrained(folder, map_location=device)
    if not isinstance(model, BlockDiffusionTransformer):
        raise CheckpointError(f"{folder} holds a {type(model).__name__}, not a block-diffusion model")
    return model


def start_text_stream(init_from: str | Path, text_encoder_from: str | Path = T2I_TEXT_ENCODER) -> TextStreamModel:
    """A new run's model. From a class model (a ``shapes-blockdiff-cfg`` folder): its architecture and weights
    (:func:`~vgen.models.blockdiff.start_from_class`) with the vocabulary-extended encoder of ``text_encoder_from``.
    From a text model's export or pipeline folder (``blockdiff/`` and ``text_encoder/``): both parts as they are."""
    model_dir, encoder_dir = model_folders(init_from)
    source = load_blockdiff(model_dir)
    if source.is_text:
        if encoder_dir is None:
            raise CheckpointError(f"{init_from} holds a text block-diffusion model without its {TEXT_ENCODER}/ folder")
        encoder = from_pretrained(encoder_dir)
        return TextStreamModel(encoder, source)
    base = from_pretrained(text_encoder_from)
    if not isinstance(base, WordTextEncoder):
        raise CheckpointError(f"{text_encoder_from} holds a {type(base).__name__}, not a word text encoder")
    encoder = extend_vocabulary(base, stream_vocabulary(base.config))
    model = BlockDiffusionTransformer(text_config(source.config, encoder.config))
    start_from_class(model, source)
    return TextStreamModel(encoder, model)


def fit_caption_pool(model: BlockDiffusionTransformer, class_model: BlockDiffusionTransformer,
                     encoder: WordTextEncoder, captions: Sequence[str], classes: Sequence[int],
                     ridge: float = 1e-2) -> float:
    """Set the text model's ``text_pool`` to the ridge least-squares map from the captions' pooled encoder
    features to ``class_model``'s rows of their classes, and the null caption's to the null row (weighted as the
    share of captions training drops), so a text model fresh from a class model draws each caption's shape from
    its first step; only colour, background, size and motion are left to learn. Returns the share of captions
    whose mapped row is nearest their class's row."""
    classes = torch.as_tensor(np.asarray(classes), dtype=torch.long)
    if len(classes) != len(captions):
        raise ValueError(f"{len(captions)} captions but {len(classes)} classes")
    rows = class_model.class_embedding.weight.detach().float()
    null_row = len(rows) - 1
    if len(classes) and not 0 <= int(classes.min()) <= int(classes.max()) < null_row:
        raise ValueError(f"classes must be ids in [0, {null_row}), got {classes.min()}..{classes.max()}")
    with torch.no_grad():
        pooled = model.pooled_caption(encoder.condition(captions)).float()
        null = model.null_caption.detach().float().mean(0, keepdim=True)
    null_weight = math.sqrt(max(model.config.class_dropout_prob, 1e-3) * len(captions))
    features = torch.cat([torch.cat([pooled, null * null_weight]),
                          torch.cat([torch.ones(len(pooled), 1), torch.full((1, 1), null_weight)])], 1)
    targets = torch.cat([rows[classes], rows[null_row:] * null_weight])
    gram = features.T @ features + ridge * torch.eye(features.shape[1])
    solution = torch.linalg.solve(gram, features.T @ targets)  # [text_dim + 1, dim]: weight rows, then bias
    with torch.no_grad():
        model.text_pool.weight.copy_(solution[:-1].T)
        model.text_pool.bias.copy_(solution[-1])
    mapped = torch.cat([pooled, torch.ones(len(pooled), 1)], 1) @ solution
    return float((torch.cdist(mapped, rows).argmin(1) == classes).float().mean())


def export(model: TextStreamModel, folder: str | Path) -> Path:
    """Write the text encoder and the transformer as two model folders (``text_encoder/``, ``blockdiff/``)."""
    folder = Path(folder)
    save_pretrained(model.text_encoder, folder / TEXT_ENCODER)
    save_pretrained(model.model, folder / TRANSFORMER)
    return folder


# -- training --------------------------------------------------------------------------------------------------


CAPTION_POOL_STARTS = ("fitted", "initialised")


@dataclass(frozen=True)
class T2VRecipe:
    """Clips, batch, the share of clean blocks, the first-block levers of the class recipe (``noise_shift``,
    ``lone_block_share``) and, for a student, the share of steps on its own streams (``rollout_share``, up to
    ``rollout_blocks`` blocks of ``rollout_steps`` Euler steps) and the share of those streams whose prompt
    switches at a random block (``switch_share``). A teacher trains on the data alone: its run records no
    rollouts. A teacher started from a class model starts its pooled caption's projection ``fitted`` to the class
    rows (:func:`fit_caption_pool`) or as ``initialised``."""

    num_clips: int = 8000
    batch_size: int = 16
    clean_prob: float = 0.3
    noise_shift: float = 3.0
    lone_block_share: float = 0.5
    rollout_share: float = 0.5
    rollout_blocks: int = 100
    rollout_steps: int = 3
    switch_share: float = 0.25
    caption_pool: str = "fitted"

    def __post_init__(self) -> None:
        if self.caption_pool not in CAPTION_POOL_STARTS:
            raise ValueError(f"caption_pool must be one of {', '.join(CAPTION_POOL_STARTS)}, got {self.caption_pool!r}")
        if not 0 < self.noise_shift < math.inf:
            raise ValueError(f"noise_shift must be a finite number > 0, got {self.noise_shift}")
        for name in ("clean_prob", "lone_block_share", "rollout_share", "switch_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("num_clips", "batch_size", "rollout_blocks", "rollout_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


class TextRollouts(Rollouts):
    """:class:`~vgen.training.blockdiff.Rollouts` of a text model: each batch of streams draws its prompts from
    ``captions``, and with probability ``switch_share`` each of its streams switches to a new caption of its own
    at one random block (the streamer's switch, a re-cache by default). :meth:`next` returns the prompts each
    stream's newest block was drawn under and whether that block is the first after a switch."""

    def __init__(self, model: BlockDiffusionTransformer, config: StreamConfig, batch_size: int, max_blocks: int,
                 encoder: WordTextEncoder, captions: Sequence[str], switch_share: float) -> None:
        super().__init__(model, config, batch_size, max_blocks, pixels=False)
        self.encoder, self.captions, self.switch_share = encoder, list(captions), switch_share
        self.block: StreamBlock | None = None

    def _draw(self, count: int) -> list[str]:
        return [self.captions[int(i)] for i in torch.randint(len(self.captions), (count,))]

    def _start(self) -> None:
        device = next(self.model.parameters()).device
        switch = self.max_blocks > 1 and bool(torch.rand(()) < self.switch_share)
        length = int(torch.randint(2 if switch else 1, self.max_blocks + 1, ()))
        fpb = self.model.frames_per_block
        switches = [(int(torch.randint(1, length, ())) * fpb, self._draw(self.batch_size))] if switch else []
        generator = torch.Generator(device=device).manual_seed(int(torch.randint(2**62, ())))
        streamer = BlockStreamer(self.model, self.config, pixels=False, encode=self.encoder.condition)
        self.blocks = self._recorded(streamer.stream(self._draw(self.batch_size), length * fpb, generator=generator,
                                                     switches=switches))
        self.resident = []

    def _recorded(self, blocks: Iterator[StreamBlock]) -> Iterator[StreamBlock]:
        for block in blocks:
            self.block = block
            yield block

    def next_prompts(self) -> tuple[torch.Tensor, list[str], bool]:
        """Frames [batch, (resident blocks + 1) * frames_per_block, ...], the prompts of the newest block, and
        whether it is the first under a switched prompt."""
        clip, _ = self.next()
        return clip, list(self.block.prompts), bool(self.block.switched)


def train_t2v_stream(run_dir: str | Path, data_dir: str | Path, train: TrainConfig, recipe: T2VRecipe = T2VRecipe(),
                     tokenizer_dir: str | Path = CLASS_TEACHER / "kl", init_from: str | Path = CLASS_TEACHER,
                     teacher: str | Path | None = None, teacher_cfg: float = T2V_TEACHER_CFG,
                     text_encoder_from: str | Path = T2I_TEXT_ENCODER, scenes: MovingScenesConfig = SCENES,
                     max_minutes: float | None = None, workers: int = 1) -> TextStreamModel:
    """Train (or resume) in ``run_dir`` on the latent frames of moving scenes (rendered into ``data_dir``,
    encoded with the KL tokenizer in ``tokenizer_dir``). A teacher run starts from ``init_from`` and, for a class
    model, the encoder ``text_encoder_from`` (:func:`start_text_stream`; a resume loads its checkpoint over them).
    With ``teacher`` (a text model's export or pipeline folder) the run distils the teacher's guidance at
    ``teacher_cfg`` into a student started from it (``init_from`` does not apply). The EMA model is exported to
    ``run_dir/export`` (``text_encoder/``, ``blockdiff/``)."""
    run_dir = Path(run_dir)
    teacher_model = None
    if teacher is not None:
        if not teacher_cfg > 1.0:
            raise ValueError(f"guidance distillation needs a teacher CFG scale > 1, got {teacher_cfg}")
        net = start_text_stream(teacher)
        if not net.model.is_text:
            raise CheckpointError(f"{teacher} holds a class model; a student distils a text teacher")
        teacher_model = net.model.to(train.device).eval().requires_grad_(False)
        student = BlockDiffusionTransformer(replace(teacher_model.config, class_dropout_prob=0.0))
        student.load_state_dict(teacher_model.state_dict())
        net = TextStreamModel(net.text_encoder.requires_grad_(False), student)
    else:
        recipe = replace(recipe, rollout_share=0.0, switch_share=0.0)
        torch.manual_seed(train.seed)  # the text model's own tensors and the new words' rows
        net = start_text_stream(init_from, text_encoder_from)
    config = net.model.config
    load_kl(tokenizer_dir).check_latent_frames(config.frame_size, config.channels)
    latents, captions = cached_moving_latents(tokenizer_dir, data_dir, recipe.num_clips, run_dir, "train", scenes,
                                              workers, device=train.device)
    started = latest_checkpoint(run_dir) is None
    source = load_blockdiff(model_folders(init_from)[0]) if teacher is None and started else None
    fitted = None
    if source is not None and not source.is_text and recipe.caption_pool == "fitted":  # each caption's shape's row
        shapes = cached_moving_scenes(data_dir, "train", recipe.num_clips, scenes)[2][:, ATTRIBUTES.index("shape")]
        fitted = fit_caption_pool(net.model, source, net.text_encoder, captions, shapes)
    if latents.shape[1] < config.train_frames:
        raise ValueError(f"clips of {latents.shape[1]} frames do not fit a model of {config.train_frames} frames")
    word_ids = net.text_encoder.tokenize(captions)
    trainer = Trainer(net, train, run_dir, recipe, TrainingData.of(data_dir, scenes, latents, word_ids))
    model, encoder = trainer.model.model, trainer.model.text_encoder
    if started:  # the log says what the run started from
        trainer.log({"step": 0, "init_from": str(teacher if teacher is not None else init_from),
                     **({"teacher_cfg": teacher_cfg} if teacher_model is not None else {}),
                     **({"caption_pool_fit": fitted} if fitted is not None else {})})
    fpb = config.frames_per_block
    rollouts = None
    if recipe.rollout_share:  # streams whose context (a sink block and a window) fills the trained frames
        rollouts = TextRollouts(model, StreamConfig(steps=recipe.rollout_steps, sink_frames=fpb,
                                                    window_frames=config.train_frames - 2 * fpb),
                                recipe.batch_size, recipe.rollout_blocks, encoder, captions, recipe.switch_share)

    def step_fn(idx: torch.Tensor) -> tuple[torch.Tensor, dict]:
        if rollouts is not None and bool(torch.rand(()) < recipe.rollout_share):
            clip, prompts, switched = rollouts.next_prompts()
            cond = encoder.condition(prompts)
            loss, metrics = guidance_distillation_loss(model, teacher_model, clip, cond, 0.0, teacher_cfg,
                                                       recipe.noise_shift, context_blocks=clip.shape[1] // fpb - 1)
            return loss, {**metrics, "lone_blocks": 0.0, "rollout": 1.0, "switched": float(switched)}
        order = idx.sort().values
        frames = random_windows(torch.from_numpy(np.asarray(latents[order.numpy()], dtype=np.float32)),
                                config.train_frames).to(train.device)
        words = word_ids[order].to(train.device)
        lone = bool(torch.rand(()) < recipe.lone_block_share)
        if lone:  # each block its own window, under its clip's caption
            frames, rows = lone_blocks(frames, torch.arange(len(frames), device=frames.device), fpb)
            words = words[rows]
        if teacher_model is None:
            loss, metrics = diffusion_forcing_loss(model, frames, encoder(words), recipe.clean_prob,
                                                   recipe.noise_shift)
        else:
            loss, metrics = guidance_distillation_loss(model, teacher_model, frames, encoder(words),
                                                       recipe.clean_prob, teacher_cfg, recipe.noise_shift)
        return loss, {**metrics, "lone_blocks": float(lone), "rollout": 0.0, "switched": 0.0}

    trainer.fit(index_batches(len(latents), recipe.batch_size, train.seed, trainer.step), step_fn, max_minutes)
    export(trainer.ema.model, run_dir / "export")
    return trainer.ema.model
