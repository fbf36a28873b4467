"""What the ``vgen`` subcommands share: the parser class whose help shows every option's default, the model, device
and sampling arguments (the sampling and sampler flags built from the options' declarations,
:mod:`vgen.samplers.options`), class ids or names, loading the pipeline they name, and the usage errors that end in
one ``vgen: error: ...`` line."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NoReturn

import torch

from vgen import pipelines
from vgen.models.llamagen import LLAMAGEN_T2I_CHECKPOINTS
from vgen.pipelines import StreamPipeline
from vgen.pipelines.inputs import MAX_SAMPLES, check_device
from vgen.samplers import SamplingParams, available_samplers, get_sampler, samplers_taking
from vgen.samplers.options import DeclaredOption, declarations, declared_options, merge_settings
from vgen.samplers.streaming import StreamConfig

DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
          "fp16": "float16", "float16": "float16"}
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}
MAX_MESSAGE = 1000  # characters of an error line; a longer one is cut
MAX_QUOTED = 60  # characters of a value argparse quotes in its message; a longer one is cut
RUNS = Path(os.environ.get("VGEN_RUNS", Path.home() / ".cache" / "vgen" / "runs"))


class UsageError(Exception):
    """A problem with the command line itself, reported without a traceback."""


def one_line(text: str) -> str:
    """A message as one line of at most :data:`MAX_MESSAGE` characters: line breaks shown as ``\\n``, a longer
    message cut (a message never echoes a long input whole)."""
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= MAX_MESSAGE else f"{text[:MAX_MESSAGE]}... ({len(text)} characters)"


def shows_default(action: argparse.Action) -> bool:
    """Whether ``--help`` states the default of ``action``: an option with a default that says something (not
    None, False or empty) whose help does not state it already."""
    default = action.default
    unset = default is None or default is False or default is argparse.SUPPRESS or default == []
    return bool(action.option_strings) and not unset and "default" not in (action.help or "")


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help with each option's default appended where :func:`shows_default` says so."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        return f"{text} (default: %(default)s)" if shows_default(action) else text


class Parser(argparse.ArgumentParser):
    """The ``vgen`` parser: its subcommands' parsers are of this class too (argparse makes them of the parent's
    class), so every ``--help`` shows the defaults (:class:`HelpFormatter`) and every mistake argparse finds ends
    as the others do (:meth:`error`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: list[str] | None = None, namespace: argparse.Namespace | None = None):
        """argparse's, but ``--flag=--`` is refused (argparse would give the flag an empty list)."""
        for word in args or []:
            if word.startswith("-") and word.endswith("=--"):
                self.error(f"argument {word[:-3]}: expected one argument")
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        """One ``vgen: error: ...`` line that points at ``--help`` (instead of the usage, which runs to dozens of
        lines), a long quoted value cut, and exit status 2."""
        def cut(match: re.Match) -> str:
            quoted = match.group()
            return f"{quoted[:MAX_QUOTED]}... ({len(quoted) - 2} characters)"

        message = re.sub(rf"'[^']{{{MAX_QUOTED},}}'|\"[^\"]{{{MAX_QUOTED},}}\"", cut, message)
        self.exit(2, f"vgen: error: {one_line(message)} (see: {self.prog} --help)\n")


def plural(count: int, word: str, words: str | None = None) -> str:
    """``1 image``, ``2 images``: a count and its noun (``words``: the plural, when it is not ``word`` + s)."""
    return f"{count} {word if count == 1 else words or word + 's'}"


def class_label(text: str) -> int | str:
    """A ``--class-id`` value: an integer is a class id, any other text a class name (checked by the pipeline)."""
    try:
        return int(text)
    except ValueError:
        return text.strip()


def check_count(flag: str, value: int, at_least: int = 1) -> None:
    """Refuse a count of samples (images, clips, frames) outside [``at_least``, :data:`MAX_SAMPLES`]."""
    if not at_least <= value <= MAX_SAMPLES:
        raise UsageError(f"{flag} must be in [{at_least}, {MAX_SAMPLES}], got {value}")


def check_suffix(path: str, suffixes: set[str]) -> None:
    """Fail unless ``path`` names a file of one of the types ``suffixes`` (lower case, with the dot)."""
    p = Path(path)
    if p.suffix.lower() not in suffixes:
        raise UsageError(f"cannot write {path}: unsupported file type {p.suffix or '(none)'}; "
                         f"use one of {sorted(suffixes)}")


def check_writable(path: str | None, suffixes: set[str] | None = None) -> None:
    """Fail before any work if ``path`` cannot be written (so that nothing computed is lost)."""
    if path is None:
        return
    p = Path(path)
    if suffixes is not None:
        check_suffix(path, suffixes)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise UsageError(f"cannot write {path}: it is a directory")
    if not parent.is_dir():
        raise UsageError(f"cannot write {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UsageError(f"cannot write {path}: permission denied")


def device_name(text: str) -> str:
    """A ``--device`` value: a device torch knows and this machine has (:func:`~vgen.pipelines.inputs.check_device`),
    refused by argparse otherwise."""
    try:
        check_device(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def torch_dtype(name: str) -> torch.dtype:
    """``--dtype``'s value (fp32, bf16, fp16 or the torch names) as a torch dtype."""
    if name not in DTYPES:
        raise UsageError(f"unknown dtype {name!r}; expected one of {sorted(DTYPES)}")
    return getattr(torch, DTYPES[name])


# -- flags built from declared options ------------------------------------------------------------------------


def add_option_flags(group: argparse._ArgumentGroup, options: Iterable[DeclaredOption],
                     defaults: Mapping[str, str] | None = None) -> None:
    """One flag per declared option (``--kebab-name``, its type and help), unset (None) by default; ``defaults``
    says, by option name, what an unset one stands for, which the help shows. Values are checked where the config
    is built, so a bad one gets the config's own message."""
    for o in options:
        text = o.spec.describe((defaults or {}).get(o.name))
        if o.kind is bool or bool in getattr(o.kind, "__args__", ()):
            group.add_argument(o.flag, dest=o.name, action="store_const", const=True, default=None, help=text)
        else:
            group.add_argument(o.flag, dest=o.name, type=o.kind, default=None, help=text)


def recommended_defaults(options: Iterable[DeclaredOption]) -> dict[str, str]:
    """What unset settings stand for: the model's recommended value (``vgen models`` lists them), else the
    declared default."""
    return {o.name: f"the model's recommended value, else {o.default}" for o in options}


def sampling_options() -> list[DeclaredOption]:
    """The settings every sampler shares (:class:`~vgen.samplers.SamplingParams`)."""
    return declared_options([SamplingParams])


def sampler_classes() -> list[type]:
    """The registered sampler classes, by name."""
    return [type(get_sampler(name)) for name in available_samplers()]


def sampler_option_groups() -> dict[tuple[str, ...], list[DeclaredOption]]:
    """The options of every registered sampler, grouped by the samplers that take them."""
    groups: dict[tuple[str, ...], list[DeclaredOption]] = {}
    for o in declared_options(sampler_classes()):
        groups.setdefault(tuple(samplers_taking(o.name)), []).append(o)
    return groups


def sampler_defaults() -> dict[str, str]:
    """Each sampler option's own default as text, by the samplers that have it where they differ (a preset such as
    ``lantern`` changes its rule's default); none for a switch."""
    texts = {}
    for o in declared_options(sampler_classes()):
        if o.kind is bool or bool in getattr(o.kind, "__args__", ()):
            continue
        by_default: dict[str, list[str]] = {}
        for cls in sampler_classes():
            if o.name in declarations(cls):
                by_default.setdefault(str(declarations(cls)[o.name].default), []).append(cls.name)
        texts[o.name] = next(iter(by_default)) if len(by_default) == 1 else ", ".join(
            f"{value} for {' and '.join(names)}" for value, names in by_default.items())
    return texts


def add_model_args(p: argparse.ArgumentParser) -> None:
    """--model, or LlamaGen checkpoints and their architecture (read by :func:`load_pipeline`)."""
    src = p.add_argument_group("model (an embedded default / pipeline folder, or LlamaGen checkpoints)")
    src.add_argument("--model", default=None,
                     help="embedded model name, pipeline folder, LlamaGen-T2I folder (`vgen t2i-config`) or Janus "
                          "folder (default: shapes-c2i; shapes-t2i when prompts are given)")
    add_llamagen_args(src)
    src.add_argument("--num-classes", type=int, default=1000, help="classes of --gpt-ckpt (ImageNet: 1000)")


def add_llamagen_args(group: argparse._ArgumentGroup) -> None:
    """LlamaGen's checkpoint files, the T5 folder of a text-to-image one, and their architecture."""
    group.add_argument("--gpt-ckpt", help="LlamaGen GPT checkpoint (.pt)")
    group.add_argument("--vq-ckpt", help="LlamaGen VQ checkpoint (.pt)")
    group.add_argument("--gpt-model", default=None,
                       help="LlamaGen size of --gpt-ckpt (GPT-B ... GPT-3B; default: GPT-B, GPT-XL for text-to-image)")
    group.add_argument("--vq-model", default="VQ-16", help="LlamaGen VQ of --vq-ckpt (VQ-16 or VQ-8)")
    group.add_argument("--image-size", type=int, default=None,
                       help="image size of --gpt-ckpt (256, 384, 512; default: 256, or a text-to-image release's "
                            "own)")
    group.add_argument("--t5-path", default=None,
                       help="local FLAN-T5-XL folder: --gpt-ckpt is then a LlamaGen text-to-image checkpoint "
                            "(t2i_XL_stage1_256.pt, t2i_XL_stage2_512.pt) that takes --prompt")
    group.add_argument("--codebook-size", type=int, default=16384, help="codebook entries of --vq-ckpt")
    group.add_argument("--codebook-embed-dim", type=int, default=8, help="codebook vector size of --vq-ckpt")


def add_sampling_args(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The settings every sampler shares, unset = the model's recommended value; read by
    :func:`sampling_overrides`."""
    gen = p.add_argument_group("generation (unset = the model's recommended value; `vgen models` lists them)")
    add_option_flags(gen, sampling_options(), recommended_defaults(sampling_options()))
    return gen


def add_sampler_args(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """--sampler and every registered sampler's options (read by :func:`sampler_options`) on top of
    :func:`add_sampling_args`."""
    gen = add_sampling_args(p)
    gen.add_argument("--sampler", default=None,
                     help="sampler name (see `vgen samplers`; default: the model's plain sampler: ar, or "
                          "continuous-ar, nar, nbp for those models)")
    defaults = sampler_defaults()
    for takers, options in sampler_option_groups().items():
        add_option_flags(p.add_argument_group(f"options of {', '.join(takers)} (unset = the sampler's own value)"),
                         options, defaults)
    return gen


def add_device_args(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--device", type=device_name, default="cpu",
                       help="where the model runs: cpu, cuda, cuda:1, mps ...")
    group.add_argument("--dtype", default="fp32", help="backbone dtype: fp32, bf16 or fp16")
    group.add_argument("--no-progress", action="store_true", help="no progress bar")


def set_options(args: argparse.Namespace, options: Iterable[DeclaredOption]) -> dict[str, Any]:
    """The ``options`` set on the command line, by field name."""
    return {o.name: getattr(args, o.name) for o in options if getattr(args, o.name, None) is not None}


def sampler_options(args: argparse.Namespace) -> dict[str, Any]:
    """The sampler fields set on the command line (:func:`add_sampler_args`)."""
    return set_options(args, declared_options(sampler_classes()))


def sampling_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The shared sampling settings set on the command line (:func:`add_sampling_args`)."""
    return set_options(args, sampling_options())


def stream_settings() -> list[DeclaredOption]:
    """A stream's schedule and context settings (:class:`~vgen.samplers.streaming.StreamConfig`)."""
    return declared_options([StreamConfig])


def stream_flags() -> list[DeclaredOption]:
    """The stream settings a command that also samples token models adds as its own flags: all but the guidance,
    which is the shared ``--cfg-scale``."""
    return [o for o in stream_settings() if o.name != "cfg_scale"]


def add_stream_args(parser: argparse.ArgumentParser) -> None:
    """A streaming model's schedule and context flags (:func:`stream_flags`)."""
    group = parser.add_argument_group("streaming models: schedule and context (unset = the model's recommended "
                                      "value; --cfg-scale is the guidance)")
    add_option_flags(group, stream_flags(), recommended_defaults(stream_flags()))


def refuse_stream_args(args: argparse.Namespace, model: str) -> None:
    """A token model's command refuses the stream flags (:func:`add_stream_args`) that were set."""
    flags = [o.flag for o in stream_flags() if getattr(args, o.name, None) is not None]
    if flags:
        verb = "sets" if len(flags) == 1 else "set"
        raise UsageError(f"{', '.join(flags)} {verb} a stream's schedule or context; {model} samples tokens")


def stream_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """A streaming model's settings from a token command's flags: the stream flags set (:func:`add_stream_args`)
    and ``--cfg-scale`` as the stream's guidance scale (unset: the pipeline's defaults); the other sampling and
    sampler flags sample tokens and are refused."""
    token = sorted((set(sampling_overrides(args)) - {"cfg_scale"}) | set(sampler_options(args)))
    flags = ["--" + name.replace("_", "-") for name in token]
    flags += ["--sampler"] if getattr(args, "sampler", None) else []
    if flags:
        raise UsageError(f"{', '.join(flags)} sample tokens; a streaming model denoises frames (its guidance is "
                         f"--cfg-scale)")
    return set_options(args, stream_settings())


def sampling_params(pipe: pipelines.ImagePipeline, args: argparse.Namespace) -> SamplingParams:
    """The pipeline's recommended sampling settings with those set on the command line laid over them."""
    return SamplingParams(**merge_settings(pipe.info.defaults, sampling_overrides(args)))


def load_pipeline(args: argparse.Namespace, streaming: bool = False):
    """The pipeline the command line names; a streaming (block-diffusion) model only where ``streaming``."""
    dtype = torch_dtype(args.dtype)
    if getattr(args, "gpt_ckpt", None) or getattr(args, "vq_ckpt", None):
        if args.model:
            raise UsageError("give either --model or --gpt-ckpt/--vq-ckpt, not both")
        if not (args.gpt_ckpt and args.vq_ckpt):
            raise UsageError("LlamaGen checkpoints need both --gpt-ckpt and --vq-ckpt")
        if args.t5_path or Path(args.gpt_ckpt).name in LLAMAGEN_T2I_CHECKPOINTS:
            return pipelines.load_llamagen_t2i(args.gpt_ckpt, args.vq_ckpt, args.image_size,
                                               args.gpt_model or "GPT-XL", args.vq_model, args.codebook_size,
                                               args.codebook_embed_dim, t5_path=args.t5_path, device=args.device,
                                               dtype=dtype)
        return pipelines.load_llamagen(args.gpt_ckpt, args.vq_ckpt, args.gpt_model or "GPT-B",
                                       args.image_size or 256, args.vq_model, args.codebook_size,
                                       args.codebook_embed_dim, args.num_classes, device=args.device, dtype=dtype)
    if getattr(args, "t5_path", None):
        raise UsageError("--t5-path goes with LlamaGen text-to-image checkpoints (--gpt-ckpt, --vq-ckpt)")
    prompted = getattr(args, "prompts", None) or getattr(args, "prompt_file", None)
    default = pipelines.DEFAULT_TEXT_MODEL if prompted else pipelines.DEFAULT_MODEL
    pipe = pipelines.load(args.model or default, device=args.device, dtype=dtype)
    if isinstance(pipe, StreamPipeline) and not streaming:
        raise UsageError(f"{pipe.info.name} is a streaming video model: use `vgen stream --model {args.model}`")
    return pipe
