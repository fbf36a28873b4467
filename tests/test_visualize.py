"""Acceptance maps: one colour per forward pass (dark early, bright late), white borders between passes; scatter
plots: round ticks, and each marker where its data coordinates say. An acceptance figure's colour bar under it
says which pass each colour stands for."""

import numpy as np
import pytest
import torch
from PIL import Image

from vgen.visualize import (
    LEGEND_HEIGHT,
    LEGEND_INSET,
    PALETTE,
    PlotAxes,
    acceptance_figure,
    acceptance_map,
    clip_acceptance_figure,
    colormap,
    nice_ticks,
    scatter_plot,
)


def test_colormap_runs_from_dark_purple_to_yellow() -> None:
    ends = colormap(np.array([0.0, 1.0]))
    assert ends[0].tolist() == [68, 1, 84] and ends[1].tolist() == [253, 231, 37]
    assert colormap(np.array([0.5]))[0].sum() > ends[0].sum()


def test_tokens_of_one_pass_share_a_colour_and_passes_are_outlined() -> None:
    steps = torch.tensor([1, 1, 2, 2, 1, 1, 2, 3, 3, 3, 3, 3, 4, 4, 4, 4])  # a 4 x 4 grid
    pixels = np.asarray(acceptance_map(steps, (4, 4), size=32))  # 8 px per token
    centre = lambda r, c: tuple(pixels[r * 8 + 3, c * 8 + 3])
    assert centre(0, 0) == centre(0, 1) == centre(1, 1) and centre(0, 2) == centre(1, 2)
    assert centre(0, 0) != centre(0, 2) != centre(3, 0)
    assert tuple(pixels[3, 15]) == (255, 255, 255)  # border between pass 1 (column 1) and pass 2 (column 2)
    assert tuple(pixels[3, 7]) != (255, 255, 255)  # no border inside a pass


def test_figure_puts_each_image_beside_its_map() -> None:
    images = [Image.new("RGB", (16, 16), (i * 50, 0, 0)) for i in range(3)]
    steps = torch.arange(1, 17).repeat(3, 1)
    figure = acceptance_figure(images, steps, (4, 4), cols=2, min_size=16)
    assert figure.size == (2 * 32 + 2, 2 * 16 + 2 + LEGEND_HEIGHT)
    assert figure.getpixel((0, 0)) == (0, 0, 0) and figure.getpixel((34, 0)) == (50, 0, 0)
    with pytest.raises(ValueError, match="3 images but acceptance data for 2"):
        acceptance_figure(images, steps[:2], (4, 4))
    assert acceptance_figure(images, steps, (4, 4), cols=1).size == (2 * 128, 3 * 128 + 2 * 8 + LEGEND_HEIGHT)


def test_a_clip_figure_puts_each_frame_above_its_map_on_one_colour_scale() -> None:
    videos = np.zeros((2, 3, 16, 16, 3), dtype=np.uint8)
    videos[1, 2] = 200  # clip 1, frame 2
    steps = torch.arange(1, 13).repeat(2, 1)  # 12 tokens each: 3 frames of 2 x 2, one pass per token
    figure = clip_acceptance_figure(videos, steps, (3, 2, 2), min_size=16)
    assert figure.size == (3 * 16 + 2 * 2, 2 * (2 * 16 + 2 * 2) - 2 * 2 + LEGEND_HEIGHT)
    assert figure.getpixel((2 * 18, 36)) == (200, 200, 200)  # clip 1's frame 2, top left
    first = np.asarray(acceptance_map(steps[0, :4], (2, 2), 16, last_pass=12))
    np.testing.assert_array_equal(np.asarray(figure)[17:33, :16], first)  # frame 0's map under it, scale 1..12
    with pytest.raises(ValueError, match="2 clips but acceptance data for 1"):
        clip_acceptance_figure(videos, steps[:1], (3, 2, 2))


@pytest.mark.parametrize("last", [1, 2, 16, 89])
def test_the_legend_under_a_figure_runs_from_pass_1_to_its_last_pass_in_the_maps_colours(last) -> None:
    images = [Image.new("RGB", (16, 16))]
    steps = torch.linspace(1, last, 16).round().long()[None]
    figure = acceptance_figure(images, steps, (4, 4), cols=1, min_size=64)
    bar = np.asarray(figure)[64 + 22]  # a row through the colour bar
    assert figure.size == (128, 64 + LEGEND_HEIGHT)
    assert tuple(bar[LEGEND_INSET]) == tuple(colormap(np.array([0.0]))[0])  # pass 1's colour at the left end
    right = colormap(np.array([1.0 if last > 1 else 0.0]))[0]
    assert tuple(bar[128 - LEGEND_INSET - 1]) == tuple(right)  # the last pass's at the right end
    right_map = np.asarray(figure)[:64, 64:]
    assert tuple(right_map[2, 2]) == tuple(bar[LEGEND_INSET])  # the map's first token: pass 1


@pytest.mark.parametrize("lo, hi, expected", [
    (0.0, 1.0, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]),
    (0.93, 4.07, [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]),
    (14.298, 14.322, [14.3, 14.305, 14.31, 14.315, 14.32]),
    (-3.0, 12.0, [-2.5, 0.0, 2.5, 5.0, 7.5, 10.0]),
])
def test_ticks_are_round_numbers_inside_the_range(lo, hi, expected):
    assert nice_ticks(lo, hi) == pytest.approx(expected)


def test_each_marker_lands_where_its_coordinates_say():
    points = [("ar", 1.0, 10.0), ("fast", 3.0, 20.0), ("mid", 2.0, 12.0)]
    image = scatter_plot(points, "speed", "FID", "title", size=(400, 300))
    axes = PlotAxes.fit([1.0, 3.0, 2.0], [10.0, 20.0, 12.0], (400, 300))
    assert image.size == (400, 300) and axes.xlim == pytest.approx((0.8, 3.2)) and axes.ylim == pytest.approx((9, 21))
    left, top, right, bottom = axes.box
    assert axes.pixel(0.8, 9) == (left, bottom) and axes.pixel(3.2, 21) == (right, top)
    for i, (_, x, y) in enumerate(points):
        assert image.getpixel(axes.pixel(x, y)) == PALETTE[i]
    assert image.getpixel((left, (top + bottom) // 2)) == (0, 0, 0)  # the frame


def test_a_single_point_gets_a_range_and_no_points_is_an_error():
    image = scatter_plot([("only", 2.0, 5.0)], "x", "y")
    axes = PlotAxes.fit([2.0], [5.0], image.size)
    assert image.getpixel(axes.pixel(2.0, 5.0)) == PALETTE[0]
    with pytest.raises(ValueError, match="no points to plot"):
        scatter_plot([], "x", "y")


def test_line_plot_draws_each_series_in_its_colour() -> None:
    from vgen.visualize import PALETTE, line_plot

    image = line_plot({"rising": [0.0, 1.0, 2.0], "flat": [1.0, 1.0, 1.0]}, "chunk", "value", "two lines")
    pixels = {colour for _, colour in image.getcolors(maxcolors=1 << 20)}
    assert PALETTE[0] in pixels and PALETTE[1] in pixels
    with pytest.raises(ValueError, match="no series"):
        line_plot({}, "x", "y")
