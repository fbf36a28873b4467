"""Teacher-forced loss of a video model's exported weights, frame by frame, on tokenised training clips.

It shows where in a clip a layout change costs or gains, e.g. frame 1 with and without the next-frame link of a
NAR model that draws frame 0 first (docs/models/shapes-video-nar.md). Clips ``0, step, 2 step, ...`` of the codes
are scored, ``step = len(codes) // count``, each under its own class (``vgen.training.clip_codes.clip_classes``).

    python benchmarks/video_frame_loss.py --gpt runs/video-nar-if3/export \
        --codes runs/video-nar-if3/train_clip_codes_3000.npy --count 32
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
import torch.nn.functional as F

from vgen.hub import from_pretrained
from vgen.training.clip_codes import clip_classes


@torch.no_grad()
def frame_losses(model: torch.nn.Module, codes: torch.Tensor, class_ids: torch.Tensor,
                 batch_size: int) -> torch.Tensor:
    """Mean next-token cross-entropy per frame [T] over the clips ``codes`` [N, T * H * W] (one full forward each)."""
    frames = model.grid[0]
    total = torch.zeros(frames)
    for i in range(0, len(codes), batch_size):
        x = codes[i:i + batch_size]
        loss = F.cross_entropy(model(class_ids[i:i + batch_size], x).transpose(1, 2), x, reduction="none")
        total += loss.view(len(x), frames, -1).mean(2).sum(0)
    return total / len(codes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpt", required=True, help="exported video model folder (save_pretrained)")
    parser.add_argument("--codes", required=True, help="train_clip_codes_<N>.npy of a video training run")
    parser.add_argument("--count", type=int, default=32, help="clips to score, evenly spaced")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = from_pretrained(args.gpt).float().eval()
    codes = np.load(args.codes)
    if not 1 <= args.count <= len(codes):
        raise SystemExit(f"--count must be in 1..{len(codes)} (the clips in {args.codes}), got {args.count}")
    index = np.arange(args.count) * (len(codes) // args.count)
    losses = frame_losses(model, torch.as_tensor(codes[index].astype(np.int64)),
                          torch.as_tensor(clip_classes(index)), args.batch_size)
    print(json.dumps({"gpt": args.gpt, "clips": args.count, "per_frame": [round(v, 3) for v in losses.tolist()],
                      "mean": round(losses.mean().item(), 3)}))


if __name__ == "__main__":
    main()
