"""Image conversions shared by pipelines, evaluation, video writing and the apps: generated pixels in [-1, 1]
to uint8 arrays and PIL images, and the tiling of equally sized pictures into one grid."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """Pixels in [-1, 1] (any layout) -> uint8 (LlamaGen's mapping: clamp(127.5 x + 128))."""
    return (images.float() * 127.5 + 128.0).clamp(0, 255).to(torch.uint8).cpu().numpy()


def tensor_to_pil(images: torch.Tensor) -> list[Image.Image]:
    """[B, 3, H, W] in [-1, 1] -> PIL images."""
    return [Image.fromarray(a) for a in to_uint8(images.permute(0, 2, 3, 1))]


def image_grid(images: Sequence[Image.Image], cols: int) -> Image.Image:
    """Tile equally sized images row-major into one picture."""
    if not images:
        raise ValueError("no images to tile")
    w, h = images[0].size
    rows = (len(images) + cols - 1) // cols
    grid = Image.new("RGB", (cols * w, rows * h), (255, 255, 255))
    for i, im in enumerate(images):
        grid.paste(im, ((i % cols) * w, (i // cols) * h))
    return grid
