"""The streaming video pipeline: a block-diffusion model (``blockdiff/`` in a pipeline folder) behind
``pipe.stream(...)``, which yields each block's frames as soon as they are denoised, and ``pipe(...)`` for whole
clips. The folder's ``pipeline.json`` ``defaults`` hold the recommended :class:`StreamConfig` settings. A model
that denoises a KL tokenizer's latent frames has that tokenizer beside it (``kl/``), which decodes each block.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch

from vgen.hub import PIPELINE_CONFIG, save_pretrained
from vgen.models.blockdiff import BlockDiffusionTransformer
from vgen.pipelines.image import PipelineInfo
from vgen.pipelines.inputs import (
    DEFAULT_BATCH_SIZE,
    ClassConditional,
    ClassLabel,
    check_batch_size,
    check_count,
    check_generator,
    check_output_size,
    check_seed,
)
from vgen.samplers.options import merge_settings
from vgen.samplers.streaming import BlockStreamer, StreamBlock, StreamConfig, StreamControl, StreamProfile
from vgen.tokenizers.kl import KLTokenizer

MODEL_FOLDER = "blockdiff"
TOKENIZER_FOLDER = "kl"
STREAM_OPTIONS = tuple(f.name for f in fields(StreamConfig))


@dataclass
class StreamOutput:
    """Whole streamed clips (uint8 [B, T, S, S, 3]), the class ids asked for, and the profiling report of
    :class:`~vgen.samplers.streaming.StreamProfile` (speeds are per stream: all rows advance together)."""

    videos: np.ndarray
    class_ids: list[int]
    profile: dict


class StreamPipeline(ClassConditional):
    """Class-conditional video streaming of unbounded length from a block-diffusion model. ``batch_size`` (a
    call's default, :data:`~vgen.pipelines.inputs.DEFAULT_BATCH_SIZE` unless set) is the most streams drawn at
    once: :meth:`stream_blocks` refuses more, ``pipe(...)`` draws more in chunks of that many."""

    def __init__(self, model: BlockDiffusionTransformer, info: PipelineInfo,
                 tokenizer: KLTokenizer | None = None, batch_size: int = DEFAULT_BATCH_SIZE) -> None:
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
        self.model, self.info, self.batch_size = model.eval(), info, batch_size
        self.tokenizer = None if tokenizer is None else tokenizer.eval()

    @property
    def num_classes(self) -> int:
        return self.model.num_classes

    @property
    def frames_per_block(self) -> int:
        return self.model.frames_per_block

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def to(self, device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> StreamPipeline:
        self.model.to(device=device, dtype=dtype)
        if self.tokenizer is not None:
            self.tokenizer.to(device=device, dtype=dtype)
        return self

    def stream_config(self, **options) -> StreamConfig:
        """The pipeline's defaults overridden by the options given (None means: keep the default)."""
        unknown = set(options) - set(STREAM_OPTIONS)
        if unknown:
            raise ValueError(f"unknown stream options {sorted(unknown)}; known: {list(STREAM_OPTIONS)}")
        return StreamConfig(**merge_settings(self.info.defaults, options))

    def stream_blocks(self, class_ids: Sequence[ClassLabel] | ClassLabel = 0, num_frames: int = 16, *,
                      seed: int | None = 0, control: StreamControl | None = None, progress: bool = False,
                      batch_size: int | None = None, generator: torch.Generator | None = None,
                      **options) -> Iterator[StreamBlock]:
        """Every block of ``len(class_ids)`` streams (class ids or names), all advancing together, with their
        timing (see :class:`StreamBlock`); at most ``batch_size`` streams (default: the pipeline's). ``generator``
        (default: a fresh one seeded with ``seed``) draws the noise. The arguments are checked here, before the
        first block is asked for."""
        size = self.batch_size if batch_size is None else batch_size
        check_batch_size(size)
        ids = self.class_list(class_ids)
        if len(ids) > size:
            raise ValueError(f"{len(ids)} streams are more than batch_size {size} drawn at once: pass a larger "
                             f"batch_size, or call the pipeline, which draws whole clips in chunks")
        check_count("num_frames", num_frames)
        check_seed(seed)
        check_generator(generator, self.device)
        if control is not None and not isinstance(control, StreamControl):
            raise ValueError(f"control must be a StreamControl (or None), got {type(control).__name__}")
        streamer = BlockStreamer(self.model, self.stream_config(**options),
                                 None if self.tokenizer is None else self.tokenizer.decode_frames)
        return streamer.stream(ids, int(num_frames), seed=None if seed is None else int(seed), generator=generator,
                               control=control, progress=progress)

    def stream(self, class_id: ClassLabel = 0, num_frames: int = 16, *, seed: int | None = 0,
               control: StreamControl | None = None, progress: bool = False, **options) -> Iterator[np.ndarray]:
        """Yield one video's frames block by block, uint8 [F, S, S, 3], as soon as each block is denoised;
        ``progress=True`` shows a tqdm bar of the frames on stderr."""
        for block in self.stream_blocks([class_id], num_frames, seed=seed, control=control, progress=progress,
                                        **options):
            yield block.frames[0]

    def __call__(self, class_ids: Sequence[ClassLabel] | ClassLabel | None = None, num_frames: int = 16, *,
                 seed: int | None = 0, progress: bool = False, batch_size: int | None = None,
                 **options) -> StreamOutput:
        """Whole clips, one per class id or name (every class when None), with the profiling report. More clips
        than ``batch_size`` (default: the pipeline's) are streamed in chunks of that many, one chunk after the
        other with one generator (a call of at most ``batch_size`` clips is one stream of them all); the profile
        then lists every chunk's blocks in turn. Clips whose frames would take more than
        :data:`~vgen.pipelines.inputs.MAX_OUTPUT_BYTES` are refused before any is drawn."""
        size = self.batch_size if batch_size is None else batch_size
        check_batch_size(size)
        ids = self.class_list(class_ids)
        check_count("num_frames", num_frames)
        check_output_size(len(ids), int(num_frames), self.info.image_size, "clips")
        check_seed(seed)
        generator = torch.Generator(device=self.device).manual_seed(0 if seed is None else int(seed))
        profile = StreamProfile(self.frames_per_block)
        clips = []
        for start in range(0, len(ids), int(size)):
            blocks = []
            for block in self.stream_blocks(ids[start:start + int(size)], num_frames, progress=progress,
                                            batch_size=size, generator=generator, **options):
                profile.add(block)
                blocks.append(block.frames)
            clips.append(np.concatenate(blocks, axis=1))
        return StreamOutput(np.concatenate(clips), ids, profile.report())

    def save_pretrained(self, path: str | Path, dtype: torch.dtype | None = None) -> Path:
        path = Path(path)
        save_pretrained(self.model, path / MODEL_FOLDER, dtype=dtype)
        if self.tokenizer is not None:
            save_pretrained(self.tokenizer, path / TOKENIZER_FOLDER, dtype=dtype)
        (path / PIPELINE_CONFIG).write_text(json.dumps(self.info.to_dict(), indent=1))
        return path

