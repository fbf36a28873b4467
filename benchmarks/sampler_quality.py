"""Quality of each sampler's images in vgen's offline domain features, in one run on one model.

Every sampler draws the same number of images (classes in turn, the same seeds and batches). The table gives,
per sampler: domain FID and KID against real images of the data set, FID against vanilla AR's own samples
(how far the sampler moves the output distribution away from AR's, the quantity a lossless sampler keeps at
the level of two AR runs), class accuracy, and tokens per target forward. A second vanilla AR run with other
seeds (``ar-reseed``) gives the noise floor of these numbers at this sample size.

    python benchmarks/sampler_quality.py --num-images 512 --batch-size 32 --real /path/to/val_images.npy \
        --samplers ar ar-reseed=ar:reseed=1 sjd mcsjd lantern gsd --markdown docs/sampler_quality.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from speculative_speed import parse_sampler

import vgen
from vgen.eval.classifier import load_shapes_classifier
from vgen.eval.features import is_stats_file, load_images, shapes_features
from vgen.eval.fid import GaussianStats, frechet_distance, kernel_inception_distance
from vgen.eval.quality import class_accuracy


def draw(pipe, name: str, options: dict, class_ids: list[int], batch_size: int, seed: int) -> tuple[np.ndarray, float]:
    """uint8 images [N, H, W, 3] and the mean tokens per target forward."""
    images, passes = [], 0
    for i in range(0, len(class_ids), batch_size):
        out = pipe(class_ids[i:i + batch_size], sampler=name, seed=seed + i, **options)
        images += [np.array(im) for im in out.images]
        passes += out.stats.forward_passes
    tokens_per_forward = len(class_ids) * pipe.model.num_tokens / (passes * batch_size)
    return np.stack(images), tokens_per_forward


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="shapes-c2i")
    ap.add_argument("--samplers", nargs="+", default=["ar", "ar-reseed=ar:reseed=1", "sjd", "mcsjd", "lantern", "gsd"],
                    help="as in speculative_speed.py; the first is the AR reference; reseed=K shifts the seeds")
    ap.add_argument("--real", required=True, help="real images (folder, .npz, .npy) or a stats file")
    ap.add_argument("--num-images", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pipe = vgen.load(args.model)
    if is_stats_file(args.real):
        real_feats, real = None, GaussianStats.load(args.real)
    else:
        real_feats = shapes_features(load_images(args.real))
        real = GaussianStats.of(real_feats)
    class_ids = [i % pipe.num_classes for i in range(args.num_images)]
    classifier = load_shapes_classifier()
    results, reference = {}, None
    for label, name, options in map(parse_sampler, args.samplers):
        seed = args.seed + 1_000_000 * options.pop("reseed", 0)
        images, tpf = draw(pipe, name, options, class_ids, args.batch_size, seed)
        feats = shapes_features(images)
        stats = GaussianStats.of(feats)
        pixels = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1
        row = {"sampler": name, "options": options, "tokens_per_forward": tpf,
               "fid_vs_real": frechet_distance(real, stats).fid,
               "class_accuracy": class_accuracy(classifier, pixels, class_ids)["class_accuracy"]}
        if real_feats is not None:
            row["kid_vs_real"] = kernel_inception_distance(real_feats, feats, 20, min(1000, len(feats)))[0]
        if reference is None:
            reference = stats
        else:
            row["fid_vs_ar"] = frechet_distance(reference, stats).fid
        results[label] = row
        print(label, json.dumps(row))
    lines = ["| sampler | tokens / pass | FID vs real | KID vs real | FID vs AR | class accuracy |",
             "|---|---|---|---|---|---|"]
    for label, r in results.items():
        kid = f"{r['kid_vs_real']:.3f}" if "kid_vs_real" in r else "-"
        vs_ar = f"{r['fid_vs_ar']:.2f}" if "fid_vs_ar" in r else "(reference)"
        lines.append(f"| {label} | {r['tokens_per_forward']:.2f} | {r['fid_vs_real']:.2f} | {kid} | {vs_ar} | "
                     f"{100 * r['class_accuracy']:.1f}% |")
    table = "\n".join(lines)
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"setup": vars(args), "results": results}, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")


if __name__ == "__main__":
    main()
