"""``vgen train <recipe>``: the shapes recipes (resumable), and ``vgen train package``, which assembles trained
models into a pipeline folder.

Each recipe is one :class:`TrainCommand`: its defaults (from its module in :mod:`vgen.training`), the flags of
its own, and the function that runs it; the flags every recipe takes are added once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from vgen.apps.options import (
    RUNS,
    UsageError,
    add_option_flags,
    add_overwrite_flag,
    check_files_in,
    device_name,
    sampling_options,
    set_options,
    torch_dtype,
)
from vgen.data.clips import CLIP_PRESETS, ClipsConfig, recorded_clips_config
from vgen.data.moving_scenes import evaluation_prompts
from vgen.data.scenes import EXAMPLE_PROMPTS
from vgen.data.shapes import BACKGROUND_KINDS, CLASS_NAMES, ShapesConfig, data_config, set_data_config
from vgen.eval.classifier import load_scene_judge
from vgen.hub import PIPELINE_CONFIG, from_pretrained
from vgen.models.backbone import ROPE_KINDS
from vgen.models.mar import MARConfig
from vgen.models.nbp import BLOCK_KINDS
from vgen.models.word_encoder import WordTextEncoder
from vgen.pipelines import ImagePipeline, PipelineInfo, StreamPipeline, VideoPipeline
from vgen.samplers import SamplingParams
from vgen.samplers.options import declarations
from vgen.samplers.streaming import StreamConfig
from vgen.tokenizers.kl import KLTokenizer
from vgen.tokenizers.vq import ENCODER_KINDS
from vgen.training.ar import AR_CFG_SCALE, AR_RUN, ARRecipe, sample_probe, train_ar
from vgen.training.blockdiff import (
    BLOCKDIFF_RUN,
    SHAPES_BLOCKDIFF,
    SHAPES_LATENT_BLOCKDIFF,
    SHAPES_LATENT_IMAGE_DIFF,
    TEACHER_CFG,
    BlockDiffRecipe,
    train_blockdiff,
)
from vgen.training.classifier import CLASSIFIER_RUN, ClassifierRecipe, train_classifier
from vgen.training.clip_codes import ClipRecipe, clip_probe
from vgen.training.drafter import DRAFTER_RUN, DrafterRecipe, train_drafter
from vgen.training.kl import KL_RUN, KLRecipe, train_kl
from vgen.training.mar import MAR_RUN, SIZES, MARRecipe, mar_probe, train_mar
from vgen.training.nar import (
    NAR_RUN,
    SHAPES_VIDEO_NAR,
    VIDEO_NAR_FIRST_FRAMES,
    VIDEO_NAR_RECIPES,
    NARRecipe,
    train_nar,
    train_video_nar,
)
from vgen.training.nbp import FIRST_FRAMES, NBP_RUN, train_nbp, video_nbp_config
from vgen.training.scene_judge import SCENE_JUDGE_RUN, SceneJudgeRecipe, train_scene_judge
from vgen.training.t2i import T2I_CFG_SCALE, T2I_RUN, T2IRecipe, prompt_probe, train_t2i
from vgen.training.t2v_stream import (
    CAPTION_POOL_STARTS,
    CLASS_TEACHER,
    STREAM_KL_RUN,
    T2I_TEXT_ENCODER,
    T2V_RUN,
    T2V_TEACHER_CFG,
    T2VRecipe,
    train_stream_kl,
    train_t2v_stream,
)
from vgen.training.tokenizer import (
    FRAME_TOKENIZER_RUN,
    SHAPES_FRAME_VQ,
    TOKENIZER_RUN,
    TokenizerRecipe,
    train_frame_tokenizer,
    train_tokenizer,
)
from vgen.training.trainer import RunDefaults, TrainConfig, use_bf16
from vgen.training.video_ar import train_video_ar
from vgen.training.video_classifier import VIDEO_CLASSIFIER_RUN, VideoClassifierRecipe, train_video_classifier

CLASSIFIER_DIR = RUNS / "shapes-classifier" / "export"


@dataclass(frozen=True)
class TrainCommand:
    """One recipe of ``vgen train``: its defaults, a function adding its own flags, the function that trains with
    the parsed arguments and the run's :class:`TrainConfig`, whether it may train off the CPU (the video
    recipes), and a function refusing combinations of its flags that do not go together (called before anything
    is written)."""

    defaults: RunDefaults
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, TrainConfig], Any]
    off_cpu: bool = False
    check: Callable[[argparse.Namespace], None] | None = None


# -- flags that several recipes share ------------------------------------------------------------------------


def add_tokenizer(t: argparse.ArgumentParser) -> None:
    t.add_argument("--tokenizer", default=str(RUNS / "shapes-tokenizer" / "export"), help="trained tokenizer folder")


def add_init_from(t: argparse.ArgumentParser, detail: str = "") -> None:
    t.add_argument("--init-from", default=None,
                   help="start a new run from these model weights (an export folder) instead of random init" + detail)


def add_clip_sampling(t: argparse.ArgumentParser, first_frames_default: str, video_note: str = "") -> None:
    """--no-time-reversed and --first-frames of the video token recipes."""
    t.add_argument("--no-time-reversed", action="store_true",
                   help="train on the clips as rendered only, not also played backwards" + video_note)
    t.add_argument("--first-frames", type=int, default=None,
                   help="frames of each clip that frame 0 also learns from as first frames ("
                        + first_frames_default + "; 0 = off)")


def add_clips(t: argparse.ArgumentParser, codes: str) -> None:
    t.add_argument("--clips", choices=sorted(CLIP_PRESETS), default=None,
                   help="clip geometry to render --data-dir with (32px: 16 frames of 32 x 32; 64px: 8 frames of "
                        "64 x 64, the image models' frames, " + codes + "; 64px-16f: the 64px clips with 16 "
                        "frames); default: what the folder records, else 32px")


def add_video(t: argparse.ArgumentParser, detail: str = "") -> None:
    t.add_argument("--video", action="store_true",
                   help="train on per-frame codes of the moving-shapes clips (--tokenizer: the frame tokenizer; "
                        "--num-images counts clips) instead of shapes images" + detail)


def add_classifier(t: argparse.ArgumentParser) -> None:
    t.add_argument("--classifier", default=str(CLASSIFIER_DIR),
                   help="domain classifier for the periodic class-accuracy probe (used once it exists)")


def add_eval_every(t: argparse.ArgumentParser, default: int,
                   help: str = "steps between sample probes (0 = off)") -> None:
    t.add_argument("--eval-every", type=int, default=default, help=help)


def clips_of(args: argparse.Namespace) -> ClipsConfig:
    """The clip geometry: --clips, else what --data-dir records."""
    return CLIP_PRESETS[args.clips] if args.clips else recorded_clips_config(args.data_dir)


def clip_recipe(args: argparse.Namespace) -> ClipRecipe:
    return ClipRecipe(num_clips=args.num_images, batch_size=args.batch_size, time_reversed=not args.no_time_reversed,
                      eval_every=args.eval_every or 1)


# -- the recipes ---------------------------------------------------------------------------------------------


def run_tokenizer(args: argparse.Namespace, train: TrainConfig) -> None:
    recipe = TokenizerRecipe(num_images=args.num_images, batch_size=args.batch_size)
    train_tokenizer(args.run_dir, args.data_dir, train, recipe, max_minutes=args.max_minutes)


def add_frame_tokenizer_args(t: argparse.ArgumentParser) -> None:
    t.add_argument("--encoder", choices=ENCODER_KINDS, default=None,
                   help="patch (the recipe's): each code reads only its own 4x4 pixels, so a patch that does not "
                        "change between frames keeps its code; conv: LlamaGen's encoder, which mixes the whole "
                        "frame into every code")


def run_frame_tokenizer(args: argparse.Namespace, train: TrainConfig) -> None:
    vq = dataclasses.replace(SHAPES_FRAME_VQ, encoder=args.encoder) if args.encoder else SHAPES_FRAME_VQ
    recipe = TokenizerRecipe(num_images=args.num_images, batch_size=args.batch_size)
    train_frame_tokenizer(args.run_dir, args.data_dir, train, recipe, vq, max_minutes=args.max_minutes)


def run_kl(args: argparse.Namespace, train: TrainConfig) -> None:
    train_kl(args.run_dir, args.data_dir, train, KLRecipe(num_images=args.num_images, batch_size=args.batch_size),
             max_minutes=args.max_minutes)


def add_mar_args(t: argparse.ArgumentParser) -> None:
    add_tokenizer(t)
    t.add_argument("--init-from", default=None,
                   help="start a new run from a continuous target (model or pipeline folder) to train it further, "
                        "or from a discrete AR pipeline folder (gpt/ and vq/, e.g. vgen/assets/shapes-c2i): its "
                        "trunk carries over and the token MLP is fitted to its embeddings of the same images' VQ "
                        "codes")
    t.add_argument("--size", choices=("target", "draft"), default="target",
                   help="the target model or the small CSpD draft model")
    t.add_argument("--head-depth", type=int, default=None, metavar="N",
                   help="residual blocks of the diffusion head (default: the size's, 3 for the target and 2 for the "
                        "draft; MAR-B has 6); with --init-from a continuous target of a shallower head, the added "
                        "blocks start as identities, so the run starts from that model's samples")
    add_classifier(t)
    add_eval_every(t, MARRecipe.eval_every)
    add_class_repeats(t, "image")
    t.add_argument("--context-noise", type=float, default=MARRecipe.context_noise, metavar="SIGMA",
                   help="perturb the prefix the trunk reads with Gaussian noise of a std drawn per image from "
                        "[0, SIGMA] (token units; the targets stay clean), so that the trunk learns to read "
                        "imperfect tokens as it does when sampling; 0 trains on exact prefixes")


def mar_recipe(args: argparse.Namespace) -> MARRecipe:
    """The recipe the flags ask for (it checks the class repeats and the context noise)."""
    return MARRecipe(num_images=args.num_images, batch_size=args.batch_size, eval_every=args.eval_every or 1,
                     class_repeats=class_repeats(args.class_repeats), context_noise=args.context_noise)


def mar_config(args: argparse.Namespace) -> MARConfig:
    """The model size the flags ask for (``--size``, with ``--head-depth`` in place of its head depth)."""
    config = SIZES[args.size]
    if args.head_depth is None:
        return config
    if args.head_depth < 1:
        raise UsageError(f"--head-depth must be >= 1, got {args.head_depth}")
    return replace(config, head_depth=args.head_depth)


def check_mar(args: argparse.Namespace) -> None:
    mar_config(args)
    try:
        mar_recipe(args)
    except ValueError as e:
        raise UsageError(str(e)) from None


def run_mar(args: argparse.Namespace, train: TrainConfig) -> None:
    probe = mar_probe(args.tokenizer, args.classifier) if args.eval_every else None
    train_mar(args.run_dir, args.tokenizer, args.data_dir, train, mar_recipe(args), mar_config(args),
              max_minutes=args.max_minutes, evaluate=probe, init_from=args.init_from)


def add_ar_args(t: argparse.ArgumentParser) -> None:
    add_tokenizer(t)
    add_init_from(t, "; with --video on 64-px clips, an image model (vgen/assets/shapes-c2i/gpt) or an NBP export "
                     "(vgen/assets/shapes-video-nbp/gpt)")
    add_video(t, "; a next-token video AR, with no sample probe")
    add_clips(t, "in the tokenizer's codes; with --video")
    add_classifier(t)
    add_eval_every(t, ARRecipe.eval_every)


def run_ar(args: argparse.Namespace, train: TrainConfig) -> None:
    if args.video:
        train_video_ar(args.run_dir, args.tokenizer, args.data_dir, train,
                       ClipRecipe(num_clips=args.num_images, batch_size=args.batch_size), clips=clips_of(args),
                       max_minutes=args.max_minutes, init_from=args.init_from)
        return
    probe = sample_probe(args.tokenizer, args.classifier) if args.eval_every else None
    train_ar(args.run_dir, args.tokenizer, args.data_dir, train,
             ARRecipe(num_images=args.num_images, batch_size=args.batch_size, eval_every=args.eval_every or 1),
             max_minutes=args.max_minutes, evaluate=probe, init_from=args.init_from)


CLIP_PROBE_HELP = ("steps between sample probes: 4 clips per class, per-frame class accuracy of the clips, all "
                   "frames and frame 0 (0 = off)")
IMAGE_CODES = ("in the image tokenizer's codes, whose recipe starts from the image model: --init-from "
               "vgen/assets/shapes-c2i/gpt for nbp, shapes-nar/gpt for nar --video")


def add_nbp_args(t: argparse.ArgumentParser) -> None:
    add_tokenizer(t)
    add_init_from(t, "; an NBP export in either block kind")
    add_clip_sampling(t, "default: the recipe's FIRST_FRAMES")
    t.add_argument("--block", choices=BLOCK_KINDS, default=None,
                   help="block kind: row (W tokens a step, NBP's own layout) or frame (H x W a step); default: the "
                        "recipe's")
    t.add_argument("--hybrid-blocks", type=int, default=None,
                   help="leading blocks drawn token by token (default: the recipe's); with --block row, the rows of "
                        "a frame (e.g. 16 for 64-px frames) draw all of frame 0 token by token, as an image model of "
                        "the frame grid draws an image, and each later row in one pass")
    t.add_argument("--rope", choices=ROPE_KINDS, default=None,
                   help="positions: grid (rotary over frames, rows and columns) or spatial (each frame's rows and "
                        "columns, as an image model of the frame grid, and a learned per-frame embedding: needed to "
                        "start from an image model); default: the recipe's")
    add_clips(t, IMAGE_CODES)
    add_eval_every(t, ClipRecipe.eval_every, CLIP_PROBE_HELP)


def run_nbp(args: argparse.Namespace, train: TrainConfig) -> None:
    clips = clips_of(args)
    train_nbp(args.run_dir, args.tokenizer, args.data_dir, train, clip_recipe(args), max_minutes=args.max_minutes,
              config=video_nbp_config(clips, args.block, args.rope, args.hybrid_blocks), clips=clips,
              first_frames=FIRST_FRAMES if args.first_frames is None else args.first_frames,
              evaluate=clip_probe(args.tokenizer, clips) if args.eval_every else None, init_from=args.init_from)


def add_nar_args(t: argparse.ArgumentParser) -> None:
    add_tokenizer(t)
    add_init_from(t, "; an AR or NBP model's export warm-starts the NAR blocks and heads")
    add_clip_sampling(t, "with --video --image-first; default: VIDEO_NAR_FIRST_FRAMES", " (with --video)")
    t.add_argument("--image-first", action="store_true",
                   help="with --video: draw frame 0 first, as the image model draws an image (H + W - 1 passes), "
                        "then the other frames in the 3-D order (T + H + W - 3 passes), so that --init-from an image "
                        "NAR model draws frame 0 as that model does")
    add_clips(t, IMAGE_CODES)
    add_video(t)
    add_eval_every(t, ClipRecipe.eval_every, CLIP_PROBE_HELP + "; with --video")


def check_nar(args: argparse.Namespace) -> None:
    if (args.image_first or args.first_frames is not None) and not args.video:
        raise UsageError("--image-first and --first-frames train a video model: add --video")
    if args.first_frames and not args.image_first:
        raise UsageError("--first-frames trains frame 0 alone, which needs --image-first")


def run_nar(args: argparse.Namespace, train: TrainConfig) -> None:
    if not args.video:
        train_nar(args.run_dir, args.tokenizer, args.data_dir, train,
                  NARRecipe(num_items=args.num_images, batch_size=args.batch_size), max_minutes=args.max_minutes,
                  init_from=args.init_from)
        return
    clips = clips_of(args)
    model = dataclasses.replace(VIDEO_NAR_RECIPES.get(clips, SHAPES_VIDEO_NAR), image_first=args.image_first)
    first_frames = args.first_frames if args.first_frames is not None else (
        VIDEO_NAR_FIRST_FRAMES if args.image_first else 0)
    train_video_nar(args.run_dir, args.tokenizer, args.data_dir, train, clip_recipe(args), model, clips,
                    max_minutes=args.max_minutes, init_from=args.init_from,
                    evaluate=clip_probe(args.tokenizer, clips) if args.eval_every else None, first_frames=first_frames)


def add_blockdiff_args(t: argparse.ArgumentParser) -> None:
    t.add_argument("--tokenizer", default=None,
                   help="a KL tokenizer folder (e.g. vgen/assets/shapes-c2i-continuous/kl): denoise its latent "
                        "frames of the clips (the latent recipe, with --clips 64px) instead of pixels")
    t.add_argument("--image", action="store_true",
                   help="with --tokenizer: train the latent recipe's transformer on single frames (a "
                        "class-conditional image diffusion model), to --init-from the video run")
    t.add_argument("--init-from", default=None,
                   help="start a new run from a block-diffusion export of the same transformer (e.g. the --image "
                        "run's)")
    t.add_argument("--distill-from", default=None,
                   help="a block-diffusion model folder (e.g. vgen/assets/shapes-blockdiff-cfg/blockdiff): distil "
                        "its guided velocity at --teacher-cfg into a student of its architecture, started from its "
                        "weights, that streams without guidance")
    t.add_argument("--teacher-cfg", type=float, default=TEACHER_CFG, help="the teacher's CFG scale to distil")
    t.add_argument("--noise-shift", type=float, default=BlockDiffRecipe.noise_shift,
                   help="warp the training noise levels by this shift (1: uniform; 3: as the streams' schedule, "
                        "more training at the high levels that decide a block's shape)")
    t.add_argument("--lone-block-share", type=float, default=BlockDiffRecipe.lone_block_share,
                   help="share of steps whose clips are cut into single blocks, each trained as a stream's first "
                        "block (no context)")
    add_class_repeats(t, "clip")
    t.add_argument("--rollout-share", type=float, default=BlockDiffRecipe.rollout_share,
                   help="with --distill-from: share of steps on the student's own streams (its cache's blocks as "
                        "context, the block it drew after them as input), Self-Forcing's remedy for drift")
    t.add_argument("--rollout-blocks", type=int, default=BlockDiffRecipe.rollout_blocks,
                   help="the longest of those streams, in blocks (each batch of streams runs a random length up "
                        "to it)")
    add_clips(t, "in the KL tokenizer's latents")


def check_blockdiff(args: argparse.Namespace) -> None:
    if args.image and args.tokenizer is None:
        raise UsageError("--image trains the latent recipe on single frames: give the KL --tokenizer")
    if args.distill_from and (args.image or args.init_from):
        raise UsageError("--distill-from starts the student from the teacher: drop --image and --init-from")
    declarations(StreamConfig)["cfg_scale"].spec.check("--teacher-cfg", args.teacher_cfg, float)
    if args.rollout_share and not args.distill_from:
        raise UsageError("--rollout-share trains a student on its own streams against a teacher: give "
                         "--distill-from")
    try:
        blockdiff_recipe(args)
    except ValueError as e:
        raise UsageError(str(e)) from None


def blockdiff_recipe(args: argparse.Namespace) -> BlockDiffRecipe:
    """The recipe the flags ask for (it checks their ranges)."""
    return BlockDiffRecipe(num_clips=args.num_images, batch_size=args.batch_size, noise_shift=args.noise_shift,
                           lone_block_share=args.lone_block_share, class_repeats=class_repeats(args.class_repeats),
                           rollout_share=args.rollout_share, rollout_blocks=args.rollout_blocks)


def add_class_repeats(t: argparse.ArgumentParser, item: str) -> None:
    t.add_argument("--class-repeats", nargs="+", default=[], metavar="CLASS=N",
                   help=f"show each {item} of these classes N times an epoch (others once), e.g. square=3 "
                        "triangle=3: more of the training on the classes the model draws worst")


def class_repeats(pairs: list[str]) -> dict[str, int]:
    """``["square=3", ...]`` -> ``{"square": 3, ...}`` (the recipe checks the names and counts)."""
    repeats = {}
    for pair in pairs:
        name, sep, count = pair.partition("=")
        if not sep or not count.strip().lstrip("-").isdigit():
            raise ValueError(f"--class-repeats takes CLASS=N pairs with an integer N, got {pair!r}")
        if name.strip() in repeats:
            raise ValueError(f"--class-repeats names {name.strip()!r} twice")
        repeats[name.strip()] = int(count)
    return repeats


def run_blockdiff(args: argparse.Namespace, train: TrainConfig) -> None:
    """A video model trains on whole clips: its trained frames are the clips' (8 or 16 for the 64-px presets)."""
    clips = clips_of(args)
    model = (SHAPES_LATENT_IMAGE_DIFF if args.image else
             replace(SHAPES_BLOCKDIFF if args.tokenizer is None else SHAPES_LATENT_BLOCKDIFF,
                     train_frames=clips.num_frames))
    train_blockdiff(args.run_dir, args.data_dir, train, blockdiff_recipe(args), model, clips,
                    max_minutes=args.max_minutes, tokenizer_dir=args.tokenizer, init_from=args.init_from,
                    teacher=args.distill_from, teacher_cfg=args.teacher_cfg)


def run_video_classifier(args: argparse.Namespace, train: TrainConfig) -> None:
    print(json.dumps(train_video_classifier(args.run_dir, args.data_dir, train,
                                            VideoClassifierRecipe(num_clips=args.num_images,
                                                                  batch_size=args.batch_size),
                                            max_minutes=args.max_minutes)))


def add_drafter_args(t: argparse.ArgumentParser) -> None:
    add_tokenizer(t)
    add_init_from(t, "; e.g. the head of the model the target was fine-tuned from")
    t.add_argument("--target", default=str(RUNS / "shapes-ar" / "export"), help="trained AR model folder")
    t.add_argument("--codes-dir", default=str(RUNS / "shapes-ar"),
                   help="folder with the tokenised training split (the AR run's)")


def run_drafter(args: argparse.Namespace, train: TrainConfig) -> None:
    train_drafter(args.run_dir, args.target, args.tokenizer, args.data_dir, args.codes_dir, train,
                  DrafterRecipe(num_images=args.num_images, batch_size=args.batch_size), args.max_minutes,
                  init_from=args.init_from)


def run_classifier(args: argparse.Namespace, train: TrainConfig) -> None:
    print(json.dumps(train_classifier(args.run_dir, args.tokenizer, args.data_dir, train,
                                      ClassifierRecipe(num_images=args.num_images, batch_size=args.batch_size),
                                      args.max_minutes)))


SHAPES_VQ = "vgen/assets/shapes-c2i/vq"


def add_t2i_args(t: argparse.ArgumentParser) -> None:
    t.add_argument("--tokenizer", default=SHAPES_VQ, help="the frozen VQ tokenizer of the scenes")
    t.add_argument("--init-from", default="vgen/assets/shapes-c2i/gpt",
                   help="an AR model folder whose blocks, token table and output layer start the image model, "
                        "or a text model's export or pipeline folder (text_encoder/, gpt/) that starts both "
                        "('none': random init)")
    add_eval_every(t, 500, "steps between sample probes: token statistics of a few prompts (0 = off)")


def run_t2i(args: argparse.Namespace, train: TrainConfig) -> None:
    probe = prompt_probe(args.tokenizer, cfg_scale=T2I_CFG_SCALE) if args.eval_every else None
    recipe = T2IRecipe(num_images=args.num_images, batch_size=args.batch_size, eval_every=args.eval_every or 1)
    train_t2i(args.run_dir, args.tokenizer, args.data_dir, train, recipe,
              init_from=None if args.init_from == "none" else args.init_from, max_minutes=args.max_minutes,
              evaluate=probe, workers=os.cpu_count() or 2)


def add_scene_judge_args(t: argparse.ArgumentParser) -> None:
    t.add_argument("--tokenizer", default=SHAPES_VQ,
                   help="the VQ tokenizer whose reconstructions the judge also learns from")
    t.add_argument("--num-val", type=int, default=SceneJudgeRecipe.num_val,
                   help="held-out scenes the final accuracy is measured on")


def run_scene_judge(args: argparse.Namespace, train: TrainConfig) -> None:
    recipe = SceneJudgeRecipe(num_images=args.num_images, batch_size=args.batch_size, num_val=args.num_val)
    print(json.dumps(train_scene_judge(args.run_dir, args.tokenizer, args.data_dir, train, recipe,
                                       max_minutes=args.max_minutes, workers=os.cpu_count() or 2)))


def add_t2v_kl_args(t: argparse.ArgumentParser) -> None:
    t.add_argument("--tokenizer", default=str(CLASS_TEACHER / "kl"),
                   help="the KL tokenizer to fine-tune on moving-scene frames (--num-images counts clips, all "
                        "their frames used)")
    t.add_argument("--num-val", type=int, default=32,
                   help="validation clips on which the shipped scene judge reads shape, colour and background of "
                        "real and reconstructed frames, for the starting and the tuned tokenizer (printed)")


def run_t2v_kl(args: argparse.Namespace, train: TrainConfig) -> None:
    print(json.dumps(train_stream_kl(args.run_dir, args.tokenizer, args.data_dir, train, num_clips=args.num_images,
                                     batch_size=args.batch_size, max_minutes=args.max_minutes,
                                     workers=os.cpu_count() or 2, judge=load_scene_judge(), num_val=args.num_val)))


def add_t2v_stream_args(t: argparse.ArgumentParser) -> None:
    t.add_argument("--tokenizer", default=str(CLASS_TEACHER / "kl"),
                   help="the KL tokenizer whose latent frames of the moving scenes the model denoises (vgen train "
                        "t2v-kl's export)")
    t.add_argument("--init-from", default=str(CLASS_TEACHER),
                   help="a class block-diffusion model folder whose weights start the teacher (its caption in "
                        "place of the class), or a text model's export or pipeline folder (blockdiff/, "
                        "text_encoder/) that starts both parts")
    t.add_argument("--text-encoder-from", default=str(T2I_TEXT_ENCODER),
                   help="with a class --init-from: the word encoder whose words' rows start the text encoder (the "
                        "moving captions' other words are added)")
    t.add_argument("--distill-from", default=None,
                   help="a text block-diffusion teacher (vgen train t2v-stream's export or package): distil its "
                        "guided velocity at --teacher-cfg into a student started from it, its text encoder frozen")
    t.add_argument("--teacher-cfg", type=float, default=T2V_TEACHER_CFG, help="the teacher's CFG scale to distil")
    t.add_argument("--noise-shift", type=float, default=T2VRecipe.noise_shift,
                   help="warp the training noise levels by this shift (1: uniform)")
    t.add_argument("--lone-block-share", type=float, default=T2VRecipe.lone_block_share,
                   help="share of steps whose clips are cut into single blocks, each trained as a stream's first "
                        "block")
    t.add_argument("--rollout-share", type=float, default=None,
                   help=f"with --distill-from: share of steps on the student's own streams of training captions "
                        f"(default {T2VRecipe.rollout_share})")
    t.add_argument("--rollout-blocks", type=int, default=T2VRecipe.rollout_blocks,
                   help="the longest of those streams, in blocks")
    t.add_argument("--switch-share", type=float, default=None,
                   help=f"with --distill-from: share of those streams whose prompt switches at a random block, "
                        f"re-cached (default {T2VRecipe.switch_share})")
    t.add_argument("--caption-pool", choices=CAPTION_POOL_STARTS, default=T2VRecipe.caption_pool,
                   help="with a class --init-from: start the pooled caption's projection fitted to the class rows of "
                        "the captions' shapes, or as initialised")


def t2v_recipe(args: argparse.Namespace) -> T2VRecipe:
    """The recipe the flags ask for (it checks their ranges)."""
    student = {k: v for k, v in (("rollout_share", args.rollout_share), ("switch_share", args.switch_share))
               if v is not None}
    return T2VRecipe(num_clips=args.num_images, batch_size=args.batch_size, noise_shift=args.noise_shift,
                     lone_block_share=args.lone_block_share, rollout_blocks=args.rollout_blocks,
                     caption_pool=args.caption_pool, **student)


def check_t2v_stream(args: argparse.Namespace) -> None:
    for flag in ("rollout_share", "switch_share"):
        if getattr(args, flag) is not None and not args.distill_from:
            raise UsageError(f"--{flag.replace('_', '-')} trains a student on its own streams: give --distill-from")
    declarations(StreamConfig)["cfg_scale"].spec.check("--teacher-cfg", args.teacher_cfg, float)
    if args.distill_from and not args.teacher_cfg > 1:
        raise UsageError(f"--teacher-cfg must be > 1 to distil guidance, got {args.teacher_cfg}")
    try:
        t2v_recipe(args)
    except ValueError as e:
        raise UsageError(str(e)) from None


def run_t2v_stream(args: argparse.Namespace, train: TrainConfig) -> None:
    train_t2v_stream(args.run_dir, args.data_dir, train, t2v_recipe(args), args.tokenizer, args.init_from,
                     args.distill_from, args.teacher_cfg, args.text_encoder_from, max_minutes=args.max_minutes,
                     workers=os.cpu_count() or 2)


def no_arguments(t: argparse.ArgumentParser) -> None:
    """A recipe with only the flags every recipe takes."""


RECIPES: dict[str, TrainCommand] = {
    "tokenizer": TrainCommand(TOKENIZER_RUN, no_arguments, run_tokenizer),
    "frame-tokenizer": TrainCommand(FRAME_TOKENIZER_RUN, add_frame_tokenizer_args, run_frame_tokenizer),
    "ar": TrainCommand(AR_RUN, add_ar_args, run_ar),
    "classifier": TrainCommand(CLASSIFIER_RUN, add_tokenizer, run_classifier),
    "drafter": TrainCommand(DRAFTER_RUN, add_drafter_args, run_drafter),
    "kl": TrainCommand(KL_RUN, no_arguments, run_kl),
    "mar": TrainCommand(MAR_RUN, add_mar_args, run_mar, off_cpu=True, check=check_mar),
    "nbp": TrainCommand(NBP_RUN, add_nbp_args, run_nbp, off_cpu=True),
    "nar": TrainCommand(NAR_RUN, add_nar_args, run_nar, off_cpu=True, check=check_nar),
    "blockdiff": TrainCommand(BLOCKDIFF_RUN, add_blockdiff_args, run_blockdiff, off_cpu=True, check=check_blockdiff),
    "video-classifier": TrainCommand(VIDEO_CLASSIFIER_RUN, no_arguments, run_video_classifier),
    "t2i": TrainCommand(T2I_RUN, add_t2i_args, run_t2i, off_cpu=True),
    "scene-judge": TrainCommand(SCENE_JUDGE_RUN, add_scene_judge_args, run_scene_judge, off_cpu=True),
    "t2v-kl": TrainCommand(STREAM_KL_RUN, add_t2v_kl_args, run_t2v_kl, off_cpu=True),
    "t2v-stream": TrainCommand(T2V_RUN, add_t2v_stream_args, run_t2v_stream, off_cpu=True, check=check_t2v_stream),
}


def off_cpu_recipes() -> str:
    """The recipes that train on a GPU, as ``--device``'s help and refusal name them."""
    return ", ".join([*(what for what, recipe in RECIPES.items() if recipe.off_cpu), "ar --video"])


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train the embedded default models (resumable)")
    tsub = p.add_subparsers(dest="what", required=True)
    for what, recipe in RECIPES.items():
        d = recipe.defaults
        t = tsub.add_parser(what, help=f"train the shapes {what}")
        t.add_argument("--run-dir", default=str(RUNS / f"shapes-{what}"), help="checkpoints and logs (resumes)")
        t.add_argument("--data-dir", default=str(RUNS / "data"), help="rendered data cache")
        t.add_argument("--background", choices=BACKGROUND_KINDS, default=None,
                       help="render the data folder with this background (recorded in it; default: what the "
                            "folder records, else textured)")
        recipe.add_arguments(t)
        t.add_argument("--steps", type=int, default=d.steps, help="optimizer steps in all")
        t.add_argument("--lr", type=float, default=d.lr, help="peak learning rate")
        t.add_argument("--batch-size", type=int, default=d.batch_size, help="training examples per step")
        t.add_argument("--warmup-steps", type=int, default=d.warmup_steps, help="steps of linear learning-rate warmup")
        t.add_argument("--num-images", type=int, default=d.num_items,
                       help="training images (clips for frame-tokenizer, nbp, nar --video, blockdiff and "
                            "video-classifier; captioned scenes for t2i and scene-judge; moving scenes for t2v-kl and "
                            "t2v-stream)")
        t.add_argument("--max-minutes", type=float, default=None, help="stop (and checkpoint) after this long")
        t.add_argument("--device", type=device_name, default="cpu",
                       help=f"where the model trains (cuda for a GPU; the recipes {off_cpu_recipes()})")
        t.add_argument("--precision", choices=("auto", "bf16", "fp32"), default=d.precision,
                       help="bf16 autocast or plain fp32 for the forward passes (auto: bf16 where the CPU has "
                            "native bf16 matmuls, AMX or AVX512-BF16, else fp32)")
        t.add_argument("--seed", type=int, default=0, help="random seed of the initialisation and the batches")
        t.add_argument("--checkpoint-every-steps", type=int, default=TrainConfig.checkpoint_every_steps,
                       help="checkpoint at every multiple of this step (0: off)")
        t.add_argument("--checkpoint-every-minutes", type=float, default=TrainConfig.checkpoint_every_minutes,
                       help="checkpoint when this long has passed since the last checkpoint (0: off)")
        t.add_argument("--log-every", type=int, default=TrainConfig.log_every,
                       help="steps between log records (mean loss, time); a run's speed is read from them")
        t.add_argument("--override-config", action="store_true",
                       help="resume a run whose checkpoint records other settings (learning rate, batch size, "
                            "steps, model, data...), going on with these; without it such a resume is refused")
        t.set_defaults(func=run_train)
    add_package_parser(tsub)


def check_run_flags(args: argparse.Namespace) -> None:
    """Refuse the counts and limits every recipe takes when out of range (the optimiser's settings are checked by
    :class:`TrainConfig`)."""
    for flag, value in (("--num-images", args.num_images), ("--batch-size", args.batch_size),
                        ("--num-val", getattr(args, "num_val", 1))):
        if value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    if args.max_minutes is not None and not 0 < args.max_minutes < math.inf:
        raise UsageError(f"--max-minutes must be a finite number > 0, got {args.max_minutes}")
    for flag in ("eval_every", "first_frames", "hybrid_blocks"):
        if getattr(args, flag, None) is not None and getattr(args, flag) < 0:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 0, got {getattr(args, flag)}")


def run_train(args: argparse.Namespace) -> None:
    recipe = RECIPES[args.what]
    check_run_flags(args)
    if args.device != "cpu" and not (recipe.off_cpu or getattr(args, "video", False)):
        raise UsageError(f"--device {args.device}: only the recipes {off_cpu_recipes()} train off the CPU; train "
                         f"{args.what} on the CPU")
    if recipe.check is not None:
        recipe.check(args)
    settings = dict(steps=args.steps, lr=args.lr, warmup_steps=args.warmup_steps, seed=args.seed,
                    bf16=use_bf16(args.precision), device=args.device,
                    checkpoint_every_steps=args.checkpoint_every_steps,
                    checkpoint_every_minutes=args.checkpoint_every_minutes, log_every=args.log_every,
                    override_config=args.override_config)
    train = recipe.defaults.train_config(**settings)
    if args.background:
        set_data_config(args.data_dir, ShapesConfig(background=args.background))
    recipe.run(args, train)
    print(f"exported to {Path(args.run_dir) / 'export'}")


# -- vgen train package --------------------------------------------------------------------------------------


def add_package_parser(tsub: argparse._SubParsersAction) -> None:
    t = tsub.add_parser("package", help="assemble trained models into a pipeline folder (e.g. vgen/assets/...)")
    t.add_argument("--gpt", required=True, help="trained AR model folder (the run's export/), or a block-diffusion "
                                                "model folder for a streaming pipeline")
    t.add_argument("--vq", default=None, help="trained tokenizer folder (VQ, or KL for a continuous model or a "
                                              "latent block-diffusion model; a pixel block-diffusion model has "
                                              "none)")
    t.add_argument("--drafter", default=None,
                   help="trained draft head folder, or draft model folder for a continuous model (optional)")
    t.add_argument("--text-encoder", default=None,
                   help="a text-to-image model's own text encoder folder (vgen train t2i's export/text_encoder), "
                        "or a prompt-conditioned streaming model's (vgen train t2v-stream's export/text_encoder)")
    t.add_argument("--data-dir", default=None, help="the data folder the models were trained on (its rendering "
                                                     "config is recorded in the pipeline)")
    t.add_argument("--out", required=True, help="pipeline folder to write")
    add_overwrite_flag(t)
    t.add_argument("--name", default="shapes-c2i", help="the pipeline's name, recorded in its pipeline.json")
    recommended = t.add_argument_group(f"recommended sampling settings of a token model, stored as the pipeline's "
                                       f"defaults (unset = the sampler's own; --cfg-scale: {AR_CFG_SCALE})")
    add_option_flags(recommended, sampling_options())
    t.set_defaults(cfg_scale=AR_CFG_SCALE)
    t.add_argument("--dtype", default="fp32", help="storage dtype of the weights (bf16 halves the size; they load "
                                                   "into fp32 models)")
    t.add_argument("--stream-defaults", default=None, metavar="JSON",
                   help="a block-diffusion pipeline's recommended stream settings, e.g. '{\"steps\": 4}'")
    t.set_defaults(func=run_package)


def recorded_token_settings(args: argparse.Namespace) -> dict:
    """The token-sampling defaults given to ``vgen train package`` (the CFG scale aside)."""
    return {k: v for k, v in set_options(args, sampling_options()).items() if k != "cfg_scale"}


def run_package(args: argparse.Namespace) -> None:
    check_files_in(args.out, [PIPELINE_CONFIG], args.overwrite)
    dtype = torch_dtype(args.dtype)
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
    text_encoder = from_pretrained(args.text_encoder) if args.text_encoder else None
    if text_encoder is not None and not getattr(gpt, "text_conditional", False):
        raise UsageError(f"--text-encoder is for a text-to-image model; {args.gpt} is class-conditional")
    data = asdict(data_config(args.data_dir)) if args.data_dir and text_encoder is None else None
    info = PipelineInfo(name=args.name, image_size=gpt.grid[-1] * vq.downsample_factor,
                        class_names=None if text_encoder else list(CLASS_NAMES), defaults=defaults, data=data,
                        example_prompts=list(EXAMPLE_PROMPTS) if text_encoder else None)
    if len(gpt.grid) == 3:  # a video backbone: frames x rows x columns
        # the clips the model learnt from (the motion check of vgen quality renders real ones like them)
        info.data = asdict(recorded_clips_config(args.data_dir)) if args.data_dir else None
        pipe = VideoPipeline(gpt, vq, info, head)
    else:
        # the parts must fit together before anything is written
        pipe = ImagePipeline(gpt, vq, info, head, text_encoder=text_encoder)
    pipe.save_pretrained(args.out, dtype=dtype)
    print(f"wrote pipeline {args.name} to {Path(args.out)}")


def stream_text_encoder(args: argparse.Namespace, model) -> WordTextEncoder | None:
    """A text streaming model's ``--text-encoder`` (a word encoder; required), or None for a class model (which
    takes none)."""
    if not model.is_text:
        if args.text_encoder:
            raise UsageError(f"--text-encoder is for a prompt-conditioned model; {args.gpt} is class-conditional")
        return None
    if not args.text_encoder:
        raise UsageError(f"{args.gpt} is prompt-conditioned: give its --text-encoder (vgen train t2v-stream's "
                         f"export/text_encoder)")
    encoder = from_pretrained(args.text_encoder)
    if not isinstance(encoder, WordTextEncoder):
        raise UsageError(f"--text-encoder {args.text_encoder} holds a {type(encoder).__name__}, not a word text "
                         f"encoder")
    return encoder


def package_stream(args: argparse.Namespace, model) -> None:
    """Write a streaming pipeline folder: ``blockdiff/`` (and ``kl/`` for a latent model, ``text_encoder/`` for a
    prompt-conditioned one) + ``pipeline.json`` with the recommended settings."""
    if args.drafter:
        raise UsageError("a block-diffusion pipeline takes no --drafter")
    token = recorded_token_settings(args)
    if token:
        flags = ", ".join("--" + name.replace("_", "-") for name in token)
        raise UsageError(f"{flags} are token-sampling defaults; a block-diffusion pipeline takes its settings as "
                         f"--stream-defaults")
    tokenizer = None
    if args.vq:  # a model of latent frames: its KL tokenizer decodes them
        tokenizer = from_pretrained(args.vq)
        if not isinstance(tokenizer, KLTokenizer):
            raise UsageError(f"--vq {args.vq} holds a {type(tokenizer).__name__}; a block-diffusion pipeline takes "
                             f"the KL tokenizer of a latent model, or none for a pixel model")
    try:
        defaults = json.loads(args.stream_defaults) if args.stream_defaults else {}
    except json.JSONDecodeError as e:
        raise UsageError(f"--stream-defaults is not valid JSON: {e}") from None
    size = model.config.frame_size if tokenizer is None else tokenizer.config.image_size
    text_encoder = stream_text_encoder(args, model)
    if text_encoder is not None:  # moving captioned scenes, which have one rendering
        info = PipelineInfo(name=args.name, image_size=size, defaults=defaults,
                            example_prompts=[prompt for prompt, _ in evaluation_prompts(4, "val")])
    else:  # the clips the model learnt from (benchmarks/streaming.py renders real clips like them)
        data = asdict(recorded_clips_config(args.data_dir)) if args.data_dir else None
        info = PipelineInfo(name=args.name, image_size=size, class_names=list(CLASS_NAMES), defaults=defaults,
                            data=data)
    try:
        pipe = StreamPipeline(model, info, tokenizer, text_encoder)
    except ValueError as e:
        raise UsageError(f"--text-encoder {args.text_encoder} does not fit {args.gpt}: {e}") from None
    pipe.stream_config().policy(model.frames_per_block, model.config.train_frames)  # the defaults must fit
    pipe.save_pretrained(args.out, dtype=torch_dtype(args.dtype))
    print(f"wrote streaming pipeline {args.name} to {args.out}")
