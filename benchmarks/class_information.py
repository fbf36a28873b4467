"""How much a class-conditional AR model uses its class: the loss of real token sequences under each class.

For ``--count`` tokenised images it prints the mean summed loss per image (nats) with the true class, a wrong
one (true + 3 mod C) and the null class, and how often the class with the lowest loss is the true one. A model
that ignores its class scores the same under all of them (gain 0, recovery at chance 1/C).

For an NBP video model the same test scores each clip's frame 0 alone, under the model's layout (token by token in
a hybrid model's frame block 0; in row blocks, row by row after its first row): the part of a clip that carries
its class, since later frames mostly copy earlier ones.

    python benchmarks/class_information.py --gpt vgen/assets/shapes-c2i/gpt \
        --codes runs/shapes-ar-smooth/train_codes_16000.npy --labels runs/data-smooth/train_labels.npy
    python benchmarks/class_information.py --gpt runs/shapes-video-nbp3/export --start 0 --count 96 \
        --codes runs/shapes-video-nbp3/train_clip_codes_5000.npy --labels runs/data-clips/train_labels.npy
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
import torch.nn.functional as F

from vgen.hub import from_pretrained
from vgen.models.llamagen import LlamaGenGPT
from vgen.models.nbp import NBPTransformer


@torch.no_grad()
def image_losses(model: LlamaGenGPT | NBPTransformer, codes: torch.Tensor, class_ids: torch.Tensor,
                 batch_size: int) -> torch.Tensor:
    """Summed next-token cross-entropy per image [N] of ``codes`` [N, T] under ``class_ids`` [N] (for an NBP
    model, of each clip's frame 0 alone)."""
    out = []
    with torch.autocast("cpu", torch.bfloat16):
        for i in range(0, len(codes), batch_size):
            x, y = codes[i:i + batch_size], class_ids[i:i + batch_size]
            if isinstance(model, NBPTransformer):
                x = x[:, :model.grid[-2] * model.grid[-1]]
                logits = model(y, x).float()
            else:
                logits = model(y, x[:, :-1]).float()
            out.append(F.cross_entropy(logits.transpose(1, 2), x, reduction="none").sum(1))
    return torch.cat(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpt", required=True, help="AR or NBP video model folder (an export or a pipeline's gpt/)")
    p.add_argument("--codes", required=True, help=".npy of token codes [N, T] (a training run's cache)")
    p.add_argument("--labels", required=True, help=".npy of the class ids of the same images")
    p.add_argument("--start", type=int, default=15000, help="first image used")
    p.add_argument("--count", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = from_pretrained(args.gpt).eval()
    if isinstance(model, NBPTransformer) and len(model.grid) != 3:
        raise SystemExit("an NBP model is scored on its frame 0: it must be a video model (frames, rows, columns)")
    rows = slice(args.start, args.start + args.count)
    all_codes = np.load(args.codes, mmap_mode="r")
    if args.start + args.count > len(all_codes):
        raise SystemExit(f"--start {args.start} --count {args.count} needs {args.start + args.count} rows; "
                         f"{args.codes} has {len(all_codes)}")
    codes = torch.from_numpy(all_codes[rows].astype(np.int64))
    labels = torch.from_numpy(np.load(args.labels)[rows]).long()
    classes = model.config.num_classes
    per_class = torch.stack([image_losses(model, codes, torch.full_like(labels, c), args.batch_size)
                             for c in range(classes + 1)], 1)  # the last column is the null class
    true = per_class.gather(1, labels[:, None])[:, 0]
    wrong = per_class.gather(1, ((labels + 3) % classes)[:, None])[:, 0]
    null = per_class[:, classes]
    print(json.dumps({
        "images": len(labels),
        "loss_true_class": float(true.mean()),
        "loss_wrong_class": float(wrong.mean()),
        "loss_null_class": float(null.mean()),
        "gain_over_wrong_nats": float((wrong - true).mean()),
        "class_recovered_from_loss": float((per_class[:, :classes].argmin(1) == labels).float().mean()),
        "chance": 1 / classes,
    }, indent=1))


if __name__ == "__main__":
    main()
