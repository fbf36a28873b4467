"""Reconstruction quality of a pipeline's tokenizer (VQ or KL) on held-out shapes images or clip frames, and a
picture of it.

Prints PSNR (dB, pixels in [0, 255]), codebook usage over the evaluated images (VQ only), the per-image token
count, and
the domain classifier's accuracy on the originals and on their reconstructions (whether the class survives
tokenization: the ceiling for generated samples); writes a grid with originals on the top row(s) and
reconstructions below. With ``--clips`` and a VQ it also prints how many codes stay the same from one frame to the
next beside how many pixels do (a next-frame predictor such as NBP gets the unchanged codes almost for free).

    python benchmarks/tokenizer_quality.py --model shapes-c2i --num-images 2048 \
        --picture docs/results/images/vq_reconstructions.png
    python benchmarks/tokenizer_quality.py --model shapes-c2i-continuous --data-dir ~/.cache/vgen/runs/data-smooth
    python benchmarks/tokenizer_quality.py --tokenizer ~/.cache/vgen/runs/shapes-frame-tokenizer/export --clips \
        --num-images 4096 --data-dir ~/.cache/vgen/runs/clips --picture docs/results/images/frame_vq_reconstructions.png
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

import vgen
from vgen.apps.options import RUNS
from vgen.data.clips import SHAPES_CLIPS, cached_clips
from vgen.data.shapes import cached_split, to_tensor
from vgen.eval.classifier import load_shapes_classifier
from vgen.eval.features import classifier_input
from vgen.hub import from_pretrained
from vgen.images import image_grid, tensor_to_pil


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="shapes-c2i", help="pipeline whose tokenizer to evaluate")
    p.add_argument("--tokenizer", default=None, help="a tokenizer folder to evaluate instead of --model's")
    p.add_argument("--clips", action="store_true",
                   help="evaluate on the frames of held-out moving-shapes clips (--num-images frames) instead of "
                        "shapes images")
    p.add_argument("--data-dir", default=str(RUNS / "data"), help="where the val split is rendered (cached)")
    p.add_argument("--num-images", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--picture", default=None, help="PNG: 8 originals over their 8 reconstructions")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = from_pretrained(args.tokenizer).float() if args.tokenizer else vgen.load(args.model).tokenizer
    if args.clips:
        per_clip = SHAPES_CLIPS.num_frames
        videos, clip_labels = cached_clips(args.data_dir, "val", -(-args.num_images // per_clip))
        images = np.asarray(videos).reshape(-1, *videos.shape[2:])[:args.num_images]
        labels = np.repeat(clip_labels, per_clip)[:args.num_images]
    else:
        images, labels = cached_split(args.data_dir, "val", args.num_images)
    classifier = load_shapes_classifier().eval()
    discrete = hasattr(tokenizer, "codebook_size")
    se, used, recon_first = 0.0, torch.zeros(getattr(tokenizer, "codebook_size", 1), dtype=torch.bool), None
    right_real = right_rec = 0
    all_codes = []
    with torch.no_grad():
        for i in range(0, len(images), args.batch_size):
            batch = np.array(images[i:i + args.batch_size])
            if discrete:
                rec, codes, _ = tokenizer(to_tensor(batch))
                used[codes.flatten()] = True
                all_codes.append(codes.reshape(len(batch), -1))
            else:
                codes = tokenizer.encode(to_tensor(batch))[..., 0]  # [B, tokens]
                rec = tokenizer.decode(tokenizer.encode(to_tensor(batch)))
            rec_u8 = (rec * 127.5 + 128).clamp(0, 255).to(torch.uint8)  # the mapping the pipelines save with
            original = torch.from_numpy(batch).permute(0, 3, 1, 2).float()
            se += ((rec_u8.float() - original) ** 2).sum().item()
            truth = torch.from_numpy(np.asarray(labels[i:i + args.batch_size]))
            # both as saved pictures, resized to the classifier's size (clip frames are smaller)
            right_real += int((classifier.predict(classifier_input(batch, classifier)) == truth).sum())
            shown = rec_u8.permute(0, 2, 3, 1).numpy()
            right_rec += int((classifier.predict(classifier_input(shown, classifier)) == truth).sum())
            recon_first = rec if recon_first is None else recon_first
    mse = se / (len(images) * images[0].size)
    figures = {"tokenizer": args.tokenizer or args.model, "data": "clip frames" if args.clips else "images",
               "num_images": len(images), "psnr_db": 10 * np.log10(255.0 ** 2 / mse),
               "codebook_usage": float(used.float().mean()) if discrete else None,
               "codebook_size": getattr(tokenizer, "codebook_size", None),
               "tokens_per_image": int(codes[0].numel()), "classifier_accuracy_real": right_real / len(images),
               "classifier_accuracy_reconstructed": right_rec / len(images)}
    if args.clips and discrete:
        frames = SHAPES_CLIPS.num_frames
        whole = len(images) // frames * frames
        codes_t = torch.cat(all_codes)[:whole].reshape(-1, frames, codes[0].numel())
        pixels = np.asarray(images[:whole]).reshape(-1, frames, *images.shape[1:])
        figures["codes_kept_between_frames"] = float((codes_t[:, 1:] == codes_t[:, :-1]).float().mean())
        pixel_kept = (pixels[:, 1:] == pixels[:, :-1]).all(-1)  # [clips, frames - 1, H, W]
        figures["pixels_kept_between_frames"] = float(pixel_kept.mean())
        # the most a tokenizer whose codes read only their own patch can keep: patches with no pixel changed
        f = tokenizer.downsample_factor
        patches = pixel_kept.reshape(*pixel_kept.shape[:2], pixel_kept.shape[2] // f, f, -1, f)
        figures["patches_kept_between_frames"] = float(patches.all(axis=(3, 5)).mean())
    print(json.dumps(figures, indent=1))
    if args.picture:  # 8 images of the first batch: one frame from each of 8 clips with --clips
        picks = np.arange(8) * (SHAPES_CLIPS.num_frames if args.clips else 1)
        originals = tensor_to_pil(to_tensor(np.asarray(images)[picks]))
        reconstructions = tensor_to_pil(recon_first[picks])
        image_grid(originals + reconstructions, cols=8).resize((8 * 128, 2 * 128), 0).save(args.picture)


if __name__ == "__main__":
    main()
