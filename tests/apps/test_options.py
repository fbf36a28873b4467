"""The front ends are built from the option declarations: a declared option is a command-line flag and a web
field with the same name, help and default (unset: the model's or the sampler's own value), and `vgen train`'s
defaults are the recipes' own."""

from __future__ import annotations

import argparse

import pytest
import torch

from vgen.apps.cli import build_parser, main
from vgen.apps.options import (
    HelpFormatter,
    class_label,
    plural,
    sampler_classes,
    sampler_options,
    sampling_options,
    sampling_overrides,
    shows_default,
    stream_flags,
    stream_settings,
)
from vgen.apps.train_cli import RECIPES
from vgen.samplers.options import declarations, declared_options
from vgen.samplers.streaming import StreamConfig
from vgen.training.ar import AR_CFG_SCALE

SAMPLER_OPTIONS = declared_options(sampler_classes())
STREAM_OPTIONS = declared_options([StreamConfig])
STREAM_FLAGS = stream_flags()  # all but the guidance: a token command's --cfg-scale serves both


def subcommand(*names: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in names:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {option: a for a in parser._actions for option in a.option_strings}


@pytest.mark.parametrize("command, options", [
    ("sample", sampling_options() + SAMPLER_OPTIONS),
    ("sample-many", sampling_options() + SAMPLER_OPTIONS + STREAM_FLAGS),
    ("bench", sampling_options()),
    ("quality", sampling_options() + STREAM_FLAGS),
    ("stream", stream_settings()),
], ids=["sample", "sample-many", "bench", "quality", "stream"])
def test_each_declared_option_is_a_flag_with_its_help_and_no_default(command, options) -> None:
    available = flags(subcommand(command))
    for o in options:
        action = available[o.flag]
        assert (action.dest, action.default) == (o.name, None) and action.help.startswith(o.help.rstrip(")"))


def test_the_stream_switch_mode_is_its_own_flag_beside_the_switches() -> None:
    available = flags(subcommand("stream"))
    mode = next(o for o in STREAM_OPTIONS if o.name == "switch")
    assert available["--switch-mode"].default is None and available["--switch-mode"].help.startswith(mode.spec.help)
    assert available["--switch"].dest == "switches"


def help_of(parser: argparse.ArgumentParser, flag: str) -> str:
    """The help text ``--help`` shows for ``flag``."""
    return parser._get_formatter()._expand_help(flags(parser)[flag])


def subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Every (sub)command's parser, with its path of names."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from subcommands(child, (*path, name))


def test_every_option_of_every_subcommand_has_help_and_shows_its_default() -> None:
    seen = 0
    for path, parser in subcommands(build_parser()):
        assert parser.formatter_class is HelpFormatter, path
        formatter = parser._get_formatter()
        for action in parser._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help and action.help.strip(), f"vgen {' '.join(path)} {action.option_strings} has no help"
            if shows_default(action):
                assert "(default: %(default)s)" in formatter._get_help_string(action)
            seen += 1
    assert seen > 300


@pytest.mark.parametrize("command, flag, shown", [
    ("sample", "--cfg-scale", "default: the model's recommended value, else 1.0)"),
    ("sample", "--top-k", "(in [0, 262144]; 0 = off; default: the model's recommended value, else 0)"),
    ("sample", "--temperature", "(in [0, 100]; 0 = greedy; default: the model's recommended value, else 1.0)"),
    ("sample", "--seed", "(default: 0)"),
    ("sample", "--device", "(default: cpu)"),
    ("sample", "--num-images", "(default: one per class or prompt given)"),
    ("sample", "--window", "(in [0, 65536]; 0 = the device's: 16 on a CPU, 64 on a GPU; default: 16 for gsd and "
                           "lantern and mcsjd and sjd and speculative, 0 for mcsjd-tree)"),
    ("sample", "--accept", "default: gsd for gsd, lantern for lantern, exact for"),
    ("stream", "--steps", "(in [1, 1000]; default: the model's recommended value, else 4)"),
    ("app", "--host", "(default: 127.0.0.1)"),
    ("app", "--port", "(default: 7860)"),
    ("app", "--max-concurrency", "(default: 2)"),
    ("train", "--lr", None),
])
def test_help_states_defaults_and_what_zero_means(command, flag, shown) -> None:
    parser = subcommand(*([command, "ar"] if command == "train" else [command]))
    assert (shown or "(default: 0.001)") in help_of(parser, flag)


def test_a_class_flag_reads_an_id_as_a_number_and_anything_else_as_a_name() -> None:
    assert (class_label("3"), class_label("-1"), class_label("star"), class_label("12a")) == (3, -1, "star", "12a")
    args = build_parser().parse_args(["sample", "--class-id", "star", "--class-id", "2"])
    assert args.class_ids == ["star", 2]


def test_counts_take_the_singular_for_one() -> None:
    assert (plural(1, "image"), plural(2, "image"), plural(0, "clip")) == ("1 image", "2 images", "0 clips")
    assert plural(1, "forward pass", "forward passes") == "1 forward pass"
    assert plural(3, "forward pass", "forward passes") == "3 forward passes"


def test_flags_set_on_the_command_line_become_settings_of_their_types() -> None:
    args = build_parser().parse_args(["sample", "--window", "4", "--lantern-delta", "0.2", "--compile",
                                      "--draft-init", "left", "--top-k", "5", "--cfg-scale", "2"])
    assert sampler_options(args) == {"window": 4, "lantern_delta": 0.2, "compile": True, "draft_init": "left"}
    assert sampling_overrides(args) == {"top_k": 5, "cfg_scale": 2.0}
    assert sampler_options(build_parser().parse_args(["sample"])) == {}


def test_stream_window_is_counted_in_frames_and_named_so() -> None:
    sample, stream = flags(subcommand("sample")), flags(subcommand("stream"))
    assert sample["--window"].dest == "window" and "--window-frames" not in sample
    assert stream["--window-frames"].dest == "window_frames" and "--window" not in stream


def test_each_declared_option_is_a_web_field_with_the_same_name_help_and_default() -> None:
    gr = pytest.importorskip("gradio")
    from vgen.apps.gradio_app import GENERATE_INPUTS, SAMPLER_FIELDS, build_app

    fields = {}
    for block in build_app().blocks.values():  # the first of a label: the Generate tab's
        if isinstance(block, (gr.Textbox, gr.Number, gr.Dropdown)):
            fields.setdefault(block.label, block)
    web_options = sampling_options() + SAMPLER_FIELDS + [declarations(StreamConfig)[n] for n in ("steps", "cfg_scale")]
    for o in web_options:
        field = fields[o.name]
        assert field.info == o.help
        assert o.name in GENERATE_INPUTS or o.name == "steps"
        if o.kind in (int, float):  # a number field shows a value: a browser sends an empty one as 0
            assert isinstance(field, gr.Number) and field.value is not None
        else:  # empty: the sampler's own
            assert field.value == "" and (o.spec.allowed() is None or isinstance(field, gr.Dropdown))
    # the web page offers every sampler option the command line does, but compiling
    assert {o.name for o in SAMPLER_FIELDS} == {o.name for o in SAMPLER_OPTIONS} - {"compile"}


@pytest.mark.parametrize("what", sorted(RECIPES))
def test_train_flags_default_to_the_recipes_own_settings(what) -> None:
    args = build_parser().parse_args(["train", what])
    d = RECIPES[what].defaults
    assert (args.steps, args.lr, args.batch_size, args.warmup_steps, args.num_images, args.precision) == \
        (d.steps, d.lr, d.batch_size, d.warmup_steps, d.num_items, d.precision)
    train = d.train_config(steps=args.steps)
    assert (train.ema_decay, train.weight_decay) == (d.ema_decay, d.weight_decay)


def test_only_the_video_text_to_image_and_continuous_recipes_train_off_the_cpu(capsys, monkeypatch) -> None:
    assert {what for what, r in RECIPES.items() if r.off_cpu} == {"mar", "nbp", "nar", "blockdiff", "t2i",
                                                                  "scene-judge", "t2v-kl", "t2v-stream"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # --device cuda is a device this machine has
    assert main(["train", "classifier", "--device", "cuda"]) == 2
    assert ("only the recipes mar, nbp, nar, blockdiff, t2i, scene-judge, t2v-kl, t2v-stream, ar --video train off "
            "the CPU" in capsys.readouterr().err)


def test_package_takes_the_declared_sampling_settings_as_the_recommended_ones() -> None:
    available = flags(subcommand("train", "package"))
    assert all(available[o.flag].help == o.help for o in sampling_options())
    assert help_of(subcommand("train", "package"), "--cfg-scale").endswith(f"(default: {AR_CFG_SCALE})")
    args = build_parser().parse_args(["train", "package", "--gpt", "g", "--out", "o", "--top-k", "5"])
    assert (args.cfg_scale, args.top_k, args.temperature) == (AR_CFG_SCALE, 5, None)


def test_a_mistake_argparse_finds_is_one_line_that_cuts_a_long_value(capsys) -> None:
    for argv, message in [(["sample", "--num-images", "x" * 10_000], "argument --num-images: invalid int value: 'xxx"),
                          (["sample-many", "--num-samples", "2"], "the following arguments are required: --out"),
                          (["sample", "--stats=--"], "argument --stats: expected one argument"),
                          (["sample", "--nope"], "unrecognized arguments: --nope")]:
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and err.startswith(f"vgen: error: {message}"), err
        assert len(err) < 200 and err.rstrip().endswith("--help)")


@pytest.mark.parametrize("device, message", [
    ("nope", "unknown device 'nope': use cpu, cuda, cuda:1, mps"),
    ("", "unknown device ''"),
    ("meta", "device meta: this machine has no meta device"),
    ("cpu:3", "device cpu:3: this machine has 1 cpu devices"),
])
@pytest.mark.parametrize("command", [["sample"], ["quality"], ["eval", "fid", "--real", "r", "--fake", "f"],
                                     ["train", "kl"]])
def test_the_device_flag_takes_only_a_device_this_machine_has(command, device, message, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main([*command, "--device", device])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"vgen: error: argument --device: {message}") and err.count("\n") == 1


def test_an_error_message_is_one_line_of_bounded_length(tmp_path, capsys) -> None:
    assert main(["sample", "--context", "a\nb"]) == 2
    assert capsys.readouterr().err == "vgen: error: --context a\\nb is not a file\n"
    assert main(["sample", "--context", "x" * 100_000]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 1100 and err.rstrip().endswith("0 characters)")


def leaf_commands(parser: argparse.ArgumentParser, words: str = "vgen") -> dict[str, argparse.ArgumentParser]:
    """Every command that runs (a parser with no subcommands of its own) by the words that name it."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {words: parser}
    return {key: leaf for a in subs for name, child in a.choices.items()
            for key, leaf in leaf_commands(child, f"{words} {name}").items()}


def test_every_command_takes_threads_auto_by_default() -> None:
    commands = leaf_commands(build_parser())
    assert {"vgen sample", "vgen stream", "vgen samplers", "vgen train kl", "vgen eval fid"} <= set(commands)
    for words, parser in commands.items():
        flags = [a for a in parser._actions if "--threads" in a.option_strings]
        assert len(flags) == 1 and flags[0].default == "auto", words


@pytest.mark.parametrize(("given", "expected"), [([], "auto"), (["--threads", "1"], 1),
                                                 (["--threads", "auto"], "auto")])
def test_the_command_runs_with_the_threads_asked_for(given, expected, monkeypatch, capsys) -> None:
    import vgen.apps.cli as cli

    asked = []
    monkeypatch.setattr(cli, "threads_for", lambda threads: asked.append(threads) or cli.contextlib.nullcontext())
    assert main(["samplers", *given]) == 0
    assert asked == [expected]


@pytest.mark.parametrize("value", ["0", "-1", "many", "1000000"])
@pytest.mark.parametrize("command", [["stream"], ["train", "kl"]])
def test_a_thread_count_outside_the_machines_cores_is_refused_in_one_line(command, value, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main([*command, "--threads", value])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert err.startswith("vgen: error: argument --threads: must be between 1 and this machine's"), err
