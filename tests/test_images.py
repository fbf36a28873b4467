"""Image conversions: pixels in [-1, 1] map to uint8 as LlamaGen maps them, and grids tile row-major, with
captions written under the pictures when asked."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vgen.images import MARGIN, captioned_grid, image_grid, tensor_to_pil, to_uint8


def test_to_uint8_clamps_and_rounds_like_llamagen():
    assert to_uint8(torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0])).tolist() == [0, 0, 128, 255, 255]


def test_tensor_to_pil_gives_one_rgb_image_per_sample():
    images = tensor_to_pil(torch.zeros(2, 3, 4, 5))
    assert [im.size for im in images] == [(5, 4), (5, 4)] and images[0].mode == "RGB"
    assert np.array(images[1]).max() == 128


def test_image_grid_tiles_row_major():
    ims = [Image.new("RGB", (2, 2), (i * 40, 0, 0)) for i in range(5)]
    grid = image_grid(ims, cols=3)
    assert grid.size == (6, 4)
    assert grid.getpixel((4, 0))[0] == 80 and grid.getpixel((2, 2))[0] == 160


def test_captioned_grid_scales_each_image_and_writes_its_caption_beneath():
    ims = [Image.new("RGB", (4, 4), (200, 0, 0)), Image.new("RGB", (4, 4), (0, 0, 200))]
    grid = captioned_grid(ims, ["a red square", "a blue square on a long striped background " * 4], cols=2, cell=40)
    tile_w, tile_h = grid.size[0] // 2, grid.size[1]
    assert tile_w == 40 + 2 * MARGIN and tile_h > 40 + MARGIN
    assert grid.getpixel((MARGIN + 20, MARGIN + 20)) == (200, 0, 0)
    assert grid.getpixel((tile_w + MARGIN + 20, MARGIN + 20)) == (0, 0, 200)
    text = np.array(grid)[MARGIN + 40:, :tile_w]
    assert (text < 128).any(), "the caption is drawn in dark pixels under the image"
    blank = captioned_grid(ims[:1], [""], cols=1, cell=40)
    assert (np.array(blank)[MARGIN + 40:] == 255).all()
    large = captioned_grid([Image.new("RGB", (64, 64))], ["kept at its size"], cols=1, cell=40)
    assert large.size[0] == 64 + 2 * MARGIN  # never shrunk below its own width


def test_captioned_grid_needs_one_caption_per_image():
    with pytest.raises(ValueError, match="2 images but 1 captions"):
        captioned_grid([Image.new("RGB", (4, 4))] * 2, ["one"], cols=2)
