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
from vgen.data.prompts import FORMATS, PromptSet, read_prompt_set
from vgen.models.llamagen import LLAMAGEN_T2I_CHECKPOINTS
from vgen.pipelines import StreamPipeline
from vgen.pipelines.inputs import MAX_SAMPLES, check_device
from vgen.pipelines.load import RELEASED_FOLDERS, released_family
from vgen.samplers import SamplingParams, available_samplers, get_sampler, samplers_taking
from vgen.samplers.options import DeclaredOption, declarations, declared_options, merge_settings
from vgen.samplers.streaming import StreamConfig
from vgen.threads import AUTO

DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
          "fp16": "float16", "float16": "float16"}
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}
MAX_MESSAGE = 1000  # characters of an error line; a longer one is cut
MAX_QUOTED = 60  # characters of a value a message quotes, or of a number in it; a longer one is cut
RUNS = Path(os.environ.get("VGEN_RUNS", Path.home() / ".cache" / "vgen" / "runs"))


class UsageError(Exception):
    """A problem with the command line itself, reported without a traceback."""


def cut_values(message: str) -> str:
    """``message`` with every value it quotes and every number in it cut to :data:`MAX_QUOTED` characters, the
    length said (a message never echoes a long input whole)."""
    def cut(match: re.Match) -> str:
        value = match.group()
        quoted = value[0] in "'\""
        return f"{value[:MAX_QUOTED]}... ({len(value) - 2 * quoted} {'characters' if quoted else 'digits'})"

    return re.sub(rf"'[^']{{{MAX_QUOTED},}}'|\"[^\"]{{{MAX_QUOTED},}}\"|\d{{{MAX_QUOTED + 1},}}", cut, message)


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
        lines), a long value cut (:func:`cut_values`), and exit status 2."""
        self.exit(2, f"vgen: error: {one_line(cut_values(message))} (see: {self.prog} --help)\n")


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


def check_writable(path: str | None, suffixes: set[str] | None = None, overwrite: bool = True) -> None:
    """Fail before any work if ``path`` cannot be written (so that nothing computed is lost), or exists unless
    ``overwrite`` (so that no earlier output is replaced silently)."""
    if path is None:
        return
    p = Path(path)
    if suffixes is not None:
        check_suffix(path, suffixes)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise UsageError(f"cannot write {path}: it is a directory")
    if not overwrite and p.exists():
        raise UsageError(f"{path} exists; pass --overwrite to replace it, or name another file")
    if not parent.is_dir():
        raise UsageError(f"cannot write {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UsageError(f"cannot write {path}: permission denied")


def check_files_in(folder: str, names: Iterable[str], overwrite: bool) -> None:
    """:func:`check_writable` for the files ``names`` a command writes into ``folder``, where that folder exists (a
    new one is made by the command)."""
    if Path(folder).is_dir():
        for name in names:
            check_writable(str(Path(folder) / name), None, overwrite)


def add_overwrite_flag(group: argparse._ActionsContainer) -> None:
    """--overwrite: replace output files that exist (:func:`check_writable`)."""
    group.add_argument("--overwrite", action="store_true",
                       help="replace output files that exist (without it a command refuses them before any work)")


def output_name(model: str, made_by: str, suffix: str) -> str:
    """A default output file that says what made it: ``shapes-c2i_mcsjd.png`` for ``model`` and ``made_by`` (a
    sampler; characters other than letters, digits, ``.`` and ``-`` made ``-``)."""
    def clean(text: str) -> str:
        return re.sub(r"[^\w.-]+", "-", text).strip("-.") or "out"

    return f"{clean(model)}_{clean(made_by)}{suffix}"


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
    """--model (read by :func:`load_pipeline`); LlamaGen's checkpoint flags are :func:`add_checkpoint_args`, last
    in the help, since most runs name an embedded model or a folder."""
    src = p.add_argument_group("model")
    src.add_argument("--model", default=None,
                     help="embedded model name (`vgen models`), pipeline folder, LlamaGen-T2I folder (`vgen "
                          "t2i-config`), or a released Janus-Pro, Emu3, Lumina-mGPT or Anole folder (default: "
                          "shapes-c2i; shapes-t2i when prompts are given); or LlamaGen checkpoints, below")


def add_checkpoint_args(p: argparse.ArgumentParser) -> None:
    """LlamaGen checkpoints and their architecture, instead of --model (read by :func:`load_pipeline`)."""
    src = p.add_argument_group("LlamaGen checkpoints (instead of --model)")
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
                            "own), or of the images an Emu3, Lumina-mGPT or Anole --model folder draws (default: "
                            "720, 768 and 512)")
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


def add_sampler_args(p: argparse.ArgumentParser, option_flags: bool = True) -> argparse._ArgumentGroup:
    """--sampler and, with ``option_flags``, every registered sampler's options (read by :func:`sampler_options`;
    else the caller adds them with :func:`add_sampler_option_flags`, where its help should show them) on top of
    :func:`add_sampling_args`."""
    gen = add_sampling_args(p)
    gen.add_argument("--sampler", default=None,
                     help="sampler name (see `vgen samplers`; default: the model's plain sampler: ar, or "
                          "continuous-ar, nar, nbp for those models)")
    if option_flags:
        add_sampler_option_flags(p)
    return gen


def add_sampler_option_flags(p: argparse.ArgumentParser, applies_to: str = "the sampler") -> None:
    """One flag per option of the registered samplers (read by :func:`sampler_options`), grouped by the samplers
    that take them; ``applies_to`` says in the groups' titles what a flag set applies to."""
    defaults = sampler_defaults()
    for takers, options in sampler_option_groups().items():
        add_option_flags(p.add_argument_group(f"options of {', '.join(takers)} (for {applies_to}; unset = the "
                                              f"sampler's own value)"), options, defaults)


def add_prompt_set_args(group: argparse._ArgumentGroup) -> None:
    """A text-to-image model's prompt set: --prompts (or --prompt-file), --format, --subset and --subset-seed (read
    by :func:`read_prompt_set_args`)."""
    files = group.add_mutually_exclusive_group()
    files.add_argument("--prompts", default=None, metavar="FILE",
                       help="a text-to-image model's prompt set: MS-COCO caption annotations (.json: one caption "
                            "per image), PartiPrompts' TSV (.tsv), GenEval's evaluation_metadata.jsonl (.jsonl) or "
                            "one prompt a line (.txt; other suffixes by their content); taken in turn: sample i gets "
                            "prompt i mod the number of prompts")
    files.add_argument("--prompt-file", default=None, metavar="FILE",
                       help="a plain-text prompt file, one prompt a line (blank lines skipped), as vgen sample "
                            "reads it: the same as --prompts FILE --format text")
    group.add_argument("--format", choices=FORMATS, default=None,
                       help="the --prompts file's format (default: from its suffix and content)")
    group.add_argument("--subset", type=int, default=None, metavar="N",
                       help="draw N prompts of the set (COCO: N images, one caption each), seeded by --subset-seed "
                            "and kept in the file's order (default: every prompt; COCO: every image)")
    group.add_argument("--subset-seed", type=int, default=None, metavar="S",
                       help="seed of the --subset draw and of COCO's caption per image, apart from --seed, so that "
                            "one prompt subset can be drawn with several sampling seeds (default: 0)")


def read_prompt_set_args(args: argparse.Namespace) -> PromptSet | None:
    """The prompt set of --prompts (in --format, or detected) or --prompt-file (plain text), with its --subset drawn
    by --subset-seed; None without a prompt file."""
    path = args.prompts if args.prompts is not None else args.prompt_file
    if path is None:
        given = [flag for flag, value in (("--format", args.format), ("--subset", args.subset),
                                          ("--subset-seed", args.subset_seed)) if value is not None]
        if given:
            raise UsageError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for a prompt set: give "
                             f"--prompts FILE")
        return None
    if args.prompt_file is not None and args.format not in (None, "text"):
        raise UsageError(f"--prompt-file is plain text, one prompt a line: give --prompts {path} --format "
                         f"{args.format}")
    fmt = "text" if args.prompt_file is not None else args.format
    seed = 0 if args.subset_seed is None else args.subset_seed
    return read_prompt_set(path, fmt, args.subset, seed)


def add_negative_prompt_arg(group: argparse._ArgumentGroup) -> None:
    """--negative-prompt, for a model whose guidance runs against a prompt of its own (read by
    :func:`negative_prompt_args`)."""
    group.add_argument("--negative-prompt", default=None, metavar="TEXT",
                       help="what classifier-free guidance steers away from, for a text-to-image model whose "
                            "guidance runs against a prompt (Emu3; default: the model's own, docs/text-to-image.md)")


def negative_prompt_args(args: argparse.Namespace, pipe: Any) -> dict[str, str]:
    """The pipeline's ``negative_prompt=`` argument of --negative-prompt (none when unset); refused for a pipeline
    whose guidance takes none."""
    text = getattr(args, "negative_prompt", None)
    if text is None:
        return {}
    if not getattr(pipe, "takes_negative_prompt", False):
        raise UsageError(f"--negative-prompt is for a model whose guidance runs against a prompt (Emu3); "
                         f"{pipe.info.name}'s guidance runs against its own unconditional rows")
    return {"negative_prompt": text}


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
    """A stream's schedule and context settings (:class:`~vgen.samplers.streaming.StreamConfig`), each a flag of
    its own name: all but the switch mode, which ``vgen stream`` takes as ``--switch-mode`` (its ``--switch`` names
    the switches themselves)."""
    return [o for o in declared_options([StreamConfig]) if o.name != "switch"]


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
            return pipelines.load_llamagen_t2i(args.gpt_ckpt, args.vq_ckpt, image_size=args.image_size,
                                               gpt_model=args.gpt_model or "GPT-XL", vq_model=args.vq_model,
                                               codebook_size=args.codebook_size,
                                               codebook_embed_dim=args.codebook_embed_dim, t5_path=args.t5_path,
                                               device=args.device, dtype=dtype)
        return pipelines.load_llamagen(args.gpt_ckpt, args.vq_ckpt, gpt_model=args.gpt_model or "GPT-B",
                                       image_size=args.image_size or 256, vq_model=args.vq_model,
                                       codebook_size=args.codebook_size, codebook_embed_dim=args.codebook_embed_dim,
                                       num_classes=args.num_classes, device=args.device, dtype=dtype)
    if getattr(args, "t5_path", None):
        raise UsageError("--t5-path goes with LlamaGen text-to-image checkpoints (--gpt-ckpt, --vq-ckpt)")
    prompted = getattr(args, "prompts", None) or getattr(args, "prompt_file", None)
    model = args.model or (pipelines.DEFAULT_TEXT_MODEL if prompted else pipelines.DEFAULT_MODEL)
    if getattr(args, "image_size", None) is not None:
        family = released_family(model)
        if family is None or not family.sized:
            *some, last = [name for name, f in RELEASED_FOLDERS.items() if f.sized]
            sized = f"{', '.join(some)} or {last}" if some else last
            raise UsageError(f"--image-size is for LlamaGen checkpoints and {sized} folders; {model} draws "
                             f"images of its own size")
        pipe = family.load(model, args.device, dtype, image_size=args.image_size)
    else:
        pipe = pipelines.load(model, device=args.device, dtype=dtype)
    if isinstance(pipe, StreamPipeline) and not streaming:
        raise UsageError(f"{pipe.info.name} is a streaming video model: use `vgen stream --model {args.model}`")
    return pipe


def threads_count(text: str) -> int | str:
    """A ``--threads`` value: ``auto`` or a count between 1 and this machine's cores, refused by argparse
    otherwise."""
    if text == AUTO:
        return AUTO
    cores = os.cpu_count() or 1
    try:
        count = int(text)
    except ValueError:
        count = 0
    if not 1 <= count <= cores:
        raise argparse.ArgumentTypeError(f"must be between 1 and this machine's {cores} cores, or {AUTO}; got "
                                         f"{text!r}")
    return count


def add_threads_flag(parser: argparse.ArgumentParser) -> None:
    """``--threads`` on every command that runs (each parser without subcommands of its own), read once by the
    ``vgen`` command (:func:`vgen.threads.threads_for`)."""
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subcommands:
        parser.add_argument("--threads", type=threads_count, default=AUTO,
                            help="CPU threads torch computes with; auto: this machine's cores less those busy "
                                 "elsewhere when the command starts (OMP_NUM_THREADS, when set, is kept)")
    for action in subcommands:
        for child in dict.fromkeys(action.choices.values()):  # an alias names the same parser
            add_threads_flag(child)
