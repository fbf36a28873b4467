"""The ``vgen`` command: a thin dispatcher over the subcommand modules (each builds its parser and runs it) and
the pipeline API.

Every user error (unknown model or sampler, out-of-range parameters or class ids, missing / corrupt / mismatched
checkpoints, unwritable outputs, a flag argparse cannot read) ends with one ``vgen: error: ...`` line and exit status
2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from collections.abc import Iterator

from vgen.apps.bench_cli import add_bench_parser
from vgen.apps.data_cli import add_data_parser
from vgen.apps.eval_cli import add_eval_parser
from vgen.apps.models_cli import add_models_parser, add_samplers_parser
from vgen.apps.options import Parser, UsageError, add_threads_flag, one_line
from vgen.apps.quality_cli import add_quality_parser
from vgen.apps.sample_cli import add_sample_parser
from vgen.apps.sample_many_cli import add_sample_many_parser
from vgen.apps.stream_cli import add_stream_parser
from vgen.apps.t2i_config_cli import add_t2i_config_parser
from vgen.apps.train_cli import add_train_parser
from vgen.hub import PIPELINE_CONFIG, CheckpointError
from vgen.pipelines import DEFAULT_TEXT_MODEL, LLAMAGEN_T2I_CONFIG
from vgen.pipelines.load import RELEASED_FOLDERS, is_model_folder
from vgen.threads import threads_for


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="vgen", description="Visual autoregressive generation with fast samplers.")
    sub = parser.add_subparsers(dest="command")
    add_sample_parser(sub)
    add_train_parser(sub)
    add_quality_parser(sub)
    add_app_parser(sub)
    add_eval_parser(sub)
    add_sample_many_parser(sub)
    add_bench_parser(sub)
    add_stream_parser(sub)
    add_t2i_config_parser(sub)
    add_models_parser(sub)
    add_samplers_parser(sub)
    add_data_parser(sub)
    add_threads_flag(parser)
    return parser


def add_app_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("app", help="the Gradio web demo (needs the app extra: pip install -e '.[app]')")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to serve on: 127.0.0.1 is this machine only, 0.0.0.0 every network interface")
    p.add_argument("--port", type=int, default=7860, help="port to serve on")
    p.add_argument("--share", action=argparse.BooleanOptionalAction, default=False,
                   help="a public gradio.live link that anyone who has it can use")
    p.add_argument("--max-concurrency", type=int, default=2,
                   help="generations, streams and model loads that run at once, over all visitors")
    p.add_argument("--model", default=DEFAULT_TEXT_MODEL, help="the model selected when the page opens")
    p.add_argument("--model-dir", action="append", default=[], metavar="DIR",
                   help="a model folder to offer besides the embedded models (repeat for more): a pipeline "
                        "folder, a LlamaGen-T2I folder, or a released Janus-Pro, Emu3 or Lumina-mGPT folder")
    p.add_argument("--allow-local-models", action="store_true",
                   help="let visitors load any server folder or LlamaGen checkpoint by its path")
    p.set_defaults(func=run_app)


def run_app(args: argparse.Namespace) -> None:
    if args.max_concurrency < 1:
        raise UsageError(f"--max-concurrency must be >= 1, got {args.max_concurrency}")
    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port must be a TCP port in [1, 65535], got {args.port}")
    for folder in args.model_dir:
        if not is_model_folder(folder):
            raise UsageError(f"--model-dir {folder} is not a model folder vgen.load reads: a pipeline folder (with "
                             f"{PIPELINE_CONFIG}), a LlamaGen-T2I folder (with {LLAMAGEN_T2I_CONFIG}) or a released "
                             f"{', '.join(RELEASED_FOLDERS)} folder")
    try:
        import gradio  # noqa: F401
    except ImportError:
        raise UsageError("the web demo needs gradio: pip install -e '.[app]'") from None
    from vgen.apps.gradio_app import ModelAccess, build_app, serve

    access = ModelAccess(tuple(args.model_dir), args.allow_local_models)
    if args.model not in access.models() and not access.local_paths:
        raise UsageError(f"--model {args.model} is neither embedded nor a --model-dir (or pass --allow-local-models)")
    serve(build_app(args.model, args.max_concurrency, access), args.host, args.port, args.share)


@contextlib.contextmanager
def vgen_warnings() -> Iterator[None]:
    """vgen's own warnings (an unknown prompt word, a cut prompt) printed as one ``vgen: warning: ...`` line on
    stderr while the block runs, instead of Python's file, line number and source line; others as Python shows
    them."""
    python_way = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if category.__module__.split(".")[0] != "vgen":
            return python_way(message, category, filename, lineno, file, line)
        print(f"vgen: warning: {one_line(str(message))}", file=sys.stderr)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = python_way


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv or ["sample"])
    try:
        with vgen_warnings(), threads_for(args.threads):
            args.func(args)
    except (UsageError, CheckpointError, ValueError) as e:
        print(f"vgen: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    except OSError as e:
        text = f"{e.strerror or e}: {e.filename or ''}".rstrip(": ")
        print(f"vgen: error: {one_line(text)}", file=sys.stderr)
        return 2
    except ImportError as e:  # an optional dependency (the t2i extra's transformers) that is not installed
        print(f"vgen: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("vgen: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
