"""``vgen eval fid|fvd|stats|clip``: FID / FVD (and KID / KVD) between two sets, reference statistics, and the
CLIP score of images against their prompts.

Every command prints its result as one line of text; with ``--json`` it prints exactly one JSON object on one line
of stdout instead (``--json PATH`` also writes it to PATH). Warnings go to stderr as ``vgen: warning: ...`` and into
the object's ``warnings`` list.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vgen.apps.options import UsageError, add_overwrite_flag, check_writable, device_name, plural
from vgen.eval.clip import check_clip_folder, check_pairs, clip_score, load_clip
from vgen.eval.evaluate import EvalSettings, compute_stats, frechet_report
from vgen.eval.features import load_images
from vgen.eval.fid import npz_keys, read_npz
from vgen.pipelines.inputs import read_prompt_file

JSON_HELP = "print the result as one JSON object on one line (and write it to PATH if given)"


def add_eval_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="FID / FVD (and KID) between image or video sets, and reference statistics")
    esub = p.add_subparsers(dest="what", required=True)
    fid = esub.add_parser("fid", help="FID and KID between two image sets (folders, .npz, .npy or stats files)")
    _add_sides(fid, "shapes or inception (default: what a stats side records, else shapes)")
    fvd = esub.add_parser("fvd", help="FVD and KVD between two video sets (folders of mp4/gif, .npz, .npy or stats)")
    _add_sides(fvd, "shapes (per-frame, averaged over time) or i3d (default: what a stats side records, else shapes)")
    fvd.add_argument("--num-frames", type=int, default=16, help="frames per clip (the first ones)")
    _add_trust(fvd)
    stats = esub.add_parser("stats", help="precompute a set's feature statistics (mu, sigma, provenance) as .npz")
    src = stats.add_mutually_exclusive_group(required=True)
    src.add_argument("--images", help="image set: folder, .npz (arr_0) or .npy")
    src.add_argument("--videos", help="video set: folder of mp4/gif, .npz (arr_0) or .npy")
    stats.add_argument("--out", required=True, help=".npz to write")
    _add_features(stats, "shapes, inception (images) or i3d (videos); default shapes")
    stats.add_argument("--num-frames", type=int, default=16, help="frames per clip for --videos")
    _add_trust(stats)
    clip = esub.add_parser("clip", help="CLIP score of images against their prompts (torchmetrics' CLIPScore)")
    clip.add_argument("--images", required=True, help="image set: folder, .npz (arr_0) or .npy")
    clip.add_argument("--prompts", default=None,
                      help="text file, one prompt a line, in the images' order (default: the 'prompts' array of an "
                           "--images .npz, as vgen sample-many packs it)")
    clip.add_argument("--clip", required=True, help="CLIP folder in transformers' layout, e.g. a download of "
                                                    "openai/clip-vit-large-patch14")
    clip.add_argument("--device", type=device_name, default="cpu", help="where CLIP runs")
    clip.add_argument("--batch-size", type=int, default=64, help="images per CLIP batch")
    for parser, func in ((fid, run_eval_fid), (fvd, run_eval_fvd), (stats, run_eval_stats), (clip, run_eval_clip)):
        parser.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH", help=JSON_HELP)
        add_overwrite_flag(parser)
        parser.set_defaults(func=func)


def _add_sides(p: argparse.ArgumentParser, features_help: str) -> None:
    p.add_argument("--real", required=True, help="the reference set: folder, .npz (arr_0), .npy or stats file")
    p.add_argument("--fake", required=True, help="the generated set: folder, .npz (arr_0), .npy or stats file")
    _add_features(p, features_help)
    p.add_argument("--kid-subsets", type=int, default=100, help="random subsets KID averages over")
    p.add_argument("--kid-subset-size", type=int, default=None,
                   help="samples per KID subset; a smaller set is an error (default: 1000, or the smaller set's size "
                        "with a warning)")


def _add_trust(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trust-torchscript", action="store_true",
                   help="run a TorchScript I3D weights file (StyleGAN-V's i3d_torchscript.pt): it is code and runs "
                        "with your permissions, so only for a file whose source you trust")


def _add_features(p: argparse.ArgumentParser, features_help: str) -> None:
    p.add_argument("--features", default=None, help=features_help)
    p.add_argument("--weights", default=None, help="weights file of the feature extractor (default: looked up in "
                                                   "$VGEN_WEIGHTS_DIR, then ~/.cache/vgen)")
    p.add_argument("--no-verify-weights", action="store_true",
                   help="accept a weights file whose SHA-256 differs from the reference (its hash is recorded)")
    p.add_argument("--device", type=device_name, default="cpu", help="where the feature extractor runs")
    p.add_argument("--batch-size", type=int, default=64, help="images (clips) per feature batch")


def _settings(args: argparse.Namespace, media: str):
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {args.batch_size}")
    num_frames = getattr(args, "num_frames", 16)
    if num_frames < 1:
        raise UsageError(f"--num-frames must be >= 1, got {num_frames}")
    return EvalSettings(media, args.features, args.weights, not args.no_verify_weights, args.device, args.batch_size,
                        num_frames, progress=True, trust_torchscript=getattr(args, "trust_torchscript", False))


def _emit(result: dict, args: argparse.Namespace, text: str) -> None:
    """The warnings to stderr, then ``text`` or, with ``--json``, the result as one JSON line."""
    for warning in result.get("warnings", []):
        print(f"vgen: warning: {warning}", file=sys.stderr)
    line = json.dumps(result)
    if args.json not in (None, "-"):
        Path(args.json).write_text(line + "\n")
    print(line if args.json is not None else text)


def frechet_line(result: dict, media: str) -> str:
    """``vgen eval fid|fvd``'s result in one line: the distance, KID / KVD, the features and the set sizes."""
    metric, kernel = ("fid", "kid") if media == "images" else ("fvd", "kvd")
    mean, std = result[f"{kernel}_mean"], result[f"{kernel}_std"]
    kid = f"{mean:.4g} ± {std:.2g}" if mean is not None else "n/a (a side is a stats file)"
    frames = f" of {plural(result['num_frames'], 'frame')}" if "num_frames" in result else ""
    return (f"{metric.upper()} {result[metric]:.3f}, {kernel.upper()} {kid} ({result['features']} features; "
            f"{result['n_real']} real and {plural(result['n_fake'], 'fake ' + media[:-1])}{frames})")


def _run_frechet(args: argparse.Namespace, media: str) -> None:
    check_writable(None if args.json in (None, "-") else args.json, {".json"}, args.overwrite)
    if args.kid_subsets < 1 or (args.kid_subset_size is not None and args.kid_subset_size < 2):
        raise UsageError("--kid-subsets must be >= 1 and --kid-subset-size >= 2")
    result = frechet_report(args.real, args.fake, _settings(args, media), args.kid_subsets, args.kid_subset_size)
    _emit(result, args, frechet_line(result, media))


def run_eval_fid(args: argparse.Namespace) -> None:
    _run_frechet(args, "images")


def run_eval_fvd(args: argparse.Namespace) -> None:
    _run_frechet(args, "videos")


def run_eval_stats(args: argparse.Namespace) -> None:
    check_writable(args.out, {".npz"}, args.overwrite)
    check_writable(None if args.json in (None, "-") else args.json, {".json"}, args.overwrite)
    media = "images" if args.images is not None else "videos"
    source = getattr(args, media)
    if not source.strip():
        raise UsageError(f"--{media} needs a path: a folder, .npz or .npy")
    result = compute_stats(source, args.out, _settings(args, media))
    _emit(result, args, f"wrote statistics of {plural(result['count'], media[:-1])} ({result['features']} "
                        f"features) to {args.out}")


def clip_prompts(images: str, prompts: str | None) -> tuple[list[str], str]:
    """The prompts of ``--prompts``, or else of the ``prompts`` array of an ``--images`` .npz; and where they are."""
    if prompts is not None:
        return read_prompt_file(prompts), prompts
    if Path(images).suffix == ".npz" and Path(images).is_file() and "prompts" in npz_keys(images):
        return [str(p) for p in read_npz(images, ["prompts"])["prompts"].reshape(-1)], f"{images}:prompts"
    raise UsageError(f"give --prompts: {images} is not an .npz holding a 'prompts' array (as vgen sample-many "
                     f"writes for a text-to-image model)")


def clip_line(result: dict) -> str:
    """``vgen eval clip``'s result in one line: the score, the image count, the model and the prompts cut."""
    cut = result["truncated"] and f"; {plural(result['truncated'], 'prompt')} cut to {result['max_tokens']} tokens"
    return (f"CLIP score {result['clip_score']:.4f} over {plural(result['count'], 'image')} "
            f"({Path(result['clip']).name}{cut or ''})")


def run_eval_clip(args: argparse.Namespace) -> None:
    check_writable(None if args.json in (None, "-") else args.json, {".json"}, args.overwrite)
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {args.batch_size}")
    check_clip_folder(args.clip)
    prompts, prompts_from = clip_prompts(args.images, args.prompts)
    images = load_images(args.images)
    check_pairs(images, prompts, args.images, prompts_from)
    result = clip_score(images, prompts, load_clip(args.clip, args.device), args.batch_size, progress=True)
    result.update(images=args.images, prompts=prompts_from)
    _emit(result, args, clip_line(result))
