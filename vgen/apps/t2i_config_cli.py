"""``vgen t2i-config FOLDER``: describe LlamaGen's released text-to-image files (GPT and VQ checkpoints, the
FLAN-T5-XL folder) in ``FOLDER/llamagen_t2i.json``, with the architecture and recommended sampling settings, so
that ``vgen sample --model FOLDER`` and ``vgen.load(FOLDER)`` load them."""

from __future__ import annotations

import argparse

from vgen.apps.options import (
    UsageError,
    add_llamagen_args,
    add_option_flags,
    add_overwrite_flag,
    check_files_in,
    sampling_options,
    set_options,
)
from vgen.pipelines import LLAMAGEN_T2I_CONFIG, LLAMAGEN_T2I_DEFAULTS, write_llamagen_t2i_config
from vgen.samplers.options import merge_settings


def add_t2i_config_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("t2i-config", help=f"write a LlamaGen-T2I folder's {LLAMAGEN_T2I_CONFIG}, loaded by "
                                          f"--model FOLDER",
                       description=f"Write FOLDER/{LLAMAGEN_T2I_CONFIG}, naming LlamaGen's text-to-image GPT and "
                                   f"VQ checkpoints and a FLAN-T5-XL folder, so that `vgen sample --model FOLDER` "
                                   f"and vgen.load(FOLDER) load them.")
    p.add_argument("folder", help=f"the folder to write {LLAMAGEN_T2I_CONFIG} into (made if missing); files inside "
                                  f"it are recorded relative to it, others by their absolute path")
    add_overwrite_flag(p)
    add_llamagen_args(p.add_argument_group("LlamaGen text-to-image files and architecture"))
    recommended = p.add_argument_group(f"recommended sampling settings, stored as the folder's defaults (unset = "
                                       f"LlamaGen's sample_t2i.py: {LLAMAGEN_T2I_DEFAULTS})")
    add_option_flags(recommended, sampling_options())
    p.set_defaults(func=run_t2i_config)


def run_t2i_config(args: argparse.Namespace) -> None:
    if not (args.gpt_ckpt and args.vq_ckpt):
        raise UsageError("vgen t2i-config needs --gpt-ckpt and --vq-ckpt")
    check_files_in(args.folder, [LLAMAGEN_T2I_CONFIG], args.overwrite)
    defaults = merge_settings(LLAMAGEN_T2I_DEFAULTS, set_options(args, sampling_options()))
    folder = write_llamagen_t2i_config(args.folder, args.gpt_ckpt, args.vq_ckpt, args.t5_path, args.image_size,
                                       args.gpt_model or "GPT-XL", args.vq_model, args.codebook_size,
                                       args.codebook_embed_dim, defaults=defaults)
    print(f"wrote {folder / LLAMAGEN_T2I_CONFIG}; sample with: vgen sample --model {folder} --prompt ...")
