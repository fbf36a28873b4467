"""The streaming video pipeline: a block-diffusion model (``blockdiff/`` in a pipeline folder) behind
``pipe.stream(...)``, which yields each block's frames as soon as they are denoised, and ``pipe(...)`` for whole
clips. The folder's ``pipeline.json`` ``defaults`` hold the recommended :class:`StreamConfig` settings. A model
that denoises a KL tokenizer's latent frames has that tokenizer beside it (``kl/``), which decodes each block. A
prompt-conditioned model has its text encoder beside it (``text_encoder/``) and ``example_prompts`` in
``pipeline.json``; a class model streams class ids or names. ``switches`` ({frame: class or prompt}) change what
every stream shows from the block holding the frame on, as ``StreamConfig.switch`` says (LongLive's KV re-cache
by default).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch

from vgen.hub import PIPELINE_CONFIG, save_pretrained
from vgen.models.blockdiff import BlockDiffusionTransformer
from vgen.models.text_encoder import check_caption_dim
from vgen.models.word_encoder import WordTextEncoder
from vgen.pipelines.image import TEXT_ENCODER_FOLDER, PipelineInfo
from vgen.pipelines.inputs import (
    DEFAULT_BATCH_SIZE,
    ClassConditional,
    ClassLabel,
    SwitchTarget,
    check_batch_size,
    check_count,
    check_generator,
    check_output_size,
    check_prompts,
    check_seed,
    check_switches,
)
from vgen.samplers.options import merge_settings
from vgen.samplers.streaming import BlockStreamer, StreamBlock, StreamConfig, StreamControl, StreamProfile, Target
from vgen.tokenizers.kl import KLTokenizer

MODEL_FOLDER = "blockdiff"
TOKENIZER_FOLDER = "kl"
STREAM_OPTIONS = tuple(f.name for f in fields(StreamConfig))


@dataclass
class StreamOutput:
    """Whole streamed clips (uint8 [B, T, S, S, 3]), the class ids asked for (a class model) or the prompts (a text
    model; ``class_ids`` is then empty), and the profiling report of
    :class:`~vgen.samplers.streaming.StreamProfile` (speeds are per stream: all rows advance together)."""

    videos: np.ndarray
    class_ids: list[int]
    profile: dict
    prompts: list[str] | None = None


class StreamPipeline(ClassConditional):
    """Video streaming of unbounded length from a block-diffusion model, conditioned on a class or (a model with
    its ``text_encoder``) on a prompt. ``batch_size`` (a call's default,
    :data:`~vgen.pipelines.inputs.DEFAULT_BATCH_SIZE` unless set) is the most streams drawn at once:
    :meth:`stream_blocks` refuses more, ``pipe(...)`` draws more in chunks of that many."""

    def __init__(self, model: BlockDiffusionTransformer, info: PipelineInfo,
                 tokenizer: KLTokenizer | None = None, text_encoder: WordTextEncoder | None = None,
                 batch_size: int = DEFAULT_BATCH_SIZE) -> None:
        check_batch_size(batch_size)
        c = model.config
        if tokenizer is not None:
            tokenizer.check_latent_frames(c.frame_size, c.channels)
        elif c.channels != 3:
            raise ValueError(f"the model denoises {c.channels}-channel latent frames: it needs its KL tokenizer")
        size = c.frame_size if tokenizer is None else tokenizer.config.image_size
        if info.image_size != size:
            raise ValueError(f"frame size {info.image_size} does not match the model's {size}")
        unknown = set(info.defaults) - set(STREAM_OPTIONS)
        if unknown:
            raise ValueError(f"unknown stream defaults {sorted(unknown)}; known: {list(STREAM_OPTIONS)}")
        if model.is_text:
            if text_encoder is None:
                raise ValueError(f"the model is prompt-conditioned: it needs its text encoder ({TEXT_ENCODER_FOLDER}/)")
            check_caption_dim(text_encoder.caption_dim, c.text_dim)
            if text_encoder.max_length > c.text_tokens:
                raise ValueError(f"the text encoder gives captions of {text_encoder.max_length} positions, more than "
                                 f"the model's text_tokens {c.text_tokens}")
        elif text_encoder is not None:
            raise ValueError("the model is class-conditional: it takes no text encoder")
        self.model, self.info, self.batch_size = model.eval(), info, batch_size
        self.tokenizer = None if tokenizer is None else tokenizer.eval()
        self.text_encoder = None if text_encoder is None else text_encoder.eval()

    @property
    def num_classes(self) -> int:
        return self.model.num_classes

    @property
    def is_text(self) -> bool:
        """Whether the pipeline streams prompts (else class ids or names)."""
        return self.model.is_text

    @property
    def example_prompts(self) -> list[str]:
        """The prompts the folder offers as examples (a text model's), or none."""
        return list(self.info.example_prompts or [])

    @property
    def frames_per_block(self) -> int:
        return self.model.frames_per_block

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def to(self, device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> StreamPipeline:
        """Move the model and tokenizer to a device / dtype; the text encoder moves only (its captions are cast to
        the model's dtype)."""
        self.model.to(device=device, dtype=dtype)
        if self.tokenizer is not None:
            self.tokenizer.to(device=device, dtype=dtype)
        if self.text_encoder is not None:
            self.text_encoder.to(device=device)
        return self

    def stream_config(self, **options) -> StreamConfig:
        """The pipeline's defaults overridden by the options given (None means: keep the default)."""
        unknown = set(options) - set(STREAM_OPTIONS)
        if unknown:
            raise ValueError(f"unknown stream options {sorted(unknown)}; known: {list(STREAM_OPTIONS)}")
        return StreamConfig(**merge_settings(self.info.defaults, options))

    def targets(self, class_ids: Sequence[ClassLabel] | ClassLabel | None, prompt: str | Sequence[str] | None,
                class_default: bool = False) -> list[Target]:
        """One target per stream: the prompts for a text pipeline, the class ids of ``class_ids`` (ids or names;
        None: every class) for a class pipeline. ``class_default`` says ``class_ids`` holds the call's default
        rather than a class asked for. A prompt for a class pipeline, a class for a text one, a text pipeline
        without a prompt and an empty prompt are each a one-line ValueError."""
        if not self.is_text:
            if prompt is not None:
                raise ValueError(f"{self.info.name} is class-conditional: give class ids or names, not a prompt")
            return list(self.class_list(class_ids))
        if not class_default and class_ids is not None:
            raise ValueError(f"{self.info.name} is prompt-conditioned: give a prompt, not class ids")
        if prompt is None:
            examples = f" (e.g. {self.example_prompts[0]!r})" if self.example_prompts else ""
            raise ValueError(f"{self.info.name} is prompt-conditioned: give a prompt{examples}")
        return list(check_prompts(prompt))

    def switch_list(self, switches: Mapping[int, SwitchTarget] | None,
                    num_frames: int) -> list[tuple[int, Target | list[Target]]]:
        """``switches`` as (frame, target) pairs (:func:`~vgen.pipelines.inputs.check_switches`; a target is one
        for every stream or a list of one per stream): class ids or names resolved to ids for a class pipeline,
        prompts for a text pipeline; the wrong kind is refused."""
        if switches is None:
            return []

        def resolved(frame: int, target: ClassLabel | str) -> Target:
            if not self.is_text:
                return self.class_id(target)
            if not isinstance(target, str):
                raise ValueError(f"switch at frame {frame}: {self.info.name} is prompt-conditioned: give a prompt, "
                                 f"not the class {target!r}")
            return target

        return [(frame, [resolved(frame, t) for t in target] if isinstance(target, list) else resolved(frame, target))
                for frame, target in check_switches(switches, num_frames)]

    def streamer(self, **options) -> BlockStreamer:
        """The block streamer of the pipeline's model, decoder and text encoder under the options given."""
        return BlockStreamer(self.model, self.stream_config(**options),
                             None if self.tokenizer is None else self.tokenizer.decode_frames,
                             encode=None if self.text_encoder is None else self.text_encoder.condition)

    def stream_blocks(self, class_ids: Sequence[ClassLabel] | ClassLabel = 0, num_frames: int = 16, *,
                      prompt: str | Sequence[str] | None = None,
                      switches: Mapping[int, SwitchTarget] | None = None, seed: int | None = 0,
                      control: StreamControl | None = None, progress: bool = False, batch_size: int | None = None,
                      generator: torch.Generator | None = None, **options) -> Iterator[StreamBlock]:
        """Every block of one stream per class id or name (class pipeline) or per prompt (text pipeline: a
        prompt or a list), all advancing together, with their timing (see :class:`StreamBlock`); at most
        ``batch_size`` streams (default: the pipeline's). ``switches`` ({frame: class or prompt, or a list of one
        per stream}) switch the streams before the block holding the frame. ``generator`` (default: a fresh one
        seeded with ``seed``) draws the noise. The arguments are checked here, before the first block is asked
        for."""
        size = self.batch_size if batch_size is None else batch_size
        check_batch_size(size)
        targets = self.targets(class_ids, prompt, class_default=isinstance(class_ids, int) and class_ids == 0)
        if len(targets) > size:
            raise ValueError(f"{len(targets)} streams are more than batch_size {size} drawn at once: pass a larger "
                             f"batch_size, or call the pipeline, which draws whole clips in chunks")
        check_count("num_frames", num_frames)
        pairs = self.switch_list(switches, int(num_frames))
        check_seed(seed)
        check_generator(generator, self.device)
        if control is not None and not isinstance(control, StreamControl):
            raise ValueError(f"control must be a StreamControl (or None), got {type(control).__name__}")
        streamer = self.streamer(**options)
        return streamer.stream(targets, int(num_frames), seed=None if seed is None else int(seed),
                               generator=generator, control=control, progress=progress, switches=pairs)

    def stream(self, class_id: ClassLabel = 0, num_frames: int = 16, *, prompt: str | None = None,
               switches: Mapping[int, ClassLabel | str] | None = None, seed: int | None = 0,
               control: StreamControl | None = None, progress: bool = False, **options) -> Iterator[np.ndarray]:
        """Yield one video's frames block by block, uint8 [F, S, S, 3], as soon as each block is denoised: of a
        class (class pipeline) or a ``prompt`` (text pipeline); ``progress=True`` shows a tqdm bar of the frames
        on stderr."""
        if prompt is not None:
            prompt = check_prompts(prompt, many=False)[0]
        for block in self.stream_blocks(class_id, num_frames, prompt=prompt, switches=switches, seed=seed,
                                        control=control, progress=progress, **options):
            yield block.frames[0]

    def __call__(self, class_ids: Sequence[ClassLabel] | ClassLabel | None = None, num_frames: int = 16, *,
                 prompts: Sequence[str] | None = None, switches: Mapping[int, ClassLabel | str] | None = None,
                 seed: int | None = 0, progress: bool = False, batch_size: int | None = None,
                 **options) -> StreamOutput:
        """Whole clips, one per class id or name (every class when None) or, for a text pipeline, one per prompt
        (its example prompts when None), with the profiling report; ``switches`` apply to every clip. More clips
        than ``batch_size`` (default: the pipeline's) are streamed in chunks of that many, one chunk after the
        other with one generator (a call of at most ``batch_size`` clips is one stream of them all); the profile
        then lists every chunk's blocks in turn. Clips whose frames would take more than
        :data:`~vgen.pipelines.inputs.MAX_OUTPUT_BYTES` are refused before any is drawn."""
        size = self.batch_size if batch_size is None else batch_size
        check_batch_size(size)
        if self.is_text and prompts is None and class_ids is None:
            if not self.example_prompts:
                raise ValueError(f"{self.info.name} is prompt-conditioned and records no example prompts: give "
                                 f"prompts")
            prompts = self.example_prompts
        targets = self.targets(class_ids, prompts)
        check_count("num_frames", num_frames)
        check_output_size(len(targets), int(num_frames), self.info.image_size, "clips")
        self.switch_list(switches, int(num_frames))
        check_seed(seed)
        generator = torch.Generator(device=self.device).manual_seed(0 if seed is None else int(seed))
        profile = StreamProfile(self.frames_per_block)
        text = self.is_text
        clips = []
        for start in range(0, len(targets), int(size)):
            chunk = targets[start:start + int(size)]
            blocks = []
            for block in self.stream_blocks(0 if text else chunk, num_frames, prompt=chunk if text else None,
                                            switches=switches, progress=progress, batch_size=size,
                                            generator=generator, **options):
                profile.add(block)
                blocks.append(block.frames)
            clips.append(np.concatenate(blocks, axis=1))
        return StreamOutput(np.concatenate(clips), [] if text else targets, profile.report(),
                            targets if text else None)

    def save_pretrained(self, path: str | Path, dtype: torch.dtype | None = None) -> Path:
        path = Path(path)
        save_pretrained(self.model, path / MODEL_FOLDER, dtype=dtype)
        if self.tokenizer is not None:
            save_pretrained(self.tokenizer, path / TOKENIZER_FOLDER, dtype=dtype)
        if self.text_encoder is not None:
            save_pretrained(self.text_encoder, path / TEXT_ENCODER_FOLDER, dtype=dtype)
        (path / PIPELINE_CONFIG).write_text(json.dumps(self.info.to_dict(), indent=1))
        return path

