"""Fuzzing the command line: every flag of every ``vgen`` subcommand (read from the parser itself) gets a value from a
seeded list of nasty ones (negative, zero and huge integers, 1e309, nan, inf, empty and 1 MB strings, unicode, a
NUL byte, line breaks, paths that do not exist, a folder where a file is expected and a file where a folder is,
unknown class names and ids), alone and in random pairs; a flag built from a declared sampler, sampling or stream
option also draws its declaration's bounds and the numbers just past them, and bench's sampler specs draw every
numeric option of every sampler that way. Every run ends in one of two ways:

- refused: exit status 2, exactly one ``vgen: error:`` line on stderr (short, no traceback), and no file or folder
  made or changed anywhere;
- accepted: the command gets as far as its work (sampling, streaming, rendering data, measuring features,
  training, serving), where the fuzz stops it (:class:`Reached`), or exits 0. A value that is no number (nan, inf,
  text) for a numeric flag is never accepted, nor zero or a negative number for a count, size or limit
  (:data:`POSITIVE`), nor a value outside a declared option's range.

The commands run in this process (``vgen.apps.cli.main``) on the tiny test pipelines from a fresh folder, and no
model work runs, so the file takes seconds. ``VGEN_FUZZ_EACH`` (values per flag, default 1) and ``VGEN_FUZZ_PAIRS``
(random pairs of flags per command, default 6) make a deeper run.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from vgen.apps import gradio_app, train_cli
from vgen.apps.cli import build_parser, main
from vgen.apps.options import sampler_classes, sampling_options, stream_settings
from vgen.eval import bench, clip, evaluate
from vgen.samplers import available_samplers, get_sampler, samplers_taking
from vgen.samplers.options import DeclaredOption, declarations, declared_options
from vgen.samplers.streaming import BlockStreamer

SEED = 45
NOT_NUMBERS = ["nan", "inf", "-inf", "1e309", "-1e309", "", " ", "ünïcødé ✨", "a" * 1_000_000, "1\n2", "\x00",
               "0x10"]
NUMBERS = ["1", "2", "2147483648", "9223372036854775808", "1" + "0" * 30, "1.5", "1e-320", "-7"]
TEXTS = ["", " ", "ünïcødé ✨", "a" * 1_000_000, "line\nbreak", "\x00", "-", "--", "--x", "none", "shapes-c2i",
         "circle", "star", "zebra", "99", "-1", "b", "2:b", "-1:a", "4:zebra", ":", "1e309", "nan"]
NOT_POSITIVE = ["-1", "0", "-0", "-2147483649"]
# flags whose value must be >= 1 (a count, a size, a limit): each of NOT_POSITIVE is refused
POSITIVE = {"num_images", "batch_size", "num_samples", "num_real", "frames", "fps", "num_frames", "max_concurrency",
            "kid_subsets", "threads", "cols", "max_minutes", "port", "num_val"}
PATHS = ["missing", "missing/deeper/file.png", "folder", "file.txt", "bad.npz", "folder/", ".", "folder/../file.txt"]
# (relative: an accepted command may write where a path points, so none points outside the test's folder)
HUGE = ["1e308", "-1e308", "1" + "0" * 30, "inf", "nan", "true"]
# the numeric options whose flags the sampling commands build from their declarations, by name
DECLARED = {o.name: o for o in [*sampling_options(), *declared_options(sampler_classes()), *stream_settings()]
            if o.kind in (int, float)}
DECLARING = {"sample", "stream", "quality", "sample-many", "bench"}  # the commands with those flags
SPEC_FLAGS = {"samplers", "reference"}  # bench's sampler specs: name:key=value


def declared_values(o: DeclaredOption) -> list[str]:
    """A numeric option's bounds and the numbers just past them, as text."""
    spec, values = o.spec, []
    for bound, way in ((spec.at_least, -1), (spec.above, -1), (spec.at_most, 1), (spec.below, 1)):
        if bound is not None:
            values += [repr(bound), repr(bound + way if o.kind is int else math.nextafter(bound, way * math.inf))]
    return values


def outside(o: DeclaredOption, text: str) -> bool:
    """Whether ``text`` is no valid value of the option ``o`` by its declaration."""
    try:
        number = float(text)
    except ValueError:
        return True
    if not math.isfinite(number) or o.kind is int and not number.is_integer():
        return True
    return not o.spec.in_range(int(number) if o.kind is int else number)


def numeric_options(name: str) -> list[DeclaredOption]:
    """The numeric options a sampler spec ``name:key=value`` takes: the sampler's own and the sampling settings."""
    return [o for o in [*declarations(type(get_sampler(name))).values(), *sampling_options()]
            if o.kind in (int, float)]


# bench specs of every numeric option of every sampler at and past its bounds, and huge: spec -> (option, value)
SPECS = {f"{name}:{o.name}={value}": (o, value) for name in available_samplers() for o in numeric_options(name)
         for value in declared_values(o) + HUGE}


class Reached(Exception):
    """The command accepted its input and was about to do its work: the fuzz stops it there."""


def reached(*args, **kwargs):
    raise Reached


@pytest.fixture
def no_work(monkeypatch):
    """Every place where a command's work starts raises :class:`Reached`: sampling (every sampler), streaming,
    rendering or measuring a benchmark's real images, computing features, training, serving the web demo."""
    for cls in sampler_classes():
        monkeypatch.setattr(cls, "sample", reached)
    monkeypatch.setattr(BlockStreamer, "stream", reached)
    for name in ("render_batch", "render_clips", "measured"):
        monkeypatch.setattr(bench, name, reached)
    monkeypatch.setattr(evaluate, "side_stats", reached)
    monkeypatch.setattr(clip.ClipScorer, "scores", reached)
    for name in [n for n in vars(train_cli) if n.startswith("train_") and callable(getattr(train_cli, n))]:
        monkeypatch.setattr(train_cli, name, reached)
    monkeypatch.setattr(gradio_app, "build_app", reached)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)  # vgen train --threads sets it for the process


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """What the base commands read: small image and clip sets, images with their prompts, a prompt file, and
    stand-ins for LlamaGen checkpoint files."""
    folder = tmp_path_factory.mktemp("inputs")
    rng = np.random.default_rng(0)
    np.savez(folder / "images.npz", arr_0=rng.integers(0, 256, (4, 16, 16, 3), dtype=np.uint8))
    np.savez(folder / "clips.npz", arr_0=rng.integers(0, 256, (4, 4, 16, 16, 3), dtype=np.uint8))
    np.savez(folder / "captioned.npz", arr_0=rng.integers(0, 256, (2, 16, 16, 3), dtype=np.uint8),
             prompts=np.array(["a red star", "a large blue ring"]))
    for name in ("gpt.pt", "vq.pt"):
        (folder / name).write_bytes(b"")
    (folder / "prompts.txt").write_text("a red star\na large blue ring\n")
    return folder


def base_commands(inputs: Path, tiny: Path, stream: Path, video: Path, continuous: Path,
                  t2i: Path, clip_dir: Path, text_stream: Path) -> dict[str, list[str]]:
    """A valid command line of every subcommand (outputs in the current folder): the fuzz adds flags to it."""
    vq, kl = str(tiny / "vq"), str(continuous / "kl")
    tokenizer = {"ar": vq, "nbp": vq, "nar": vq, "classifier": vq, "drafter": vq, "t2i": vq, "scene-judge": vq,
                 "mar": kl}
    commands = {
        "sample": ["sample", "--model", str(tiny), "--out", "s.png", "--no-progress"],
        "sample video": ["sample", "--model", str(video), "--out", "s.gif", "--no-progress"],
        "sample t2i": ["sample", "--model", str(t2i), "--prompt", "a red star", "--out", "s.png", "--no-progress"],
        "stream": ["stream", "--model", str(stream), "--frames", "4", "--out", "s.mp4", "--no-progress"],
        "stream text": ["stream", "--model", str(text_stream), "--prompt", "a red star", "--switch", "2:a blue ring",
                        "--frames", "4", "--out", "s.mp4", "--no-progress"],
        "quality": ["quality", "--model", str(tiny), "--num-images", "3"],
        "quality stream": ["quality", "--model", str(stream), "--num-images", "3"],
        "sample-many": ["sample-many", "--model", str(tiny), "--num-samples", "2", "--out", "run", "--no-progress"],
        "sample-many stream": ["sample-many", "--model", str(stream), "--num-samples", "2", "--out", "run",
                               "--no-progress"],
        "sample-many t2i": ["sample-many", "--model", str(t2i), "--prompt-file", str(inputs / "prompts.txt"),
                            "--num-samples", "2", "--out", "run", "--no-progress"],
        "bench": ["bench", "--model", str(tiny), "--real", str(inputs / "images.npz"), "--features", "shapes",
                  "--num-samples", "2", "--out", "bench", "--no-progress"],
        "eval fid": ["eval", "fid", "--real", str(inputs / "images.npz"), "--fake", str(inputs / "images.npz")],
        "eval fvd": ["eval", "fvd", "--real", str(inputs / "clips.npz"), "--fake", str(inputs / "clips.npz"),
                     "--num-frames", "4"],
        "eval stats": ["eval", "stats", "--images", str(inputs / "images.npz"), "--out", "stats.npz"],
        "eval clip": ["eval", "clip", "--images", str(inputs / "captioned.npz"), "--clip", str(clip_dir)],
        "train package": ["train", "package", "--gpt", str(tiny / "gpt"), "--vq", vq, "--out", "pkg"],
        "t2i-config": ["t2i-config", "t2i", "--gpt-ckpt", str(inputs / "gpt.pt"), "--vq-ckpt",
                       str(inputs / "vq.pt"), "--image-size", "256"],
        "models": ["models", str(tiny)],
        "app": ["app", "--model", "shapes-c2i"],
        "samplers": ["samplers"],
    }
    for recipe in train_cli.RECIPES:
        extra = ["--tokenizer", tokenizer[recipe]] if recipe in tokenizer else []
        commands[f"train {recipe}"] = ["train", recipe, "--data-dir", "data", "--run-dir", "runs", *extra]
    return commands


def command_words(argv: list[str]) -> int:
    """How many words of ``argv`` name the subcommand (``train ar``: 2)."""
    parser, count = build_parser(), 0
    for word in argv:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or word not in sub.choices:
            break
        parser, count = sub.choices[word], count + 1
    return count


def subparser(argv: list[str]) -> argparse.ArgumentParser:
    """The parser of the subcommand ``argv`` starts with."""
    parser = build_parser()
    for word in argv[:command_words(argv)]:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[word]
    return parser


def value_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's flags and positionals that take a value."""
    return [a for a in parser._actions if a.nargs != 0 and not isinstance(a, argparse._SubParsersAction)]


def numeric(action: argparse.Action) -> bool:
    return action.type in (int, float)


def declared_for(command: str, action: argparse.Action) -> DeclaredOption | None:
    """The declaration behind ``action`` of ``command``, for a numeric flag built from one."""
    if command.split()[0] in DECLARING and numeric(action):
        return DECLARED.get(action.dest)
    return None


def out_of_declaration(command: str, action: argparse.Action, value: str) -> bool:
    """Whether ``value`` for ``action`` is outside a declared option's range (the flag's own, or a spec's)."""
    declared = declared_for(command, action)
    if declared is not None:
        return outside(declared, value)
    if action.dest in SPEC_FLAGS and value in SPECS:
        return outside(*SPECS[value])
    return False


def nasty_value(command: str, action: argparse.Action, rng: random.Random) -> str:
    """A value for ``action`` of ``command``: mostly of its own kind (numbers for a numeric flag, with a declared
    option's bounds and the numbers past them; sampler specs for bench's spec flags; paths and text otherwise),
    sometimes of any kind."""
    pool = NUMBERS + NOT_NUMBERS + NOT_POSITIVE if numeric(action) else PATHS + TEXTS
    declared = declared_for(command, action)
    if declared is not None:
        pool += declared_values(declared) + HUGE
    if command.startswith("bench") and action.dest in SPEC_FLAGS:
        pool += rng.sample(sorted(SPECS), 20)
    if action.choices:
        pool += [str(c) for c in action.choices]
    return rng.choice(pool if rng.random() < 0.8 else NUMBERS + NOT_NUMBERS + NOT_POSITIVE + PATHS + TEXTS)


def with_value(argv: list[str], action: argparse.Action, value: str) -> list[str]:
    """``argv`` with ``action`` given ``value``: a flag added at the end (so that it wins), a positional (the
    command's only one) in place of the command's."""
    if action.option_strings:
        return [*argv, f"{action.option_strings[-1]}={value}"]
    at = command_words(argv)
    return [*argv[:at], value, *argv[at + 1:]]


def tree(root: Path) -> dict[str, int]:
    """Every file and folder under ``root`` with its modification time."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


def make_workdir(root: Path) -> None:
    """The folder the commands run in, as each starts: a folder, a text file and a text file named .npz."""
    for p in root.iterdir():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    (root / "folder").mkdir()
    (root / "file.txt").write_text("not an image\n")
    (root / "bad.npz").write_text("not a zip file\n")


def run(argv: list[str], capsys, root: Path) -> tuple[str, str | None]:
    """Run one command line in ``root``: "refused" or "accepted" and what was wrong with how it ended, if anything
    (see the module docstring). After an accepted one ``root`` is made afresh for the next command."""
    before = tree(root)
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    except Reached:
        code = "reached"
    except Exception as e:  # noqa: BLE001 - any other exception is what the fuzz looks for
        code = f"{type(e).__name__}: {str(e)[:300]}"
    captured = capsys.readouterr()
    shown = " ".join(w if len(w) < 80 else f"{w[:40]}...({len(w)} characters)" for w in argv)
    if code == 2:
        lines = captured.err.splitlines()
        problem = None
        if len(lines) != 1 or not lines[0].startswith("vgen: error: "):
            problem = f"not one error line: {captured.err[-500:]!r}"
        elif len(lines[0]) > 1200:
            problem = f"an error line of {len(lines[0])} characters: {lines[0][:200]!r}"
        elif tree(root) != before:
            problem = f"a refused command changed files: {sorted(set(tree(root)) ^ set(before))}"
        return "refused", problem and f"{shown!r}: {problem}"
    if tree(root) != before:
        make_workdir(root)
    if code not in (0, "reached"):
        return "accepted", f"{shown!r}: ended with {code!r}: {captured.err[-500:]!r}"
    return "accepted", None


def cases(commands: dict[str, list[str]], rng: random.Random, each: int,
          pairs: int) -> list[tuple[str, list[str], list]]:
    """(command, argv, [(action, value)]): every value-taking flag ``each`` times (a flag that several of the
    commands share, such as every recipe's --lr, with the first that has it), then ``pairs`` random pairs of the
    command's flags per command."""
    out, seen = [], set()
    for name, argv in commands.items():
        actions = value_actions(subparser(argv))
        new = [a for a in actions if (a.dest, a.type) not in seen]
        seen.update((a.dest, a.type) for a in actions)
        picks = [[a] for a in new for _ in range(each)]
        picks += [rng.sample(actions, 2) for _ in range(pairs if len(actions) > 1 else 0)]
        for pick in picks:
            given = [(a, nasty_value(name, a, rng)) for a in pick]
            line = argv
            for action, value in given:
                line = with_value(line, action, value)
            out.append((name, line, given))
    return out


@pytest.fixture
def world(inputs, tiny_pipeline_dir, tiny_stream_pipeline_dir, tiny_video_pipeline_dir,
          tiny_continuous_pipeline_dir, tiny_t2i_pipeline_dir, tiny_clip_dir, tiny_text_stream_pipeline_dir, tmp_path,
          monkeypatch, no_work):
    """The base command lines, run from a fresh folder (:func:`make_workdir`)."""
    make_workdir(tmp_path)
    monkeypatch.chdir(tmp_path)
    return base_commands(inputs, tiny_pipeline_dir, tiny_stream_pipeline_dir, tiny_video_pipeline_dir,
                         tiny_continuous_pipeline_dir, tiny_t2i_pipeline_dir, tiny_clip_dir,
                         tiny_text_stream_pipeline_dir)


def test_every_base_command_is_accepted(world, capsys, tmp_path):
    for name, argv in world.items():
        assert run(argv, capsys, tmp_path) == ("accepted", None), name


EACH, PAIRS = int(os.environ.get("VGEN_FUZZ_EACH", 1)), int(os.environ.get("VGEN_FUZZ_PAIRS", 6))
GROUPS = ["sample", "stream", "quality", "sample-many", "bench", "eval", "train", "t2i-config models app samplers"]


@pytest.mark.parametrize("group", GROUPS)
def test_nasty_values_are_refused_in_one_line_or_accepted(group, world, capsys, tmp_path, inputs):
    commands = {name: argv for name, argv in world.items() if name.split()[0] in group.split()}
    rng = random.Random(f"{SEED}-{group}")
    inputs_before = tree(inputs)
    outcomes, problems = [], []
    for name, argv, given in cases(commands, rng, EACH, PAIRS):
        outcome, problem = run(argv, capsys, tmp_path)
        if outcome == "accepted" and any(numeric(a) and v in NOT_NUMBERS or a.dest in POSITIVE and v in NOT_POSITIVE
                                         or out_of_declaration(name, a, v) for a, v in given):
            problem = f"{name}: {[(a.dest, v[:40]) for a, v in given]} accepted"
        outcomes.append(outcome)
        problems += [problem] if problem else []
    assert not problems, "\n".join(problems)
    assert tree(inputs) == inputs_before
    assert "refused" in outcomes and "accepted" in outcomes  # the values reach both ends


def declared_cases(world: dict[str, list[str]]) -> list[tuple[str, list[str]]]:
    """(what, argv): every numeric sampler, sampling and stream option given each value past its bounds and a huge
    one, as a flag of the command that takes it and, for a sampler or sampling option, in a bench spec."""
    out = []
    stream_only = {o.name for o in stream_settings()} - {o.name for o in sampling_options()}
    for o in DECLARED.values():
        bad = [v for v in declared_values(o) if outside(o, v)] + ["1e308", "nan"]
        takers = samplers_taking(o.name)
        if o.name in stream_only:
            base = world["stream"]
        else:
            base = [*world["sample"], "--sampler", takers[0]] if takers else world["sample"]
        out += [(f"{o.flag}={v}", [*base, f"{o.flag}={v}"]) for v in bad]
        if o.name not in stream_only:
            spec = takers[0] if takers else "ar"
            out += [(f"{spec}:{o.name}={v}", [*world["bench"], "--samplers", f"{spec}:{o.name}={v}"]) for v in bad]
    return out


def test_every_declared_option_past_its_bounds_is_refused_in_one_line(world, capsys, tmp_path):
    """The declarations reach every entry point: a value past an option's bound, or huge, or not a number, is
    refused as a flag and in a bench spec."""
    cases = declared_cases(world)
    assert {"--draft-length=65537", "cspd:draft_length=1e308", "--top-k=262145", "--window-frames=1025"} <= {
        what for what, _ in cases}
    problems = [f"{what}: {outcome} {problem or ''}" for what, argv in cases
                for outcome, problem in [run(argv, capsys, tmp_path)] if (outcome, problem) != ("refused", None)]
    assert not problems, "\n".join(problems)


# (command of the world, flags naming its outputs, the output made beforehand): every command that writes a file
OUTPUTS = [("sample", [], "s.png"), ("sample", ["--stats", "st.json"], "st.json"), ("stream", [], "s.mp4"),
           ("stream text", [], "s.mp4"),
           ("quality", ["--json", "q.json"], "q.json"), ("quality", ["--grid", "g.png"], "g.png"),
           ("quality stream", ["--json", "q.json"], "q.json"), ("sample-many", [], "run.npz"),
           ("sample-many", ["--npz", "p.npz"], "p.npz"), ("bench", [], "bench/bench.md"),
           ("eval fid", ["--json", "r.json"], "r.json"), ("eval fvd", ["--json", "r.json"], "r.json"),
           ("eval stats", [], "stats.npz"), ("eval stats", ["--json", "r.json"], "r.json"),
           ("eval clip", ["--json", "r.json"], "r.json"), ("train package", [], "pkg/pipeline.json"),
           ("t2i-config", [], "t2i/llamagen_t2i.json")]


@pytest.mark.parametrize(("command", "flags", "existing"), OUTPUTS, ids=[f"{c} {e}" for c, _, e in OUTPUTS])
def test_an_existing_output_is_refused_before_any_work_unless_overwrite(command, flags, existing, world, capsys,
                                                                        tmp_path):
    path = tmp_path / existing
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(b"earlier output")
    argv, before = [*world[command], *flags], tree(tmp_path)
    assert main(argv) == 2  # no work reached (the fuzz's stop would raise)
    assert capsys.readouterr().err == f"vgen: error: {existing} exists; pass --overwrite to replace it, or name " \
                                      f"another file\n"
    assert tree(tmp_path) == before and path.read_bytes() == b"earlier output"
    assert run([*argv, "--overwrite"], capsys, tmp_path) == ("accepted", None)
