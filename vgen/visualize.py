"""Pictures of how a sampler worked: the acceptance map of speculative decoding.

For each image, a map of its token grid in which every token is coloured by the target forward pass that
produced it (early passes dark blue, late ones yellow), with borders between tokens produced by different
passes, so the runs of tokens accepted together stand out. Vanilla AR gives a smooth raster gradient; a good
speculative sampler gives long runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

# a few anchors of the viridis colour map, interpolated linearly
_ANCHORS = np.array([[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]], dtype=np.float64)


def colormap(values: np.ndarray) -> np.ndarray:
    """RGB uint8 [..., 3] for values in [0, 1]."""
    x = np.clip(values, 0, 1) * (len(_ANCHORS) - 1)
    lo = np.minimum(np.floor(x).astype(int), len(_ANCHORS) - 2)
    t = (x - lo)[..., None]
    return ((1 - t) * _ANCHORS[lo] + t * _ANCHORS[lo + 1]).round().astype(np.uint8)


def acceptance_map(accept_step: torch.Tensor, grid: tuple[int, int], size: int, last_pass: int | None = None
                   ) -> Image.Image:
    """A ``size`` x ``size`` picture of one sample's ``accept_step`` [h*w] (1-based pass per token)."""
    steps = accept_step.reshape(grid).cpu().numpy()
    last = last_pass or int(steps.max())
    cell = max(1, size // max(grid))
    rgb = colormap((steps - 1) / max(last - 1, 1))
    big = np.repeat(np.repeat(rgb, cell, axis=0), cell, axis=1)
    change_right = steps[:, 1:] != steps[:, :-1]
    change_down = steps[1:, :] != steps[:-1, :]
    for r, c in zip(*np.nonzero(change_right)):
        big[r * cell:(r + 1) * cell, (c + 1) * cell - 1:(c + 1) * cell + 1] = 255
    for r, c in zip(*np.nonzero(change_down)):
        big[(r + 1) * cell - 1:(r + 1) * cell + 1, c * cell:(c + 1) * cell] = 255
    return Image.fromarray(big).resize((size, size), Image.NEAREST)


def acceptance_figure(images: Sequence[Image.Image], accept_step: torch.Tensor, grid: tuple[int, int],
                      cols: int = 4, min_size: int = 128) -> Image.Image:
    """Each image beside its acceptance map, ``cols`` pairs per row, one colour scale for the whole batch; small
    images are enlarged (nearest neighbour) to ``min_size`` so the token cells stay visible."""
    if len(images) != accept_step.shape[0]:
        raise ValueError(f"{len(images)} images but acceptance data for {accept_step.shape[0]}")
    size = max(images[0].size[0], min_size)
    last = int(accept_step.max())
    rows = (len(images) + cols - 1) // cols
    gap = max(2, size // 16)
    out = Image.new("RGB", (cols * (2 * size + gap) - gap, rows * (size + gap) - gap), (255, 255, 255))
    for i, image in enumerate(images):
        x, y = (i % cols) * (2 * size + gap), (i // cols) * (size + gap)
        out.paste(image.resize((size, size), Image.NEAREST), (x, y))
        out.paste(acceptance_map(accept_step[i], grid, size, last), (x + size, y))
    return out
