"""Training-step time of the block-masked backbones: attention in key-prefix chunks (``PrefixMask``, what vgen runs)
against one call over the whole score matrix under the dense mask, in one run.

NAR's proximity mask (slots in step order) and NBP's block-causal mask let every query see a prefix of the keys,
so the teacher-forced pass attends in query chunks over only the keys each chunk sees. The dense row runs the very
same model and step with ``PrefixMask.attention`` swapped for one ``scaled_dot_product_attention`` call under the
dense mask, the computation without key-prefix chunks. A step is a forward and backward pass with the cross-entropy
against random tokens (the cost of a step does not depend on the weights). Repeats are interleaved so background
load hits both alike; the table reports medians and the largest gap between the two losses (they agree to float
rounding).

    python benchmarks/train_step_speed.py --backbones video-nar video-nbp nar --batch 4 --repeats 3 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from unittest import mock

import torch
import torch.nn.functional as F

from vgen.models.layers import PrefixMask
from vgen.models.nar import NARTransformer
from vgen.models.nbp import NBPTransformer
from vgen.training.nar import SHAPES_NAR, SHAPES_VIDEO_NAR_64
from vgen.training.nbp import SHAPES_VIDEO_NBP_64

BACKBONES: dict[str, Callable[[], torch.nn.Module]] = {
    "video-nar": lambda: NARTransformer(SHAPES_VIDEO_NAR_64),  # shapes-video-nar: 8 x 16 x 16 codes
    "video-nbp": lambda: NBPTransformer(SHAPES_VIDEO_NBP_64),  # shapes-video-nbp: rows of 16, frame 0 token by token
    "nar": lambda: NARTransformer(SHAPES_NAR),  # shapes-nar: 16 x 16 codes
}


def dense_attention(self: PrefixMask, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    dropout_p: float = 0.0) -> torch.Tensor:
    """The same attention in one call over every key, the masked-out ones computed and discarded."""
    mask = torch.arange(k.shape[2], device=q.device)[None, :] < self.ends[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)


def timed_step(model: torch.nn.Module, classes: torch.Tensor, tokens: torch.Tensor) -> tuple[float, float]:
    """Seconds for one forward and backward pass, and its loss."""
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    loss = F.cross_entropy(model(classes, tokens).flatten(0, 1), tokens.flatten())
    loss.backward()
    return time.perf_counter() - start, loss.item()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backbones", nargs="+", choices=sorted(BACKBONES), default=sorted(BACKBONES))
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.batch < 1 or args.repeats < 1:
        p.error("--batch and --repeats must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}, fp32, train mode")
    print("| backbone | slots | chunked step (s) | dense step (s) | speed-up | loss gap |")
    print("|---|---|---|---|---|---|")
    for name in args.backbones:
        torch.manual_seed(0)
        model = BACKBONES[name]().train()
        for param in model.parameters():  # the zero-initialised output layers would give a constant loss
            if param.ndim == 2:
                torch.nn.init.normal_(param, std=0.02)
        tokens = torch.randint(0, model.vocab_size, (args.batch, model.num_tokens))
        classes = torch.arange(args.batch) % model.num_classes
        times: dict[str, list[float]] = {"chunked": [], "dense": []}
        gap = 0.0  # the largest loss difference between the two ways over the rounds
        for repeat in range(args.repeats + 1):  # the first round warms up
            torch.manual_seed(repeat)  # the same dropout draws in both ways
            chunked_s, chunked_loss = timed_step(model, classes, tokens)
            torch.manual_seed(repeat)
            with mock.patch.object(PrefixMask, "attention", dense_attention):
                dense_s, dense_loss = timed_step(model, classes, tokens)
            gap = max(gap, abs(chunked_loss - dense_loss))
            if repeat:
                times["chunked"].append(chunked_s)
                times["dense"].append(dense_s)
        chunked, dense = statistics.median(times["chunked"]), statistics.median(times["dense"])
        print(f"| {name} | {1 + model.num_tokens} | {chunked:.2f} | {dense:.2f} | {dense / chunked:.2f}x | "
              f"{gap:.1e} |", flush=True)


if __name__ == "__main__":
    main()
