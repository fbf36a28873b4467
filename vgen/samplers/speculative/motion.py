"""Motion-compensated neighbours for clips: where in the previous frame a token's content most likely came from.

In a clip the best guess for a token is often the token at the same cell one frame earlier (``draft_init=
"vertical"``), but a moving object's tokens sit a cell or two away from where they were. For each token to guess,
:func:`motion_sources` compares a small causal template around it (the known tokens to its left and in the rows
above) with the same template shifted by each motion within ``radius`` cells in the previous frame, and takes the
previous frame's token under the motion with the most matches, the motion-free cell on ties (block matching with a
causal template, as video codecs estimate motion without sending it).

Only tokens known before the pass are read (committed tokens and carried drafts), so the source of a fresh draft is
fixed before the pass that verifies it: a draft copied from it is deterministic given that information, and the
exact rule stays lossless with its one-hot law.
"""

from __future__ import annotations

import torch

# the causal template: (row, column) steps to the left and above, all before the token in raster order
TEMPLATE = ((0, -1), (0, -2), (-1, -1), (-1, 0), (-1, 1), (-2, 0))
MOTION_RADIUS = 1  # cells each way: a shape in vgen's clips moves about a cell a frame at 16x16 tokens


def motion_offsets(radius: int) -> torch.Tensor:
    """The candidate motions [K, 2] (rows, columns) within ``radius``, the motion-free one first."""
    steps = range(-radius, radius + 1)
    offsets = sorted(((dr, dc) for dr in steps for dc in steps), key=lambda o: (abs(o[0]) + abs(o[1]), o))
    return torch.tensor(offsets, dtype=torch.long)


def motion_sources(seq: torch.Tensor, known: torch.Tensor, index: torch.Tensor, grid: tuple[int, ...],
                   radius: int = MOTION_RADIUS) -> torch.Tensor:
    """For each token ``index`` [B, J] of a clip on ``grid`` (frames, rows, columns), the previous frame's token
    its content most likely came from; -1 for tokens of the first frame (or a grid without frames).

    ``seq`` [B, N']: the sequence with what is known before the pass; ``known`` [B, N']: where it is known. A
    motion ``(dr, dc)`` says the content at ``(r, c)`` was at ``(r - dr, c - dc)`` one frame earlier; it scores one
    match for each template cell whose token and the previous frame's token under the motion are both known and
    equal. The best score wins, the motion-free cell on ties, and a source outside the frame falls back to it."""
    if len(grid) != 3:
        return torch.full_like(index, -1)
    frames, rows, cols = grid
    frame = rows * cols
    f, r, c = index // frame, (index % frame) // cols, index % cols
    offsets = motion_offsets(radius).to(index.device)  # [K, 2]
    template = torch.tensor(TEMPLATE, dtype=torch.long, device=index.device)  # [T, 2]
    tr, tc = r[..., None] + template[:, 0], c[..., None] + template[:, 1]  # [B, J, T]
    inside = (tr >= 0) & (tc >= 0) & (tc < cols)
    here = f[..., None] * frame + tr.clamp(min=0) * cols + tc.clamp(0, cols - 1)
    pr = tr[..., None] - offsets[:, 0]  # [B, J, T, K]
    pc = tc[..., None] - offsets[:, 1]
    inside_before = inside[..., None] & (pr >= 0) & (pr < rows) & (pc >= 0) & (pc < cols)
    before = (f[..., None, None] - 1) * frame + pr.clamp(0, rows - 1) * cols + pc.clamp(0, cols - 1)
    here_token, here_known = (t.gather(1, here.flatten(1).clamp(min=0)).view_as(here) for t in (seq, known))
    before_token, before_known = (t.gather(1, before.flatten(1).clamp(min=0)).view_as(before) for t in (seq, known))
    here_known, before_known = here_known & inside, before_known & inside_before
    matches = (here_known[..., None] & before_known & (here_token[..., None] == before_token)).sum(2)  # [B, J, K]
    best = matches.argmax(-1)  # the first of the best: the motion-free one, then the smallest motions
    sr, sc = r - offsets[best, 0], c - offsets[best, 1]
    inside_frame = (sr >= 0) & (sr < rows) & (sc >= 0) & (sc < cols)
    sr, sc = torch.where(inside_frame, sr, r), torch.where(inside_frame, sc, c)
    source = (f - 1) * frame + sr * cols + sc
    return torch.where((f >= 1) & (f < frames), source, -1)
