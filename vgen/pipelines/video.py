"""Video pipelines: a backbone over a frames x rows x columns token grid + a per-frame VQ tokenizer + a sampler
-> uint8 clips [T, H, W, 3], behind the same ``__call__`` and folder layout as :class:`~vgen.pipelines.ImagePipeline`.

Each frame is tokenised on its own (per-frame VQ), so a clip's raster tokens are ``T`` frames of ``h x w`` codes
and decoding is the image tokenizer's, frame by frame. :func:`vgen.pipelines.load` returns a ``VideoPipeline``
for any pipeline folder whose backbone has a 3-axis grid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from vgen.data.shapes import to_tensor
from vgen.images import image_grid, tensor_to_pil
from vgen.pipelines.image import ImagePipeline, PipelineInfo
from vgen.samplers import SamplerStats


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
                 draft_head: torch.nn.Module | None = None) -> None:
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
        self.prompt_encoder = self.text_encoder = None  # class-conditional: no prompts

    @property
    def num_frames(self) -> int:
        return self.model.grid[0]

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor) -> list[np.ndarray]:
        """Token grids [B, T*h*w] -> clips, each uint8 [T, H, W, 3] (frame by frame through the VQ decoder)."""
        t, h, w = self.model.grid
        codes = tokens.to(next(self.tokenizer.parameters()).device).reshape(len(tokens) * t, h * w)
        frames = np.stack([np.asarray(im) for im in tensor_to_pil(self.tokenizer.decode_code(codes, (h, w)))])
        return list(frames.reshape(len(tokens), t, *frames.shape[1:]))

    def __call__(self, class_ids: Sequence[int] | int | None = None, *, num_videos: int | None = None,
                 context: np.ndarray | None = None, **kwargs) -> VideoOutput:
        """One clip per entry of ``class_ids`` (repeated ``num_videos`` times if given); the other arguments are
        :meth:`ImagePipeline.__call__`'s (sampler, seed, generator, sampling settings, progress).

        ``context``: given first frames, uint8 [k, H, W, 3] for every clip or [B, k, H, W, 3] one set per clip
        (0 < k < the model's frames). They are tokenised frame by frame and the model continues them (NBP's frame
        prediction); the clips returned start with their reconstruction.
        """
        classes = self.class_list(class_ids, num_videos)
        prefix = None
        if context is not None:
            prefix = self.context_tokens(context)
            if len(prefix) == 1:
                prefix = prefix.expand(len(classes), -1)
            elif len(prefix) != len(classes):
                raise ValueError(f"context holds frames for {len(prefix)} clips, but {len(classes)} clips are asked "
                                 f"for")
        out = super().__call__(classes, prefix=prefix, **kwargs)
        return VideoOutput(np.stack(out.images), out.tokens, out.class_ids, out.stats)

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


def tile_clips(videos: np.ndarray, cols: int) -> np.ndarray:
    """Clips [B, T, H, W, 3] side by side in a grid of ``cols`` columns: one clip [T, rows*H, cols*W, 3]."""
    if cols < 1:
        raise ValueError(f"cols must be >= 1, got {cols}")
    return np.stack([np.asarray(image_grid([Image.fromarray(v[t]) for v in videos], cols))
                     for t in range(videos.shape[1])])
