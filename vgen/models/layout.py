"""Where a backbone's sequence holds fixed tokens among the image codes it samples.

Some models write structural tokens inside the image: Emu3 an end-of-line token after every row of codes,
Lumina-mGPT a new-line token after every row and resolution tokens before the image, both end tokens after it.
Samplers never see them. A :class:`TokenLayout` says where they sit; the backbone maps each window of codes a
sampler feeds onto the contiguous stretch of its sequence that holds those codes, writes the fixed ids there itself
and returns only the outputs that predict codes. Drafts, acceptance, step counts and acceptance maps are therefore
over codes alone, and no sampler knows a model's fixed tokens.

Offsets count sequence positions from code 0: code ``c`` sits at ``offset(c) = c + (c // W) * E`` (``E`` fixed
tokens after each row of ``W`` codes), the row end of row ``r`` at ``offset(r * W + W - 1) + 1 ..``. A window
of ``k`` codes from code ``f`` spans ``offset(f + k) - offset(f)`` positions (the row ends after its codes
included), at most :meth:`TokenLayout.max_width` of ``k``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLayout:
    """``grid`` (H, W) image codes in raster order; ``row_end``: the ids written after every row of W codes;
    ``head``: the ids before code 0 (the end of every prompt); ``tail``: the ids after the last row's row end.
    Ids are of the model's whole (text) vocabulary."""

    grid: tuple[int, int]
    row_end: tuple[int, ...] = ()
    head: tuple[int, ...] = ()
    tail: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.grid) != 2 or any(not isinstance(n, int) or n < 1 for n in self.grid):
            raise ValueError(f"a token layout's grid is (rows, columns) of positive integers, got {self.grid!r}")
        for name in ("row_end", "head", "tail"):
            ids = getattr(self, name)
            if any(not isinstance(i, int) or i < 0 for i in ids):
                raise ValueError(f"the layout's {name} must be non-negative token ids, got {ids!r}")

    @property
    def width(self) -> int:
        """Codes per row (W)."""
        return self.grid[1]

    @property
    def fixed_per_row(self) -> int:
        """Fixed tokens after each row (E)."""
        return len(self.row_end)

    @property
    def period(self) -> int:
        """Sequence positions a row takes, its row end included (W + E)."""
        return self.width + self.fixed_per_row

    def offset(self, code: int | torch.Tensor) -> int | torch.Tensor:
        """The sequence offset of code ``code`` (int or LongTensor) from code 0; of ``N`` codes, ``offset(N)`` is
        the positions the whole image takes before its tail."""
        return code + (code // self.width) * self.fixed_per_row

    def max_width(self, count: int) -> int:
        """The most positions a window of ``count`` consecutive codes takes, wherever it starts."""
        return count + self.fixed_per_row * math.ceil(count / self.width)

    def window(self, first: torch.Tensor, codes: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A window of codes as sequence ids: ``codes`` [R, k] (ids already) whose first is code ``first[r]`` of
        row r, laid over ``width`` positions from ``offset(first)`` with the row ends written in; returns the ids
        [R, width] and, for each code j, the position [R, k] whose output predicts code ``first + j + 1`` (the
        last before it). Positions past a row's real width (``offset(first + k) - offset(first)``) hold one of its
        codes; a caller attends to them from no real position."""
        k = codes.shape[1]
        steps = torch.arange(k, device=codes.device)
        start = self.offset(first)[:, None]
        out = self.offset(first[:, None] + 1 + steps) - 1 - start
        if not self.row_end:
            return codes, out
        o = start + torch.arange(width, device=codes.device)
        col = o % self.period
        index = ((o // self.period) * self.width + col - first[:, None]).clamp(0, k - 1)
        fixed = torch.tensor(self.row_end, device=codes.device)[(col - self.width).clamp(min=0)]
        return torch.where(col >= self.width, fixed, codes.gather(1, index)), out

    def sequence(self, codes: torch.Tensor) -> torch.Tensor:
        """The image part of the sequence for codes [B, H * W] (ids of the model's vocabulary): head, each row of
        codes followed by the row end, tail; [B, len(head) + offset(H * W) + len(tail)]."""
        b, (h, w) = codes.shape[0], self.grid
        rows = codes.reshape(b, h, w)
        ends = torch.tensor(self.row_end, dtype=codes.dtype, device=codes.device).expand(b, h, -1)
        head = torch.tensor(self.head, dtype=codes.dtype, device=codes.device).expand(b, -1)
        tail = torch.tensor(self.tail, dtype=codes.dtype, device=codes.device).expand(b, -1)
        return torch.cat([head, torch.cat([rows, ends], dim=2).flatten(1), tail], dim=1)

    def codes_of(self, sequence: torch.Tensor) -> torch.Tensor:
        """The codes [B, H * W] of an image part laid out as :meth:`sequence` gives it."""
        h, w = self.grid
        body = sequence[:, len(self.head):len(self.head) + h * self.period]
        return body.reshape(len(sequence), h, self.period)[:, :, :w].flatten(1)

    def code_slots(self) -> torch.Tensor:
        """The offset of every code [H * W], for gathering a full sequence's outputs at its codes."""
        return self.offset(torch.arange(math.prod(self.grid)))
