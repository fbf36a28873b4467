"""Training-step time of the block-diffusion recipes under bf16 autocast and in fp32, in one run.

A step is the diffusion-forcing loss's forward and backward pass and an AdamW update on random frames (the cost of
a step does not depend on the data). Repeats are interleaved so background load hits both precisions alike; the
table reports medians, after one warm-up step of each. ``vgen train blockdiff --precision auto`` takes bf16 on a
CPU with native bf16 matrix products (AMX or AVX512-BF16) and fp32 elsewhere.

    python benchmarks/blockdiff_step.py --recipes latent pixel --repeats 5 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import torch

from vgen.models.blockdiff import BlockDiffConfig, BlockDiffusionTransformer
from vgen.training.blockdiff import SHAPES_BLOCKDIFF, SHAPES_LATENT_BLOCKDIFF, diffusion_forcing_loss
from vgen.training.trainer import native_bf16_cpu


@dataclass(frozen=True)
class Recipe:
    config: BlockDiffConfig
    batch: int


RECIPES = {"latent": Recipe(SHAPES_LATENT_BLOCKDIFF, 16),  # shapes-blockdiff: 8 latent frames, 512 tokens a clip
           "pixel": Recipe(SHAPES_BLOCKDIFF, 8)}  # 16 frames of 32 px, 1,024 tokens a clip


def timed_step(model: BlockDiffusionTransformer, optimizer: torch.optim.Optimizer, frames: torch.Tensor,
               classes: torch.Tensor, bf16: bool) -> float:
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss, _ = diffusion_forcing_loss(model, frames, classes, clean_prob=0.3)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipes", nargs="+", choices=sorted(RECIPES), default=sorted(RECIPES))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"native bf16 matmuls: {native_bf16_cpu()}, threads: {torch.get_num_threads()}")
    print("| recipe | batch | bf16 s / step | fp32 s / step | fp32 / bf16 |\n|---|---|---|---|---|")
    for name in args.recipes:
        recipe = RECIPES[name]
        c = recipe.config
        model = BlockDiffusionTransformer(c).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        frames = torch.randn(recipe.batch, c.train_frames, c.frame_size, c.frame_size, c.channels)
        classes = torch.randint(0, c.num_classes, (recipe.batch,))
        times: dict[bool, list[float]] = {True: [], False: []}
        for bf16 in (True, False):  # warm-up
            timed_step(model, optimizer, frames, classes, bf16)
        for _ in range(args.repeats):
            for bf16 in (True, False):
                times[bf16].append(timed_step(model, optimizer, frames, classes, bf16))
        bf16_s, fp32_s = statistics.median(times[True]), statistics.median(times[False])
        print(f"| {name} | {recipe.batch} | {bf16_s:.2f} | {fp32_s:.2f} | {fp32_s / bf16_s:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
