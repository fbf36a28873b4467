"""Image conversions: pixels in [-1, 1] map to uint8 as LlamaGen maps them, and grids tile row-major."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from vgen.images import image_grid, tensor_to_pil, to_uint8


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
