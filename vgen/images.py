"""Image conversions shared by pipelines, evaluation, video writing and the apps: generated pixels in [-1, 1]
to uint8 arrays and PIL images, and the tiling of equally sized pictures into one grid (optionally with each
picture's prompt written under it)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

MARGIN = 4  # white pixels around each captioned tile
CAPTION_WIDTH = 160  # pixels: a captioned image is enlarged to at least this width so that its words fit


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


def captioned_grid(images: Sequence[Image.Image], captions: Sequence[str], cols: int, cell: int = CAPTION_WIDTH,
                   font_size: int = 12, lines: int = 4) -> Image.Image:
    """Tile images row-major, each at least ``cell`` pixels wide (smaller ones enlarged, larger ones kept) with its
    caption wrapped beneath it in up to ``lines`` lines (a longer caption ends in an ellipsis), so a grid of prompts
    reads without a legend."""
    if len(captions) != len(images):
        raise ValueError(f"{len(images)} images but {len(captions)} captions")
    if not images:
        raise ValueError("no images to tile")
    font = ImageFont.load_default(size=font_size)
    w, h = images[0].size
    cell = max(cell, w)
    chars = max(8, int(cell / (0.55 * font_size)))
    height = round(h * cell / w)
    line_height = font_size + 2
    text_height = lines * line_height + 6
    tiles = []
    for image, text in zip(images, captions):
        tile = Image.new("RGB", (cell + 2 * MARGIN, height + text_height + MARGIN), (255, 255, 255))
        tile.paste(image.convert("RGB").resize((cell, height), Image.NEAREST), (MARGIN, MARGIN))
        wrapped = textwrap.wrap(text, chars, max_lines=lines, placeholder=" ...")
        draw = ImageDraw.Draw(tile)
        for i, line in enumerate(wrapped):
            xy = (MARGIN + cell // 2, MARGIN + height + 3 + i * line_height)
            draw.text(xy, line, fill=(0, 0, 0), font=font, anchor="mt")
        tiles.append(tile)
    return image_grid(tiles, cols)
