"""Pictures of how samplers worked: the acceptance map of speculative decoding, and speed-quality scatter plots.

For each image, a map of its token grid in which every token is coloured by the target forward pass that
produced it (early passes dark blue, late ones yellow), with borders between tokens produced by different
passes, so the runs of tokens accepted together stand out. Vanilla AR gives a smooth raster gradient; a good
speculative sampler gives long runs. A clip gets a row of frames above the row of their maps. A colour bar under
the figure gives the pass number of each colour.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

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


LEGEND_HEIGHT = 44  # pixels of the colour bar under an acceptance figure
LEGEND_INSET = 6  # pixels between the colour bar's ends and the figure's edges


def pass_legend(width: int, last_pass: int) -> Image.Image:
    """A ``width``-pixel colour bar of passes 1 to ``last_pass`` in the maps' colours, round pass numbers under it
    and a title over it."""
    out = Image.new("RGB", (width, LEGEND_HEIGHT), (255, 255, 255))
    draw, font = ImageDraw.Draw(out), ImageFont.load_default(size=11)
    draw.text((LEGEND_INSET, 2), "forward pass that produced the token", fill=(0, 0, 0), font=font)
    left, right, top = LEGEND_INSET, width - LEGEND_INSET - 1, 17
    fractions = np.linspace(0, 1 if last_pass > 1 else 0, max(right - left + 1, 1))
    out.paste(Image.fromarray(np.repeat(colormap(fractions)[None], 10, axis=0)), (left, top))
    ticks = {1, last_pass}
    if last_pass > 2:
        inner = [int(t) for t in nice_ticks(1, last_pass) if t == int(t)]
        ticks |= {t for t in inner if 0.1 < (t - 1) / (last_pass - 1) < 0.9}  # none crowding an end's number
    for tick in sorted(ticks):
        x = left + round((tick - 1) / max(last_pass - 1, 1) * (right - left))
        draw.line([(x, top + 10), (x, top + 12)], fill=(0, 0, 0))
        anchor = "lt" if tick == 1 else "rt" if tick == last_pass else "mt"
        draw.text((x, top + 13), str(tick), fill=(0, 0, 0), font=font, anchor=anchor)
    return out


def with_legend(figure: Image.Image, last_pass: int) -> Image.Image:
    """``figure`` with :func:`pass_legend` under it."""
    out = Image.new("RGB", (figure.width, figure.height + LEGEND_HEIGHT), (255, 255, 255))
    out.paste(figure, (0, 0))
    out.paste(pass_legend(figure.width, last_pass), (0, figure.height))
    return out


def acceptance_figure(images: Sequence[Image.Image], accept_step: torch.Tensor, grid: tuple[int, int],
                      cols: int = 4, min_size: int = 128) -> Image.Image:
    """Each image beside its acceptance map, ``cols`` pairs per row, one colour scale for the whole batch, its
    legend under them (:func:`pass_legend`); small images are enlarged (nearest neighbour) to ``min_size`` so the
    token cells stay visible."""
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
    return with_legend(out, last)


def clip_acceptance_figure(videos: np.ndarray, accept_step: torch.Tensor, grid: tuple[int, int, int],
                           min_size: int = 64) -> Image.Image:
    """Each clip (uint8 [T, H, W, 3] of ``videos``) as a row of its frames above a row of their acceptance maps
    (``accept_step`` [N, T*h*w] over the (frames, rows, columns) ``grid``), one colour scale for all clips, its
    legend under them (:func:`pass_legend`)."""
    if len(videos) != accept_step.shape[0]:
        raise ValueError(f"{len(videos)} clips but acceptance data for {accept_step.shape[0]}")
    frames, rows, cols = grid
    size, last = max(videos.shape[2], min_size), int(accept_step.max())
    gap = max(2, size // 16)
    out = Image.new("RGB", (frames * (size + gap) - gap, len(videos) * (2 * size + 2 * gap) - 2 * gap),
                    (255, 255, 255))
    for i, clip in enumerate(videos):
        y = i * (2 * size + 2 * gap)
        steps = accept_step[i].reshape(frames, rows * cols)
        for t in range(frames):
            x = t * (size + gap)
            out.paste(Image.fromarray(clip[t]).resize((size, size), Image.NEAREST), (x, y))
            out.paste(acceptance_map(steps[t], (rows, cols), size, last), (x, y + size + gap // 2))
    return with_legend(out, last)


# ---------------------------------------------------------------------------------------------------------------
# Labelled scatter plots (speed against quality in ``vgen bench``), drawn with PIL: matplotlib is not a dependency.

PALETTE = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207))
MARGINS = (72, 36, 20, 52)  # left, top, right, bottom


def nice_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """Round ticks in [lo, hi], 1, 2, 2.5 or 5 times a power of ten apart, as close to ``target`` of them as that
    allows."""
    magnitude = 10 ** math.floor(math.log10((hi - lo) / max(target, 1)))
    step = min((m * magnitude for m in (1, 2, 2.5, 5, 10)), key=lambda d: abs((hi - lo) / d - target))
    first = math.ceil(lo / step - 1e-9)
    return [round(i * step, 12) for i in range(first, math.floor(hi / step + 1e-9) + 1)]


def _limits(values: Sequence[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    pad = 0.1 * (hi - lo) if hi > lo else 0.1 * max(abs(hi), 1.0)
    return lo - pad, hi + pad


@dataclass(frozen=True)
class PlotAxes:
    """Where data coordinates land in a plot image: the plotting box (left, top, right, bottom) and the limits."""

    box: tuple[int, int, int, int]
    xlim: tuple[float, float]
    ylim: tuple[float, float]

    @classmethod
    def fit(cls, xs: Sequence[float], ys: Sequence[float], size: tuple[int, int]) -> PlotAxes:
        left, top, right, bottom = MARGINS
        return cls((left, top, size[0] - right, size[1] - bottom), _limits(xs), _limits(ys))

    def pixel(self, x: float, y: float) -> tuple[int, int]:
        left, top, right, bottom = self.box
        fx = (x - self.xlim[0]) / (self.xlim[1] - self.xlim[0])
        fy = (y - self.ylim[0]) / (self.ylim[1] - self.ylim[0])
        return round(left + fx * (right - left)), round(bottom - fy * (bottom - top))


def scatter_plot(points: Sequence[tuple[str, float, float]], xlabel: str, ylabel: str, title: str = "",
                 size: tuple[int, int] = (520, 400)) -> Image.Image:
    """One coloured, labelled marker per ``(label, x, y)`` on axes with round ticks and a light grid (labels that
    would overlap are moved down)."""
    if not points:
        raise ValueError("no points to plot")
    axes = PlotAxes.fit([p[1] for p in points], [p[2] for p in points], size)
    image, draw = _axes_image(axes, size, xlabel, ylabel, title)
    small = ImageFont.load_default(size=12)
    right = axes.box[2]
    taken: list[tuple[int, int, int, int]] = []
    order = sorted(range(len(points)), key=lambda i: axes.pixel(*points[i][1:])[1])
    for i in order:
        name, x, y = points[i]
        px, py = axes.pixel(x, y)
        colour = PALETTE[i % len(PALETTE)]
        draw.ellipse([px - 5, py - 5, px + 5, py + 5], fill=colour, outline=(0, 0, 0))
        anchor, ax, ay = "lm", px + 8, py
        if draw.textbbox((ax, ay), name, font=small, anchor=anchor)[2] > right:  # no room: label left of the marker
            anchor, ax = "rm", px - 8
        box = draw.textbbox((ax, ay), name, font=small, anchor=anchor)
        while any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in taken):
            ay += 4
            box = draw.textbbox((ax, ay), name, font=small, anchor=anchor)
        taken.append(box)
        draw.text((ax, ay), name, fill=tuple(c // 2 for c in colour), font=small, anchor=anchor)
    return image


def _axes_image(axes: PlotAxes, size: tuple[int, int], xlabel: str, ylabel: str,
                title: str) -> tuple[Image.Image, ImageDraw.ImageDraw]:
    """A white picture with ``axes`` drawn: frame, round ticks, a light grid, axis labels and the title."""
    image = Image.new("RGB", size, (255, 255, 255))
    draw = ImageDraw.Draw(image)
    font, small = ImageFont.load_default(size=14), ImageFont.load_default(size=12)
    left, top, right, bottom = axes.box
    for v in nice_ticks(*axes.xlim):
        x = axes.pixel(v, axes.ylim[0])[0]
        draw.line([(x, top), (x, bottom)], fill=(230, 230, 230))
        draw.line([(x, bottom), (x, bottom + 4)], fill=(0, 0, 0))
        draw.text((x, bottom + 6), f"{v:g}", fill=(0, 0, 0), font=small, anchor="mt")
    for v in nice_ticks(*axes.ylim):
        y = axes.pixel(axes.xlim[0], v)[1]
        draw.line([(left, y), (right, y)], fill=(230, 230, 230))
        draw.line([(left - 4, y), (left, y)], fill=(0, 0, 0))
        draw.text((left - 6, y), f"{v:g}", fill=(0, 0, 0), font=small, anchor="rm")
    draw.rectangle(axes.box, outline=(0, 0, 0))
    draw.text(((left + right) // 2, size[1] - 4), xlabel, fill=(0, 0, 0), font=font, anchor="md")
    draw.text(((left + right) // 2, top // 2), title, fill=(0, 0, 0), font=font, anchor="mm")
    label = Image.new("RGB", (bottom - top, 20), (255, 255, 255))
    ImageDraw.Draw(label).text(((bottom - top) // 2, 10), ylabel, fill=(0, 0, 0), font=font, anchor="mm")
    image.paste(label.rotate(90, expand=True), (2, top))
    return image, draw


def line_plot(series: dict[str, Sequence[float]], xlabel: str, ylabel: str, title: str = "",
              size: tuple[int, int] = (520, 400)) -> Image.Image:
    """One coloured line per named series (x = 0, 1, 2, ...), with a legend in the top-left corner."""
    if not series or not all(len(v) for v in series.values()):
        raise ValueError("no series to plot")
    xs = [float(i) for v in series.values() for i in range(len(v))]
    ys = [float(y) for v in series.values() for y in v]
    axes = PlotAxes.fit(xs, ys, size)
    image, draw = _axes_image(axes, size, xlabel, ylabel, title)
    small = ImageFont.load_default(size=12)
    left, top = axes.box[:2]
    for i, (name, values) in enumerate(series.items()):
        colour = PALETTE[i % len(PALETTE)]
        points = [axes.pixel(x, float(y)) for x, y in enumerate(values)]
        if len(points) > 1:
            draw.line(points, fill=colour, width=2)
        else:
            draw.ellipse([points[0][0] - 3, points[0][1] - 3, points[0][0] + 3, points[0][1] + 3], fill=colour)
        draw.line([(left + 8, top + 10 + 15 * i), (left + 24, top + 10 + 15 * i)], fill=colour, width=3)
        draw.text((left + 28, top + 10 + 15 * i), name, fill=(0, 0, 0), font=small, anchor="lm")
    return image
