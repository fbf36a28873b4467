"""``vgen data render``: the procedural sets the embedded models were trained on, written as files that ``vgen eval``
and ``vgen sample --context`` read (:func:`vgen.data.render.write_set`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vgen.apps.options import UsageError, check_count, plural
from vgen.data.render import CAPTIONS_FILE, CLIP_FORMATS, KINDS, SPLITS, write_set
from vgen.hub import PIPELINE_CONFIG
from vgen.pipelines import DEFAULT_MODEL, pipeline_folder

DATA_MODELS = {"images": DEFAULT_MODEL, "clips": "shapes-video-nbp"}
"""The embedded model whose recorded rendering (its ``pipeline.json``'s ``data``) each kind of set uses unless
``--model`` names another."""


def add_data_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="write the procedural data sets (images, clips, captioned scenes, moving "
                                    "ones) as files")
    dsub = p.add_subparsers(dest="what", required=True)
    r = dsub.add_parser("render", help="write the first N items of a procedural set into a folder",
                        description="The images, clips or captioned scenes the embedded models were trained on, "
                                    "rendered as their training caches hold them: PNGs named <index>_<class>, "
                                    f"clips as mp4 or GIF, scenes as PNGs beside {CAPTIONS_FILE} (one caption a "
                                    "line, in file order), moving scenes as mp4 or GIF beside theirs.")
    r.add_argument("--kind", choices=KINDS, required=True, help="which set")
    r.add_argument("--num", type=int, required=True, help="how many items")
    r.add_argument("--out", required=True, help="the folder to write (new or empty)")
    r.add_argument("--split", choices=SPLITS, default="val", help="which split (each has its own seed)")
    r.add_argument("--seed", type=int, default=None, help="a seed of your own instead of the split's")
    r.add_argument("--model", default=None,
                   help="an embedded model or pipeline folder whose recorded rendering to use (default: "
                        f"{DATA_MODELS['images']} for images, {DATA_MODELS['clips']} for clips; scenes and "
                        "moving scenes have one)")
    r.add_argument("--format", choices=[f[1:] for f in CLIP_FORMATS], default="mp4",
                   help="the clips' (and moving scenes') file type")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.set_defaults(func=run_data_render)


def recorded_rendering(kind: str, model: str | None) -> dict | None:
    """The rendering config a pipeline folder records for ``kind`` (``--model``, else :data:`DATA_MODELS`)."""
    if kind not in DATA_MODELS:
        if model is not None:
            raise UsageError(f"--model applies to images and clips: {kind} have one rendering")
        return None
    folder = pipeline_folder(model or DATA_MODELS[kind])
    data = json.loads((folder / PIPELINE_CONFIG).read_text()).get("data")
    if data is None:
        raise UsageError(f"--model {model} records no rendering of its training data")
    if ("num_frames" in data) != (kind == "clips"):
        what = "clips" if "num_frames" in data else "images"
        raise UsageError(f"--model {model} was trained on {what}, not {kind}")
    return data


def run_data_render(args: argparse.Namespace) -> None:
    check_count("--num", args.num)
    if args.seed is not None and args.seed < 0:
        raise UsageError(f"--seed must be >= 0, got {args.seed}")
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out} is {'not a folder' if not out.is_dir() else 'not empty'}: give a new folder")
    data = recorded_rendering(args.kind, args.model)
    paths = write_set(args.kind, args.num, out, split=args.split, seed=args.seed, data=data,
                      clip_format=f".{args.format}", progress=not args.no_progress)
    seed = f"seed {args.seed}" if args.seed is not None else f"the {args.split} split"
    print(f"wrote {plural(len(paths), args.kind[:-1])} of {seed} to {out}")
