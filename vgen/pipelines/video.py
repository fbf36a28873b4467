"""Video pipelines: a backbone over a frames x rows x columns token grid + a per-frame VQ tokenizer + a sampler
-> uint8 clips [T, H, W, 3], behind the same ``__call__`` and folder layout as :class:`~vgen.pipelines.ImagePipeline`.

Each frame is tokenised on its own (per-frame VQ), so a clip's raster tokens are ``T`` frames of ``h x w`` codes
and decoding is the image tokenizer's, frame by frame. :func:`vgen.pipelines.load` returns a ``VideoPipeline``
for any pipeline folder whose backbone has a 3-axis grid. A clip longer than the backbone's window of frames is
drawn window by window, each continuing the last frames of the one before (a sampler that continues given
tokens: ``nbp``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from vgen.data.shapes import to_tensor
from vgen.images import image_grid, tensor_to_pil
from vgen.pipelines.image import ImagePipeline, PipelineInfo, default_sampler, stacked_stats
from vgen.pipelines.inputs import (
    DEFAULT_BATCH_SIZE,
    ClassLabel,
    check_batch_size,
    check_count,
    check_generator,
    check_output_size,
    check_seed,
)
from vgen.samplers import Sampler, SamplerStats, continuing_samplers, get_sampler


@dataclass
class VideoOutput:
    """Generated clips (uint8 [B, T, H, W, 3]), their tokens [B, T*h*w], the class ids asked for, the stats."""

    videos: np.ndarray
    tokens: torch.Tensor
    class_ids: list[int]
    stats: SamplerStats


class VideoPipeline(ImagePipeline):
    """Class-conditional video generation with a video-grid backbone (e.g. NBP) and a per-frame VQ tokenizer.
    ``info.image_size`` is the frame side in pixels."""

    def __init__(self, model: torch.nn.Module, tokenizer: torch.nn.Module, info: PipelineInfo,
                 draft_head: torch.nn.Module | None = None, batch_size: int = DEFAULT_BATCH_SIZE) -> None:
        check_batch_size(batch_size)
        grid = tuple(model.grid)
        if len(grid) != 3:
            raise ValueError(f"a video pipeline needs a backbone over (frames, rows, columns) tokens, got grid {grid}")
        if draft_head is not None:
            raise ValueError("video pipelines take no drafter")
        if info.image_size != grid[1] * tokenizer.downsample_factor or grid[1] != grid[2]:
            raise ValueError(f"frame size {info.image_size} does not match the model's {grid[1]}x{grid[2]} tokens "
                             f"per frame with a tokenizer downsampling by {tokenizer.downsample_factor}")
        if model.vocab_size != getattr(tokenizer, "codebook_size", None):
            raise ValueError(f"model vocabulary {model.vocab_size} != tokenizer codebook "
                             f"{getattr(tokenizer, 'codebook_size', None)}")
        self.model, self.tokenizer, self.info, self.draft_head = model.eval(), tokenizer.eval(), info, None
        self.prompt_encoder = self.text_encoder = None  # video models are class-conditional
        self.batch_size = batch_size  # clips drawn at once; a larger request is drawn in chunks of this many

    @property
    def num_frames(self) -> int:
        return self.model.grid[0]

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor) -> list[np.ndarray]:
        """Token grids [B, T*h*w] (any whole number of frames) -> clips, each uint8 [T, H, W, 3] (frame by frame
        through the VQ decoder)."""
        _, h, w = self.model.grid
        codes = tokens.to(next(self.tokenizer.parameters()).device).reshape(-1, h * w)
        frames = np.stack([np.asarray(im) for im in tensor_to_pil(self.tokenizer.decode_code(codes, (h, w)))])
        return list(frames.reshape(len(tokens), -1, *frames.shape[1:]))

    def __call__(self, class_ids: Sequence[ClassLabel] | ClassLabel | None = None, **kwargs) -> VideoOutput:
        """One clip per entry of ``class_ids``: :meth:`sample_clip_tokens`'s arguments, the tokens decoded to
        frames chunk by chunk."""
        classes, chunks = self.clip_chunks(class_ids, **kwargs)
        videos, tokens, stats = [], [], []
        for chunk_tokens, chunk_stats in chunks:
            videos += self.decode(chunk_tokens)
            tokens.append(chunk_tokens)
            stats.append(chunk_stats)
        return VideoOutput(np.stack(videos), torch.cat(tokens), classes, stacked_stats(stats))

    @torch.no_grad()
    def sample_clip_tokens(self, class_ids: Sequence[ClassLabel] | ClassLabel | None = None,
                           **kwargs) -> tuple[torch.Tensor, list[int], SamplerStats]:
        """The tokens [B, frames * h * w] of one clip per entry of ``class_ids`` (class ids or names; repeated in
        turn to ``num_videos`` if given), the class ids and the stats; the other arguments are
        :meth:`ImagePipeline.sample_tokens`'s (sampler, sampling settings, progress).

        ``context``: given first frames, uint8 [k, H, W, 3] for every clip or [B, k, H, W, 3] one set per clip
        (0 < k < the model's frames). They are tokenised frame by frame and the model continues them (NBP's frame
        prediction); the clips returned start with their reconstruction.

        ``num_frames`` (default: the model's window of ``T`` frames): clips longer than the window are drawn window
        by window, each window continuing the last ``window_context`` frames of the clip so far (default ``T // 2``)
        and adding ``T - window_context`` new ones, with a sampler that continues given tokens (``nbp``). The stats
        add up the windows' passes, drawn tokens and time.

        ``batch_size`` (default: the pipeline's) bounds the clips drawn at once: a larger request is drawn as
        consecutive chunks of that many clips, every window of a chunk before the next chunk, all from the one
        generator, with the stats of the chunks stacked as :meth:`ImagePipeline.sample_tokens` does.
        """
        classes, chunks = self.clip_chunks(class_ids, **kwargs)
        out = list(chunks)
        return torch.cat([t for t, _ in out]), classes, stacked_stats([s for _, s in out])

    def clip_chunks(self, class_ids: Sequence[ClassLabel] | ClassLabel | None = None, *,
                    num_videos: int | None = None, context: np.ndarray | None = None,
                    num_frames: int | None = None, window_context: int | None = None, seed: int | None = 0,
                    generator: torch.Generator | None = None, batch_size: int | None = None,
                    **kwargs) -> tuple[list[int], Iterator[tuple[torch.Tensor, SamplerStats]]]:
        """:meth:`sample_clip_tokens`'s class ids, checked with every other argument, and an iterator that draws
        the clips chunk by chunk: each chunk's tokens (on the CPU) and stats."""
        size = self.batch_size if batch_size is None else batch_size
        check_batch_size(size)
        if num_frames is not None:
            check_count("num_frames", num_frames)
        total = self.num_frames if num_frames is None else int(num_frames)
        if num_videos is not None:
            check_count("num_videos", num_videos)
            check_output_size(int(num_videos), total, self.info.image_size, "clips")
        classes = self.class_list(class_ids, num_videos, "num_videos")
        check_output_size(len(classes), total, self.info.image_size, "clips")
        keep = self.check_window_context(window_context, total, kwargs.get("sampler"))
        prefix = None
        if context is not None:
            prefix = self.context_tokens(context)
            if len(prefix) == 1:
                prefix = prefix.expand(len(classes), -1)
            elif len(prefix) != len(classes):
                raise ValueError(f"context holds frames for {len(prefix)} clips, but {len(classes)} clips are asked "
                                 f"for")
        check_seed(seed)
        check_generator(generator, self.device)
        if generator is None:  # one stream of draws for every window of every chunk
            generator = torch.Generator(device=self.device).manual_seed(0 if seed is None else int(seed))

        def draw() -> Iterator[tuple[torch.Tensor, SamplerStats]]:
            for start in range(0, len(classes), int(size)):
                rows = slice(start, start + int(size))
                yield self._clips(classes[rows], None if prefix is None else prefix[rows], total, keep, generator,
                                  kwargs)
        return classes, draw()

    def _clips(self, classes: list[int], prefix: torch.Tensor | None, total: int, keep: int,
               generator: torch.Generator, kwargs: dict) -> tuple[torch.Tensor, SamplerStats]:
        """One chunk of clips, window by window: their tokens [B, total * h * w] on the CPU and their stats."""
        one = {**kwargs, "batch_size": len(classes)}
        out, _, _ = self.sample_tokens(classes, prefix=prefix, generator=generator, **one)
        tokens, windows = out.tokens, [out.stats]
        per_frame, window = self.model.grid[1] * self.model.grid[2], self.num_frames
        while tokens.shape[1] < total * per_frame:
            out, _, _ = self.sample_tokens(classes, prefix=tokens[:, -keep * per_frame:], generator=generator, **one)
            tokens = torch.cat([tokens, out.tokens[:, keep * per_frame:]], dim=1)
            windows.append(out.stats)
        stats = windows[0] if len(windows) == 1 else chained_stats(windows, keep * per_frame, window - keep)
        if stats.accept_step is not None:  # the passes of the frames kept
            stats = dataclasses.replace(stats, accept_step=stats.accept_step[:, :total * per_frame])
        return tokens[:, :total * per_frame].cpu(), stats

    def check_window_context(self, window_context: int | None, num_frames: int,
                             sampler: str | Sampler | None) -> int:
        """The frames each later window continues (default: half the window); a clear error for a value outside
        ``1 .. T - 1`` or for clips longer than the window with a sampler that cannot continue given frames."""
        window = self.num_frames
        keep = window // 2 if window_context is None else window_context
        if isinstance(keep, bool) or not isinstance(keep, int) or not 0 < keep < window:
            raise ValueError(f"window_context must be a whole number of frames between 1 and {window - 1} (the model "
                             f"draws {window} frames a window), got {window_context!r}")
        if num_frames > window:
            sampler_obj = get_sampler(sampler or default_sampler(self.model))
            if not sampler_obj.continues:
                raise ValueError(f"{self.info.name} draws {window} frames a window; a {num_frames}-frame clip "
                                 f"continues its last frames window by window, which the {sampler_obj.name!r} "
                                 f"sampler cannot do (samplers that can: {continuing_samplers()})")
        return keep

    @torch.no_grad()
    def context_tokens(self, context: np.ndarray) -> torch.Tensor:
        """Tokens [B, k*h*w] of given frames uint8 [k, H, W, 3] (B = 1) or [B, k, H, W, 3]."""
        frames = np.asarray(context)
        if frames.ndim == 4:
            frames = frames[None]
        size = self.info.image_size
        if frames.ndim != 5 or frames.shape[2:] != (size, size, 3) or frames.dtype != np.uint8:
            raise ValueError(f"context must be uint8 frames [k, {size}, {size}, 3] or [clips, k, {size}, {size}, 3], "
                             f"got {frames.dtype} of shape {frames.shape}")
        if not 0 < frames.shape[1] < self.num_frames:
            raise ValueError(f"context must give between 1 and {self.num_frames - 1} frames of the model's "
                             f"{self.num_frames}, got {frames.shape[1]}")
        tokenizer_device = next(self.tokenizer.parameters()).device
        _, codes, _ = self.tokenizer.encode(to_tensor(frames.reshape(-1, size, size, 3)).to(tokenizer_device))
        return codes.reshape(frames.shape[0], -1).long()


def chained_stats(windows: list[SamplerStats], given: int, new_frames: int) -> SamplerStats:
    """One clip's stats from its windows' (the first whole, each later one drawing all but its ``given`` leading
    tokens): passes, drawn tokens and time add up; each token's pass counts on from the windows before it."""
    first = windows[0]
    steps, passes = [first.accept_step], first.forward_passes
    for stats in windows[1:]:
        steps.append(stats.accept_step[:, given:] + passes)
        passes += stats.forward_passes
    return SamplerStats(sampler=first.sampler, forward_passes=passes, tokens=sum(w.tokens for w in windows),
                        wall_time_s=sum(w.wall_time_s for w in windows), batch_size=first.batch_size,
                        accept_step=torch.cat(steps, dim=1),
                        details={**first.details, "windows": len(windows), "new_frames_per_window": new_frames})


def tile_clips(videos: np.ndarray, cols: int) -> np.ndarray:
    """Clips [B, T, H, W, 3] side by side in a grid of ``cols`` columns: one clip [T, rows*H, cols*W, 3]."""
    if cols < 1:
        raise ValueError(f"cols must be >= 1, got {cols}")
    return np.stack([np.asarray(image_grid([Image.fromarray(v[t]) for v in videos], cols))
                     for t in range(videos.shape[1])])
