"""Does a block-diffusion model use its class? Two checks, for a pipeline or a model folder.

1. Class accuracy of sampled clips per CFG scale, overall and per class: `--per-class` clips per class of
   `--frames` frames (seed 0), every frame judged by the domain classifier; per class and block too, to show
   whether a class is lost in the first block (drawn without context) or in the blocks that continue it.
2. The class gap: on 32 training clips with the first block noised and the rest clean, the first block's velocity
   MSE with the right class, a wrong class (+3) and the null class. A model that ignores its class scores the same.

    python benchmarks/blockdiff_class.py --model shapes-blockdiff --cfg 1 3 6
    python benchmarks/blockdiff_class.py --weights ~/.cache/vgen/runs/shapes-blockdiff/export --cfg
    python benchmarks/blockdiff_class.py --model <latent pipeline> --weights <run>/export --data-dir <64-px clips>
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

import vgen
from vgen.apps.options import RUNS
from vgen.data.clips import cached_clips, recorded_clips_config
from vgen.eval.drift import class_probabilities
from vgen.hub import from_pretrained
from vgen.training.blockdiff import clips_to_tensor


@torch.no_grad()
def class_gap(model: torch.nn.Module, frames: torch.Tensor, labels: torch.Tensor, levels: list[float]) -> dict:
    """First-block velocity MSE with the right / a wrong / the null class, per noise level."""
    g = torch.Generator().manual_seed(0)
    blocks, per_block = frames.shape[1] // model.frames_per_block, model.frames_per_block
    out = {}
    for level in levels:
        sigma = torch.zeros(len(frames), blocks)
        sigma[:, 0] = level
        noise = torch.randn(frames.shape, generator=g)
        weight = sigma.repeat_interleave(per_block, 1)[:, :, None, None, None]
        noisy = (1 - weight) * frames + weight * noise
        classes = {"right": labels, "wrong": (labels + 3) % model.num_classes,
                   "null": model.null_condition(labels)}
        out[level] = {name: float((model(noisy, sigma, c) - (noise - frames))[:, :per_block].pow(2).mean())
                      for name, c in classes.items()}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="shapes-blockdiff", help="streaming pipeline (embedded name or folder)")
    p.add_argument("--weights", default=None, help="a block-diffusion model folder to use instead (a run's export)")
    p.add_argument("--data-dir", default=str(RUNS / "clips"),
                   help="the rendered training clips (of the model's geometry: 64-px clips for a latent model)")
    p.add_argument("--cfg", type=float, nargs="*", default=[1.0, 3.0, 6.0], help="CFG scales to sample at")
    p.add_argument("--per-class", type=int, default=2, help="sampled clips per class and CFG scale")
    p.add_argument("--frames", type=int, default=16, help="frames per sampled clip")
    p.add_argument("--levels", type=float, nargs="+", default=[0.5, 0.8, 0.95])
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    pipe = vgen.load(args.model)
    if args.weights:
        pipe.model = from_pretrained(args.weights).float().eval()
    model = pipe.model.float()
    figures = {"model": args.weights or args.model, "class_accuracy_by_cfg": {}}
    ids = [c for c in range(model.num_classes) for _ in range(args.per_class)]
    for cfg in args.cfg:
        videos = pipe(ids, num_frames=args.frames, seed=0, cfg_scale=cfg).videos
        predicted = class_probabilities(videos.reshape(-1, *videos.shape[2:])).argmax(-1).reshape(len(ids), -1)
        right = predicted == np.array(ids)[:, None]
        figures["class_accuracy_by_cfg"][cfg] = float(right.mean())
        figures.setdefault("class_accuracy_by_class", {})[cfg] = {
            pipe.class_name(c): float(right[np.array(ids) == c].mean()) for c in range(model.num_classes)}
        by_block = right.reshape(len(ids), -1, pipe.frames_per_block).mean(-1)
        figures.setdefault("class_accuracy_by_class_and_block", {})[cfg] = {
            pipe.class_name(c): [round(float(a), 3) for a in by_block[np.array(ids) == c].mean(0)]
            for c in range(model.num_classes)}
    clips, labels = cached_clips(args.data_dir, "train", 4032, recorded_clips_config(args.data_dir))
    frames = clips_to_tensor(np.asarray(clips[4000:4032])[:, :model.config.train_frames])
    if pipe.tokenizer is not None:  # a latent model denoises the tokenizer's latent frames
        frames = pipe.tokenizer.float().encode_frames(frames)
    figures["first_block_mse"] = class_gap(model, frames, torch.from_numpy(np.asarray(labels[4000:4032])),
                                           args.levels)
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
