"""The ``vgen`` command: a thin layer over the pipeline API and the training recipes.

Every user error (unknown model or sampler, out-of-range parameters or class ids, missing / corrupt / mismatched
checkpoints, unwritable outputs) ends with one ``vgen: error: ...`` line and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

from vgen.data.clips import CLIP_PRESETS, recorded_clips_config
from vgen.data.shapes import BACKGROUND_KINDS
from vgen.hub import CheckpointError
from vgen.models.nbp import BLOCK_KINDS, ROPE_KINDS
from vgen.tokenizers.vq import ENCODER_KINDS

DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
          "fp16": "float16", "float16": "float16"}
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}
RUNS = Path(os.environ.get("VGEN_RUNS", Path.home() / ".cache" / "vgen" / "runs"))


class UsageError(Exception):
    """A problem with the command line itself, reported without a traceback."""


def check_writable(path: str | None, suffixes: set[str] | None = None) -> None:
    """Fail before any work if ``path`` cannot be written (so that nothing computed is lost)."""
    if path is None:
        return
    p = Path(path)
    if suffixes is not None and p.suffix.lower() not in suffixes:
        raise UsageError(f"cannot write {path}: unsupported file type {p.suffix or '(none)'}; "
                         f"use one of {sorted(suffixes)}")
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise UsageError(f"cannot write {path}: it is a directory")
    if not parent.is_dir():
        raise UsageError(f"cannot write {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UsageError(f"cannot write {path}: permission denied")


# -- vgen sample ----------------------------------------------------------------------------------------------


def add_sample_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sample", help="generate images and save them as a grid",
                       description="Generate class-conditional images. With no arguments: a grid of every class "
                                   "from the embedded default model.")
    add_model_args(p)
    gen = add_sampler_args(p)
    gen.add_argument("--class-id", type=int, action="append", dest="class_ids",
                     help="class to generate (repeatable; default: every class in turn)")
    gen.add_argument("--num-images", type=int, default=None, help="images in all (class ids cycle)")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--context", default=None,
                     help="video model: a clip (.mp4, .gif) whose first --context-frames frames every clip continues")
    gen.add_argument("--context-frames", type=int, default=1, help="frames of --context given (default: 1)")
    out = p.add_argument_group("output")
    out.add_argument("--out", default="samples.png",
                     help="image grid to write (default: samples.png); for a video model an .mp4, .gif or "
                          "frame-grid .png")
    out.add_argument("--fps", type=int, default=8, help="frames per second of a video output")
    out.add_argument("--cols", type=int, default=None, help="grid columns (default: up to 8)")
    out.add_argument("--stats", default=None, help="write sampler stats as JSON here")
    out.add_argument("--acceptance-map", default=None,
                     help="write each image beside the map of the forward pass that produced each token (for a "
                          "video model: each clip's frames above their maps)")
    add_device_args(out)
    p.set_defaults(func=run_sample)


def add_model_args(p: argparse.ArgumentParser) -> None:
    """--model, or LlamaGen checkpoints and their architecture (read by :func:`load_pipeline`)."""
    src = p.add_argument_group("model (an embedded default / pipeline folder, or LlamaGen checkpoints)")
    src.add_argument("--model", default=None, help="embedded model name or pipeline folder (default: shapes-c2i)")
    src.add_argument("--gpt-ckpt", help="LlamaGen GPT checkpoint (.pt)")
    src.add_argument("--vq-ckpt", help="LlamaGen VQ checkpoint (.pt)")
    src.add_argument("--gpt-model", default="GPT-B", help="LlamaGen size of --gpt-ckpt (GPT-B ... GPT-3B)")
    src.add_argument("--vq-model", default="VQ-16", help="LlamaGen VQ of --vq-ckpt (VQ-16 or VQ-8)")
    src.add_argument("--image-size", type=int, default=256, help="image size of --gpt-ckpt (256, 384, 512)")
    src.add_argument("--codebook-size", type=int, default=16384)
    src.add_argument("--codebook-embed-dim", type=int, default=8)
    src.add_argument("--num-classes", type=int, default=1000)


def add_sampling_args(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The settings every sampler shares (unset = the model's recommended value); read by
    :func:`sampling_overrides`."""
    gen = p.add_argument_group("generation")
    gen.add_argument("--cfg-scale", type=float, default=None)
    gen.add_argument("--cfg-interval", type=int, default=None)
    gen.add_argument("--top-k", type=int, default=None)
    gen.add_argument("--top-p", type=float, default=None)
    gen.add_argument("--temperature", type=float, default=None)
    return gen


def add_sampler_args(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """--sampler and its settings (read by :func:`sampler_options`) on top of :func:`add_sampling_args`."""
    gen = add_sampling_args(p)
    gen.add_argument("--sampler", default=None,
                     help="sampler name (see `vgen samplers`; default: ar, or continuous-ar for a continuous model)")
    gen.add_argument("--compile", action="store_true", help="torch.compile the decode step (slow first call)")
    spec = p.add_argument_group("speculative samplers (sjd, lantern, gsd, speculative); unset = the preset's value")
    spec.add_argument("--drafter", default=None, help="jacobi, head or auto")
    spec.add_argument("--accept", default=None, help="acceptance rule: exact, lantern, gsd or match")
    spec.add_argument("--window", type=int, default=None, help="target positions per forward pass (drafts + 1)")
    spec.add_argument("--draft-init", default=None, help="fresh Jacobi drafts: random, left or vertical")
    spec.add_argument("--draft-coupling", default=None, help="Jacobi draft refresh: none, maximal or gumbel (MC-SJD)")
    spec.add_argument("--lantern-k", type=int, default=None, help="latent neighbours per token")
    spec.add_argument("--lantern-delta", type=float, default=None,
                      help="total-variation budget in [0, 1] (mode tv) or lambda >= 1 (mode relative)")
    spec.add_argument("--lantern-mode", default=None, help="tv (LANTERN) or relative (LANTERN++)")
    spec.add_argument("--gsd-rank-window", type=int, default=None, help="candidates within +-this many ranks")
    spec.add_argument("--gsd-p-threshold", type=float, default=None)
    spec.add_argument("--gsd-dist-threshold", type=float, default=None)
    cont = p.add_argument_group("continuous speculative decoding (cspd); unset = its default")
    cont.add_argument("--draft-length", type=int, default=None, help="tokens the draft model proposes per pass")
    cont.add_argument("--prefill-ratio", type=float, default=None,
                      help="share in [0, 1) of the tokens the target generates alone first")
    cont.add_argument("--inner-temperature", type=float, default=None,
                      help="1 = exact; > 1 widens both Gaussians in the acceptance test (lossy; the reference uses 42)")
    return gen


def add_device_args(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--device", default="cpu")
    group.add_argument("--dtype", default="fp32", help="backbone dtype: fp32, bf16 or fp16")
    group.add_argument("--no-progress", action="store_true")


def load_pipeline(args: argparse.Namespace, streaming: bool = False):
    """The pipeline the command line names; a streaming (block-diffusion) model only where ``streaming``."""
    import torch

    from vgen import pipelines

    if args.dtype not in DTYPES:
        raise UsageError(f"unknown dtype {args.dtype!r}; expected one of {sorted(DTYPES)}")
    dtype = getattr(torch, DTYPES[args.dtype])
    if getattr(args, "gpt_ckpt", None) or getattr(args, "vq_ckpt", None):
        if args.model:
            raise UsageError("give either --model or --gpt-ckpt/--vq-ckpt, not both")
        if not (args.gpt_ckpt and args.vq_ckpt):
            raise UsageError("LlamaGen checkpoints need both --gpt-ckpt and --vq-ckpt")
        return pipelines.load_llamagen(args.gpt_ckpt, args.vq_ckpt, args.gpt_model, args.image_size,
                                       args.vq_model, args.codebook_size, args.codebook_embed_dim,
                                       args.num_classes, device=args.device, dtype=dtype)
    pipe = pipelines.load(args.model or "shapes-c2i", device=args.device, dtype=dtype)
    from vgen.pipelines import StreamPipeline

    if isinstance(pipe, StreamPipeline) and not streaming:
        raise UsageError(f"{pipe.info.name} is a streaming video model: use `vgen stream --model {args.model}`")
    return pipe


SPECULATIVE_OPTIONS = ("drafter", "accept", "window", "draft_init", "draft_coupling", "lantern_k", "lantern_delta",
                       "lantern_mode", "gsd_rank_window", "gsd_p_threshold", "gsd_dist_threshold", "draft_length",
                       "prefill_ratio", "inner_temperature")
SAMPLING_OPTIONS = ("cfg_scale", "cfg_interval", "temperature", "top_k", "top_p")


def sampler_options(args: argparse.Namespace) -> dict:
    """The sampler fields set on the command line (:func:`add_sampler_args`)."""
    options = {"compile": True} if args.compile else {}
    options.update({name: getattr(args, name) for name in SPECULATIVE_OPTIONS if getattr(args, name) is not None})
    return options


def sampling_overrides(args: argparse.Namespace) -> dict:
    """The shared sampling settings set on the command line (:func:`add_sampling_args`)."""
    return {name: getattr(args, name) for name in SAMPLING_OPTIONS if getattr(args, name) is not None}


def run_sample(args: argparse.Namespace) -> None:
    from vgen.images import image_grid
    from vgen.samplers import get_sampler
    from vgen.video_io import VIDEO_FORMATS
    from vgen.visualize import acceptance_figure

    check_writable(args.out, IMAGE_SUFFIXES | set(VIDEO_FORMATS))
    check_writable(args.stats, {".json"})
    check_writable(args.acceptance_map, IMAGE_SUFFIXES)
    if args.cols is not None and args.cols < 1:
        raise UsageError(f"--cols must be >= 1, got {args.cols}")
    options = sampler_options(args)
    if args.sampler is not None:
        get_sampler(args.sampler, **options)  # bad names and settings fail before the model loads
    if args.context is not None and not Path(args.context).is_file():
        raise UsageError(f"--context {args.context} is not a file")
    pipe = load_pipeline(args)
    if hasattr(pipe, "num_frames"):
        return run_sample_video(args, pipe, options)
    if args.context is not None:
        raise UsageError(f"--context gives first frames to a video model; {pipe.info.name} generates images")
    if Path(args.out).suffix.lower() not in IMAGE_SUFFIXES:
        raise UsageError(f"{pipe.info.name} generates images; write them to one of {sorted(IMAGE_SUFFIXES)}, "
                         f"not {Path(args.out).suffix}")
    start = time.perf_counter()
    out = pipe(args.class_ids, num_images=args.num_images, sampler=args.sampler, seed=args.seed,
               cfg_scale=args.cfg_scale, cfg_interval=args.cfg_interval, temperature=args.temperature,
               top_k=args.top_k, top_p=args.top_p, progress=not args.no_progress, **options)
    elapsed = time.perf_counter() - start
    cols = args.cols or min(8, len(out.images))
    image_grid(out.images, cols).save(args.out)
    if args.acceptance_map:
        acceptance_figure(out.images, out.stats.accept_step, pipe.model.grid, min(4, cols)).save(args.acceptance_map)
    stats = {**out.stats.to_dict(), "model": pipe.info.name, "class_ids": out.class_ids,
             "next_token_forward_passes": math.prod(pipe.model.grid), "total_time_s": elapsed}
    if args.stats:
        Path(args.stats).write_text(json.dumps(stats, indent=1))
    print(f"wrote {len(out.images)} images to {args.out} ({passes_summary(stats)}, {out.stats.wall_time_s:.2f} s "
          f"sampling)")


def passes_summary(stats: dict) -> str:
    """Forward passes against next-token AR's one per token, and tokens per pass, for the closing line."""
    return (f"{stats['forward_passes']} forward passes where next-token AR takes "
            f"{stats['next_token_forward_passes']}, {stats['tokens_per_forward']:.2f} tokens per pass")


def run_sample_video(args: argparse.Namespace, pipe, options: dict) -> None:
    """``vgen sample`` for a video pipeline: the clips side by side as one mp4 / GIF, or a frame-grid PNG."""
    from vgen.pipelines import tile_clips
    from vgen.video_io import VIDEO_FORMATS, write_video

    if Path(args.out).suffix.lower() not in VIDEO_FORMATS:
        raise UsageError(f"{pipe.info.name} generates videos; write them to one of {', '.join(VIDEO_FORMATS)}, "
                         f"not {Path(args.out).suffix}")
    context = None
    if args.context is not None:
        from vgen.eval.videos import read_video

        context = read_video(Path(args.context))
        if not 0 < args.context_frames <= len(context):
            raise UsageError(f"--context-frames must be between 1 and the {len(context)} frames of {args.context}, "
                             f"got {args.context_frames}")
        context = context[:args.context_frames]
    start = time.perf_counter()
    out = pipe(args.class_ids, num_videos=args.num_images, sampler=args.sampler, seed=args.seed,
               progress=not args.no_progress, context=context, **sampling_overrides(args), **options)
    elapsed = time.perf_counter() - start
    clip = tile_clips(out.videos, args.cols or min(4, len(out.videos)))
    write_video(clip, args.out, fps=args.fps)
    if args.acceptance_map:
        from vgen.visualize import clip_acceptance_figure

        clip_acceptance_figure(out.videos, out.stats.accept_step, pipe.model.grid).save(args.acceptance_map)
    stats = {**out.stats.to_dict(), "model": pipe.info.name, "class_ids": out.class_ids,
             "next_token_forward_passes": math.prod(pipe.model.grid), "total_time_s": elapsed,
             "frames_per_second": out.videos.shape[0] * out.videos.shape[1] / out.stats.wall_time_s}
    if args.stats:
        Path(args.stats).write_text(json.dumps(stats, indent=1))
    print(f"wrote {len(out.videos)} clips of {pipe.num_frames} frames to {args.out} ({passes_summary(stats)}, "
          f"{out.stats.wall_time_s:.2f} s sampling)")


# -- vgen train -----------------------------------------------------------------------------------------------


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train the embedded default models (resumable)")
    tsub = p.add_subparsers(dest="what", required=True)
    defaults = {"tokenizer": (900, 1e-3, 32, 100), "frame-tokenizer": (3000, 1e-3, 32, 100),
                "ar": (40000, 1e-3, 32, 500), "classifier": (3000, 2e-3, 64, 100),
                "drafter": (1500, 1e-3, 32, 100), "kl": (800, 1e-3, 32, 50),
                "mar": (3000, 1e-3, 32, 100), "nbp": (20000, 1e-3, 16, 500), "nar": (3000, 1e-3, 32, 100),
                "blockdiff": (2400, 6e-4, 8, 100), "video-classifier": (3000, 2e-3, 32, 100)}
    for what, (steps, lr, batch, warmup) in defaults.items():
        t = tsub.add_parser(what, help=f"train the shapes {what}")
        t.add_argument("--run-dir", default=str(RUNS / f"shapes-{what}"), help="checkpoints and logs (resumes)")
        t.add_argument("--data-dir", default=str(RUNS / "data"), help="rendered data cache")
        t.add_argument("--background", choices=BACKGROUND_KINDS, default=None,
                       help="render the data folder with this background (recorded in it; default: what the "
                            "folder records, else textured)")
        if what not in ("tokenizer", "frame-tokenizer", "kl", "blockdiff", "video-classifier"):
            t.add_argument("--tokenizer", default=str(RUNS / "shapes-tokenizer" / "export"),
                           help="trained tokenizer folder")
        if what in ("ar", "nar", "drafter", "nbp"):
            t.add_argument("--init-from", default=None,
                           help="start a new run from these model weights (an export folder) instead of random init"
                                + ("; an AR or NBP model's export warm-starts the NAR blocks and heads" if what == "nar"
                                   else "; e.g. the head of the model the target was fine-tuned from"
                                   if what == "drafter" else "; an NBP export in either block kind" if what == "nbp"
                                   else ""))
        if what == "mar":
            t.add_argument("--init-from", default=None,
                           help="start a new run from a continuous target (model or pipeline folder) to train it "
                                "further, or from a discrete AR pipeline folder (gpt/ and vq/, e.g. "
                                "vgen/assets/shapes-c2i): its trunk carries over and the token MLP is fitted to its "
                                "embeddings of the same images' VQ codes")
        if what == "blockdiff":
            t.add_argument("--tokenizer", default=None,
                           help="a KL tokenizer folder (e.g. vgen/assets/shapes-c2i-continuous/kl): denoise its "
                                "latent frames of the clips (the latent recipe, with --clips 64px) instead of pixels")
            t.add_argument("--image", action="store_true",
                           help="with --tokenizer: train the latent recipe's transformer on single frames (a "
                                "class-conditional image diffusion model), to --init-from the video run")
            t.add_argument("--init-from", default=None,
                           help="start a new run from a block-diffusion export of the same transformer (e.g. the "
                                "--image run's)")
            t.add_argument("--distill-from", default=None,
                           help="a block-diffusion model folder (e.g. vgen/assets/shapes-blockdiff-cfg/blockdiff): "
                                "distil its guided velocity at --teacher-cfg into a student of its architecture, "
                                "started from its weights, that streams without guidance")
            t.add_argument("--teacher-cfg", type=float, default=5.0, help="the teacher's CFG scale to distil")
        if what == "frame-tokenizer":
            t.add_argument("--encoder", choices=ENCODER_KINDS, default=None,
                           help="patch (the recipe's): each code reads only its own 4x4 pixels, so a patch that does "
                                "not change between frames keeps its code; conv: LlamaGen's encoder, which mixes the "
                                "whole frame into every code")
        if what in ("nbp", "nar"):
            t.add_argument("--no-time-reversed", action="store_true",
                           help="train on the clips as rendered only, not also played backwards"
                                + (" (with --video)" if what == "nar" else ""))
            t.add_argument("--first-frames", type=int, default=None,
                           help="frames of each clip that frame 0 also learns from as first frames ("
                                + ("default: the recipe's FIRST_FRAMES" if what == "nbp" else
                                   "with --video --image-first; default: VIDEO_NAR_FIRST_FRAMES") + "; 0 = off)")
        if what == "nar":
            t.add_argument("--image-first", action="store_true",
                           help="with --video: draw frame 0 first, as the image model draws an image (H + W - 1 "
                                "passes), then the other frames in the 3-D order (T + H + W - 3 passes), so that "
                                "--init-from an image NAR model draws frame 0 as that model does")
        if what == "nbp":
            t.add_argument("--block", choices=BLOCK_KINDS, default=None,
                           help="block kind: row (W tokens a step, NBP's own layout) or frame (H x W a step); "
                                "default: the recipe's")
            t.add_argument("--hybrid-blocks", type=int, default=None,
                           help="leading blocks drawn token by token (default: the recipe's); with --block row, the "
                                "rows of a frame (e.g. 16 for 64-px frames) draw all of frame 0 token by token, as an "
                                "image model of the frame grid draws an image, and each later row in one pass")
            t.add_argument("--rope", choices=ROPE_KINDS, default=None,
                           help="positions: grid (rotary over frames, rows and columns) or spatial (each frame's "
                                "rows and columns, as an image model of the frame grid, and a learned per-frame "
                                "embedding: needed to start from an image model); default: the recipe's")
        if what in ("nbp", "nar", "blockdiff"):
            t.add_argument("--clips", choices=sorted(CLIP_PRESETS), default=None,
                           help="clip geometry to render --data-dir with (32px: 16 frames of 32 x 32; 64px: 8 "
                                "frames of 64 x 64, the image models' frames, "
                                + ("in the KL tokenizer's latents" if what == "blockdiff" else
                                   "in the image tokenizer's codes, whose recipe starts from the image model: "
                                   "--init-from vgen/assets/shapes-c2i/gpt for nbp, shapes-nar/gpt for nar --video")
                                + "); default: what the folder records, else 32px")
        if what in ("ar", "nar"):
            t.add_argument("--video", action="store_true",
                           help="train on per-frame codes of the moving-shapes clips (--tokenizer: the frame "
                                "tokenizer; --num-images counts clips) instead of shapes images"
                                + ("; a next-token video AR, with no sample probe and no --init-from" if what == "ar"
                                   else ""))
        if what == "ar":
            t.add_argument("--classifier", default=str(RUNS / "shapes-classifier" / "export"),
                           help="domain classifier for the periodic class-accuracy probe (used once it exists)")
            t.add_argument("--eval-every", type=int, default=1000, help="steps between sample probes (0 = off)")
        if what in ("nbp", "nar"):
            t.add_argument("--eval-every", type=int, default=250,
                           help="steps between sample probes: 4 clips per class, per-frame class accuracy of the "
                                "clips, all frames and frame 0 (0 = off)" + ("; with --video" if what == "nar" else ""))
        if what == "mar":
            t.add_argument("--size", choices=("target", "draft"), default="target",
                           help="the target model or the small CSpD draft model")
            t.add_argument("--classifier", default=str(RUNS / "shapes-classifier" / "export"),
                           help="domain classifier for the periodic class-accuracy probe (used once it exists)")
            t.add_argument("--eval-every", type=int, default=500, help="steps between sample probes (0 = off)")
        if what == "drafter":
            t.add_argument("--target", default=str(RUNS / "shapes-ar" / "export"), help="trained AR model folder")
            t.add_argument("--codes-dir", default=str(RUNS / "shapes-ar"),
                           help="folder with the tokenised training split (the AR run's)")
        t.add_argument("--steps", type=int, default=steps)
        t.add_argument("--lr", type=float, default=lr)
        t.add_argument("--batch-size", type=int, default=batch)
        t.add_argument("--warmup-steps", type=int, default=warmup)
        t.add_argument("--num-images", type=int,
                       default={"drafter": 16000, "kl": 16000, "mar": 16000, "nbp": 4000,
                                "blockdiff": 5000, "frame-tokenizer": 5000, "nar": 24000,
                                "video-classifier": 5000}.get(what, 80000),
                       help="training images (clips for frame-tokenizer, nbp, nar --video, blockdiff and "
                            "video-classifier)")
        t.add_argument("--max-minutes", type=float, default=None, help="stop (and checkpoint) after this long")
        t.add_argument("--threads", type=int, default=None, help="torch CPU threads")
        t.add_argument("--device", default="cpu", help="where the model trains (cuda for a GPU; the video "
                                                        "recipes: nbp, nar, ar --video, blockdiff)")
        # fp32 where bf16 autocast measured slower on this CPU: 2x for blockdiff (1,024 tokens a clip), about 1.5x
        # for the frame tokenizer's 32-px frames and for nar (1.6 against 2.4 s for a batch of 8, 1 thread), 1.7x
        # for nbp (4.7 against 8.1 s for a batch of 4, 1 thread; docs/nbp.md), 2.7x for video-classifier (3.3
        # against 1.2 s for 32 + 32 clips, 2 threads), whose 3-D convolutions also gave an infinite bf16 gradient
        t.add_argument("--precision", choices=("auto", "bf16", "fp32"),
                       default="fp32" if what in ("blockdiff", "frame-tokenizer", "nar", "nbp", "video-classifier")
                       else "auto",
                       help="bf16 autocast or plain fp32 for the forward passes (auto: bf16 where the CPU has "
                            "native bf16 matmuls, AMX or AVX512-BF16, else fp32)")
        t.add_argument("--seed", type=int, default=0)
        t.set_defaults(func=run_train)
    add_package_parser(tsub)


def add_package_parser(tsub: argparse._SubParsersAction) -> None:
    t = tsub.add_parser("package", help="assemble trained models into a pipeline folder (e.g. vgen/assets/...)")
    t.add_argument("--gpt", required=True, help="trained AR model folder (the run's export/), or a block-diffusion "
                                                "model folder for a streaming pipeline")
    t.add_argument("--vq", default=None, help="trained tokenizer folder (VQ, or KL for a continuous model or a "
                                              "latent block-diffusion model; a pixel block-diffusion model has "
                                              "none)")
    t.add_argument("--drafter", default=None,
                   help="trained draft head folder, or draft model folder for a continuous model (optional)")
    t.add_argument("--data-dir", default=None, help="the data folder the models were trained on (its rendering "
                                                     "config is recorded in the pipeline)")
    t.add_argument("--out", required=True, help="pipeline folder to write")
    t.add_argument("--name", default="shapes-c2i")
    t.add_argument("--cfg-scale", type=float, default=2.0, help="recommended CFG scale stored as the default")
    t.add_argument("--temperature", type=float, default=None,
                   help="recommended sampling temperature stored as the default (token models; default: 1)")
    t.add_argument("--top-k", type=int, default=None, help="recommended top-k stored as the default (token models)")
    t.add_argument("--top-p", type=float, default=None, help="recommended top-p stored as the default (token models)")
    t.add_argument("--dtype", default="fp32", help="storage dtype of the weights (bf16 halves the size; they load "
                                                   "into fp32 models)")
    t.add_argument("--stream-defaults", default=None, metavar="JSON",
                   help="a block-diffusion pipeline's recommended stream settings, e.g. '{\"steps\": 4}'")
    t.set_defaults(func=run_package)


def recorded_token_settings(args: argparse.Namespace) -> dict:
    """The token-sampling defaults given to ``vgen train package`` (the CFG scale aside)."""
    return {name: getattr(args, name) for name in ("temperature", "top_k", "top_p") if getattr(args, name) is not None}


def run_package(args: argparse.Namespace) -> None:
    from dataclasses import asdict

    import torch

    from vgen.data.shapes import CLASS_NAMES, data_config
    from vgen.hub import PIPELINE_CONFIG, from_pretrained, save_pretrained
    from vgen.pipelines import ImagePipeline, PipelineInfo, tokenizer_folder
    from vgen.samplers import SamplingParams

    if args.dtype not in DTYPES:
        raise UsageError(f"unknown dtype {args.dtype!r}; expected one of {sorted(DTYPES)}")
    gpt = from_pretrained(args.gpt)
    if hasattr(gpt, "forward_block"):  # a block-diffusion model: a streaming pipeline
        return package_stream(args, gpt)
    if args.vq is None:
        raise UsageError("--vq is required for a token model")
    defaults = {"cfg_scale": args.cfg_scale, **recorded_token_settings(args)}
    try:
        SamplingParams(**defaults)
    except ValueError as e:
        raise UsageError(f"the recommended sampling settings are invalid: {e}") from None
    vq = from_pretrained(args.vq)
    head = from_pretrained(args.drafter) if args.drafter else None
    out = Path(args.out)
    dtype = getattr(torch, DTYPES[args.dtype])
    data = asdict(data_config(args.data_dir)) if args.data_dir else None
    info = PipelineInfo(name=args.name, image_size=gpt.grid[-1] * vq.downsample_factor,
                        class_names=list(CLASS_NAMES), defaults=defaults, data=data)
    if len(gpt.grid) == 3:  # a video backbone: frames x rows x columns
        from vgen.pipelines import VideoPipeline

        # the clips the model learnt from (the motion check of vgen quality renders real ones like them)
        info.data = asdict(recorded_clips_config(args.data_dir)) if args.data_dir else None
        VideoPipeline(gpt, vq, info, head)
    else:
        ImagePipeline(gpt, vq, info, head)  # the parts must fit together before anything is written
    save_pretrained(gpt, out / "gpt", dtype=dtype)
    save_pretrained(vq, out / tokenizer_folder(vq), dtype=dtype)
    if head is not None:
        save_pretrained(head, out / "drafter", dtype=dtype)
    (out / PIPELINE_CONFIG).write_text(json.dumps(info.to_dict(), indent=1))
    print(f"wrote pipeline {args.name} to {out}")


def package_stream(args: argparse.Namespace, model) -> None:
    """Write a streaming pipeline folder: ``blockdiff/`` (and ``kl/`` for a latent model) + ``pipeline.json`` with
    the recommended settings."""
    from dataclasses import asdict

    import torch

    from vgen.data.shapes import CLASS_NAMES
    from vgen.pipelines import PipelineInfo, StreamPipeline

    if args.drafter:
        raise UsageError("a block-diffusion pipeline takes no --drafter")
    if recorded_token_settings(args):
        raise UsageError("--temperature, --top-k and --top-p are token-sampling defaults; a block-diffusion "
                         "pipeline takes its settings as --stream-defaults")
    tokenizer = None
    if args.vq:  # a model of latent frames: its KL tokenizer decodes them
        from vgen.hub import from_pretrained
        from vgen.tokenizers.kl import KLTokenizer

        tokenizer = from_pretrained(args.vq)
        if not isinstance(tokenizer, KLTokenizer):
            raise UsageError(f"--vq {args.vq} holds a {type(tokenizer).__name__}; a block-diffusion pipeline takes "
                             f"the KL tokenizer of a latent model, or none for a pixel model")
    try:
        defaults = json.loads(args.stream_defaults) if args.stream_defaults else {}
    except json.JSONDecodeError as e:
        raise UsageError(f"--stream-defaults is not valid JSON: {e}") from None
    size = model.config.frame_size if tokenizer is None else tokenizer.config.image_size
    # the clips the model learnt from (benchmarks/streaming.py renders real clips like them)
    data = asdict(recorded_clips_config(args.data_dir)) if args.data_dir else None
    info = PipelineInfo(name=args.name, image_size=size, class_names=list(CLASS_NAMES), defaults=defaults,
                        data=data)
    pipe = StreamPipeline(model, info, tokenizer)
    pipe.stream_config().policy(model.frames_per_block, model.config.train_frames)  # the defaults must fit
    pipe.save_pretrained(args.out, dtype=getattr(torch, DTYPES[args.dtype]))
    print(f"wrote streaming pipeline {args.name} to {args.out}")


def run_train(args: argparse.Namespace) -> None:
    import torch

    from vgen.training.trainer import TrainConfig, use_bf16

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device != "cpu" and not (args.what in ("nbp", "nar", "blockdiff") or (args.what == "ar" and args.video)):
        raise UsageError(f"--device {args.device}: only the video recipes (nbp, nar, ar --video, blockdiff) train off "
                         f"the CPU; train {args.what} on the CPU")
    if args.background:
        from vgen.data.shapes import ShapesConfig, set_data_config

        set_data_config(args.data_dir, ShapesConfig(background=args.background))
    common = dict(steps=args.steps, lr=args.lr, warmup_steps=args.warmup_steps, seed=args.seed,
                  bf16=use_bf16(args.precision), device=args.device)
    if args.what == "tokenizer":
        from vgen.training.tokenizer import TokenizerRecipe, train_tokenizer

        train_tokenizer(args.run_dir, args.data_dir, TrainConfig(**common, weight_decay=0.0, ema_decay=0.99),
                        TokenizerRecipe(num_images=args.num_images, batch_size=args.batch_size), args.max_minutes)
    elif args.what == "frame-tokenizer":
        from vgen.training.tokenizer import SHAPES_FRAME_VQ, TokenizerRecipe, train_frame_tokenizer

        train_frame_tokenizer(args.run_dir, args.data_dir, TrainConfig(**common, weight_decay=0.0, ema_decay=0.99),
                              TokenizerRecipe(num_images=args.num_images, batch_size=args.batch_size),
                              dataclasses.replace(SHAPES_FRAME_VQ, encoder=args.encoder) if args.encoder
                              else SHAPES_FRAME_VQ,
                              max_minutes=args.max_minutes)
    elif args.what == "kl":
        from vgen.training.kl import KLRecipe, train_kl

        train_kl(args.run_dir, args.data_dir, TrainConfig(**common, weight_decay=0.0, ema_decay=0.99),
                 KLRecipe(num_images=args.num_images, batch_size=args.batch_size), max_minutes=args.max_minutes)
    elif args.what == "mar":
        from vgen.training.mar import SIZES, MARRecipe, mar_probe, train_mar

        probe = mar_probe(args.tokenizer, args.classifier) if args.eval_every else None
        train_mar(args.run_dir, args.tokenizer, args.data_dir, TrainConfig(**common, ema_decay=0.999),
                  MARRecipe(num_images=args.num_images, batch_size=args.batch_size, eval_every=args.eval_every or 1),
                  SIZES[args.size], max_minutes=args.max_minutes, evaluate=probe, init_from=args.init_from)
    elif args.what == "ar" and args.video:
        from vgen.training.clip_codes import ClipRecipe
        from vgen.training.video_ar import train_video_ar

        if args.init_from:
            raise UsageError("--init-from is for image AR runs; a video AR run starts from scratch")
        train_video_ar(args.run_dir, args.tokenizer, args.data_dir, TrainConfig(**common, ema_decay=0.999),
                       ClipRecipe(num_clips=args.num_images, batch_size=args.batch_size), max_minutes=args.max_minutes)
    elif args.what == "ar":
        from vgen.training.ar import ARRecipe, sample_probe, train_ar

        probe = sample_probe(args.tokenizer, args.classifier) if args.eval_every else None
        train_ar(args.run_dir, args.tokenizer, args.data_dir, TrainConfig(**common, ema_decay=0.999),
                 ARRecipe(num_images=args.num_images, batch_size=args.batch_size, eval_every=args.eval_every or 1),
                 max_minutes=args.max_minutes, evaluate=probe, init_from=args.init_from)
    elif args.what == "nbp":
        from vgen.training.clip_codes import ClipRecipe, clip_probe
        from vgen.training.nbp import FIRST_FRAMES, train_nbp, video_nbp_config

        clips = CLIP_PRESETS[args.clips] if args.clips else recorded_clips_config(args.data_dir)
        config = video_nbp_config(clips, args.block, args.rope, args.hybrid_blocks)
        train_nbp(args.run_dir, args.tokenizer, args.data_dir, TrainConfig(**common, ema_decay=0.999),
                  ClipRecipe(num_clips=args.num_images, batch_size=args.batch_size,
                             time_reversed=not args.no_time_reversed, eval_every=args.eval_every or 1),
                  max_minutes=args.max_minutes,
                  config=config, clips=clips,
                  first_frames=FIRST_FRAMES if args.first_frames is None else args.first_frames,
                  evaluate=clip_probe(args.tokenizer, clips) if args.eval_every else None, init_from=args.init_from)
    elif args.what == "nar":
        from vgen.training.clip_codes import ClipRecipe, clip_probe
        from vgen.training.nar import (
            SHAPES_VIDEO_NAR,
            VIDEO_NAR_FIRST_FRAMES,
            VIDEO_NAR_RECIPES,
            NARRecipe,
            train_nar,
            train_video_nar,
        )

        train = TrainConfig(**common, ema_decay=0.999)
        if (args.image_first or args.first_frames is not None) and not args.video:
            raise UsageError("--image-first and --first-frames train a video model: add --video")
        if args.first_frames and not args.image_first:
            raise UsageError("--first-frames trains frame 0 alone, which needs --image-first")
        if args.video:
            clips = CLIP_PRESETS[args.clips] if args.clips else recorded_clips_config(args.data_dir)
            config = dataclasses.replace(VIDEO_NAR_RECIPES.get(clips, SHAPES_VIDEO_NAR), image_first=args.image_first)
            first_frames = args.first_frames if args.first_frames is not None else (
                VIDEO_NAR_FIRST_FRAMES if args.image_first else 0)
            train_video_nar(args.run_dir, args.tokenizer, args.data_dir, train,
                            ClipRecipe(num_clips=args.num_images, batch_size=args.batch_size,
                                       time_reversed=not args.no_time_reversed, eval_every=args.eval_every or 1),
                            config, clips, max_minutes=args.max_minutes, init_from=args.init_from,
                            evaluate=clip_probe(args.tokenizer, clips) if args.eval_every else None,
                            first_frames=first_frames)
        else:
            train_nar(args.run_dir, args.tokenizer, args.data_dir, train,
                      NARRecipe(num_items=args.num_images, batch_size=args.batch_size), max_minutes=args.max_minutes,
                      init_from=args.init_from)
    elif args.what == "blockdiff":
        from vgen.training.blockdiff import (
            SHAPES_BLOCKDIFF,
            SHAPES_LATENT_BLOCKDIFF,
            SHAPES_LATENT_IMAGE_DIFF,
            BlockDiffRecipe,
            train_blockdiff,
        )

        if args.image and args.tokenizer is None:
            raise UsageError("--image trains the latent recipe on single frames: give the KL --tokenizer")
        if args.distill_from and (args.image or args.init_from):
            raise UsageError("--distill-from starts the student from the teacher: drop --image and --init-from")
        config = (SHAPES_BLOCKDIFF if args.tokenizer is None
                  else SHAPES_LATENT_IMAGE_DIFF if args.image else SHAPES_LATENT_BLOCKDIFF)
        clips = CLIP_PRESETS[args.clips] if args.clips else recorded_clips_config(args.data_dir)
        train_blockdiff(args.run_dir, args.data_dir, TrainConfig(**common, ema_decay=0.999),
                        BlockDiffRecipe(num_clips=args.num_images, batch_size=args.batch_size), config, clips,
                        max_minutes=args.max_minutes, tokenizer_dir=args.tokenizer, init_from=args.init_from,
                        teacher=args.distill_from, teacher_cfg=args.teacher_cfg)
    elif args.what == "video-classifier":
        from vgen.training.video_classifier import VideoClassifierRecipe, train_video_classifier

        figures = train_video_classifier(args.run_dir, args.data_dir, TrainConfig(**common, ema_decay=0.99),
                                         VideoClassifierRecipe(num_clips=args.num_images, batch_size=args.batch_size),
                                         max_minutes=args.max_minutes)
        print(json.dumps(figures))
    elif args.what == "drafter":
        from vgen.training.drafter import DrafterRecipe, train_drafter

        train_drafter(args.run_dir, args.target, args.tokenizer, args.data_dir, args.codes_dir,
                      TrainConfig(**common, ema_decay=0.99),
                      DrafterRecipe(num_images=args.num_images, batch_size=args.batch_size), args.max_minutes,
                      init_from=args.init_from)
    else:
        from vgen.training.classifier import ClassifierRecipe, train_classifier

        figures = train_classifier(args.run_dir, args.tokenizer, args.data_dir, TrainConfig(**common),
                                   ClassifierRecipe(num_images=args.num_images, batch_size=args.batch_size),
                                   args.max_minutes)
        print(json.dumps(figures))
    print(f"exported to {Path(args.run_dir) / 'export'}")


# -- vgen quality ---------------------------------------------------------------------------------------------


def add_quality_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quality", help="token statistics and class accuracy of a model's samples",
                       description="Sample --num-images images or clips (classes in turn), then report the mean "
                                   "entropy and median top-1 probability of the token distributions they were drawn "
                                   "from (discrete-token models), and the domain classifier's class accuracy on "
                                   "them (on every frame of a clip, with a motion check against real clips). A "
                                   "streaming (block-diffusion) model is measured on --num-frames-long streams.")
    p.add_argument("--model", default="shapes-c2i")
    p.add_argument("--num-images", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    add_sampling_args(p)  # unset: the model's recommended values; a streaming model takes --cfg-scale only
    p.add_argument("--num-frames", type=int, default=None,
                   help="streaming models: frames per clip (default: the length the model was trained on)")
    p.add_argument("--grid", default=None, help="also write a grid, one row per class, of the first samples")
    p.add_argument("--json", default=None, help="write the figures here")
    p.add_argument("--device", default="cpu", help="where the model samples (the judges run on the CPU)")
    p.set_defaults(func=run_quality)


def run_quality(args: argparse.Namespace) -> None:
    import numpy as np
    import torch

    from vgen import pipelines
    from vgen.eval.classifier import load_shapes_classifier
    from vgen.eval.quality import class_accuracy, token_statistics
    from vgen.images import image_grid
    from vgen.pipelines import StreamPipeline
    from vgen.samplers import SamplingParams

    check_writable(args.grid, IMAGE_SUFFIXES)
    check_writable(args.json, {".json"})
    if args.num_images < 1 or args.batch_size < 1:
        raise UsageError("--num-images and --batch-size must be >= 1")
    pipe = pipelines.load(args.model, device=args.device)
    if isinstance(pipe, StreamPipeline):
        return write_quality(stream_quality(pipe, args), args.json)
    if not isinstance(pipe, pipelines.ImagePipeline):
        raise UsageError(f"vgen quality measures token models (images or clips); {pipe.info.name} is not one")
    if args.num_frames is not None:
        raise UsageError("--num-frames is for streaming models; a token model's clips have a fixed length")
    params = SamplingParams(**{**pipe.info.defaults, **sampling_overrides(args)})
    n_cls = pipe.num_classes
    classes = [i % n_cls for i in range(args.num_images)]
    tokens, images = [], []
    generator = torch.Generator(pipe.device).manual_seed(args.seed)
    for i in range(0, args.num_images, args.batch_size):
        out = pipe(classes[i:i + args.batch_size], generator=generator, progress=True, **params.to_dict())
        tokens.append(out.tokens)
        images.extend(out.videos if hasattr(pipe, "num_frames") else out.images)
    tokens_t = torch.cat(tokens)
    figures = {"model": pipe.info.name, "sampling": params.to_dict(), "seed": args.seed}
    if not tokens_t.is_floating_point():  # continuous tokens are drawn from densities: no entropy or top-1 here
        figures.update(token_statistics(pipe.model, tokens_t, torch.tensor(classes), params))
    if hasattr(pipe, "num_frames"):
        figures.update(clip_figures(pipe, np.stack(images), classes, args.grid))
    else:
        pixels = torch.from_numpy(np.stack([np.array(im) for im in images]))
        pixels = pixels.permute(0, 3, 1, 2).float().div(127.5).sub(1)
        figures.update(class_accuracy(load_shapes_classifier(), pixels, classes))
        if args.grid:
            per_class = max(1, min(8, args.num_images // n_cls))
            rows = [images[c + n_cls * j] for c in range(n_cls) for j in range(per_class)
                    if c + n_cls * j < len(images)]
            image_grid(rows, per_class).save(args.grid)
    write_quality(figures, args.json)


def write_quality(figures: dict, path: str | None) -> None:
    text = json.dumps(figures, indent=1)
    if path:
        Path(path).write_text(text)
    print(text)


def stream_quality(pipe, args: argparse.Namespace) -> dict:
    """``vgen quality`` for a streaming pipeline: clips of ``--num-frames`` streamed in batches (seed
    ``--seed`` plus the batch's first index), judged as the token video models' clips are."""
    import numpy as np

    frames = pipe.model.config.train_frames if args.num_frames is None else args.num_frames
    if frames < 2:
        raise UsageError(f"--num-frames must be >= 2 (the motion check compares frames), got {frames}")
    token_settings = sorted(set(sampling_overrides(args)) - {"cfg_scale"})
    if token_settings:
        raise UsageError(f"{', '.join('--' + name.replace('_', '-') for name in token_settings)} sample tokens; "
                         f"a streaming model denoises frames")
    options = {"cfg_scale": args.cfg_scale} if args.cfg_scale is not None else {}
    try:
        config = pipe.stream_config(**options)
    except ValueError as e:
        raise UsageError(str(e)) from None
    classes = [i % pipe.num_classes for i in range(args.num_images)]
    videos = [pipe(classes[i:i + args.batch_size], num_frames=frames, seed=args.seed + i, progress=True,
                   **options).videos for i in range(0, args.num_images, args.batch_size)]
    figures = {"model": pipe.info.name, "sampling": dataclasses.asdict(config), "seed": args.seed,
               "num_frames": frames}
    return {**figures, **clip_figures(pipe, np.concatenate(videos), classes, args.grid)}


def clip_figures(pipe, videos, classes: list[int], grid: str | None) -> dict:
    """``vgen quality`` for a video pipeline: :func:`~vgen.eval.quality.clip_quality` of the clips
    [N, T, H, W, 3] against real clips of the same length; ``grid`` gets one clip per class, a row of frames
    each."""
    from PIL import Image

    from vgen.data.clips import ClipsConfig
    from vgen.eval.quality import clip_quality
    from vgen.images import image_grid

    length = videos.shape[1]
    clips = ClipsConfig(**pipe.info.data) if pipe.info.data else ClipsConfig(frame_size=pipe.info.image_size)
    figures = clip_quality(videos, classes, dataclasses.replace(clips, num_frames=length))
    if grid:
        first = [classes.index(c) for c in range(pipe.num_classes) if c in classes]
        frames = [Image.fromarray(frame) for i in first for frame in videos[i]]
        image_grid(frames, length).save(grid)
    return figures


# -- entry point ----------------------------------------------------------------------------------------------


def list_models(args: argparse.Namespace) -> None:
    from vgen.pipelines import available_models

    print("\n".join(available_models()))


def list_samplers(args: argparse.Namespace) -> None:
    from vgen.samplers import available_samplers

    print("\n".join(available_samplers()))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vgen", description="Visual autoregressive generation with fast samplers.")
    sub = parser.add_subparsers(dest="command")
    add_sample_parser(sub)
    add_train_parser(sub)
    add_quality_parser(sub)
    add_app_parser(sub)
    add_eval_parser(sub)
    add_sample_many_parser(sub)
    add_bench_parser(sub)
    add_stream_parser(sub)
    sub.add_parser("models", help="list the embedded models").set_defaults(func=list_models)
    sub.add_parser("samplers", help="list the samplers").set_defaults(func=list_samplers)
    return parser


def add_eval_parser(sub: argparse._SubParsersAction) -> None:
    from vgen.apps.eval_cli import add_eval_parser as add

    add(sub)


def add_sample_many_parser(sub: argparse._SubParsersAction) -> None:
    from vgen.apps.sample_many_cli import add_sample_many_parser as add

    add(sub)


def add_stream_parser(sub: argparse._SubParsersAction) -> None:
    from vgen.apps.stream_cli import add_stream_parser as add

    add(sub)


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    from vgen.apps.bench_cli import add_bench_parser as add

    add(sub)


def add_app_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("app", help="the Gradio web demo (needs the app extra: pip install -e '.[app]')")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--share", action=argparse.BooleanOptionalAction, default=False,
                   help="a public gradio.live link (off by default)")
    p.add_argument("--max-concurrency", type=int, default=2, help="generations that run at once")
    p.add_argument("--model", default="shapes-c2i", help="the model selected when the page opens")
    p.set_defaults(func=run_app)


def run_app(args: argparse.Namespace) -> None:
    if args.max_concurrency < 1:
        raise UsageError(f"--max-concurrency must be >= 1, got {args.max_concurrency}")
    try:
        import gradio  # noqa: F401
    except ImportError:
        raise UsageError("the web demo needs gradio: pip install -e '.[app]'") from None
    from vgen.apps.gradio_app import build_app

    build_app(args.model, args.max_concurrency).launch(server_name=args.host, server_port=args.port,
                                                       share=args.share)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv or ["sample"])
    try:
        args.func(args)
    except (UsageError, CheckpointError, ValueError) as e:
        print(f"vgen: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"vgen: error: {e.strerror or e}: {e.filename or ''}".rstrip(": "), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("vgen: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
