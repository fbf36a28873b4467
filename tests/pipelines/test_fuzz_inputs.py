"""Fuzzing the pipeline API: ``vgen.load("shapes-c2i")`` (and a tiny streaming pipeline) called with class ids,
counts, seeds, generators, sampling settings, sampler options, prompts and prefixes of wrong types and values, in
seeded random combinations of one to three arguments; and ``vgen.load`` itself with bad names, devices, dtypes and
limits. The numeric sampling, stream and sampler options also draw values from their declarations: the bounds, the
numbers just past them, and huge, non-finite and boolean numbers.

A call with a bad argument raises a ValueError or TypeError from vgen's own checks (never from inside torch or
numpy), with a one-line message of bounded length that names one of the bad arguments; a call whose arguments are
all good reaches the sampler, where the fuzz stops it (:class:`Reached`), so no image is sampled.
"""

from __future__ import annotations

import math
import random
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch

import vgen
from vgen.apps.options import sampler_classes
from vgen.samplers import SamplingParams, available_samplers, get_sampler
from vgen.samplers.options import DeclaredOption, declarations
from vgen.samplers.streaming import BlockStreamer, StreamConfig, StreamControl

SEED = 45
LONG = "a" * 1_000_000


class Reached(Exception):
    """Every argument was accepted: the call got to the sampler (or the streamer)."""


def reached(*args, **kwargs):
    raise Reached


@pytest.fixture(scope="module")
def pipe():
    return vgen.load("shapes-c2i")


@pytest.fixture(scope="module")
def stream_pipe(tiny_stream_pipeline_dir):
    return vgen.load(tiny_stream_pipeline_dir)


@pytest.fixture
def no_sampling(monkeypatch):
    for cls in sampler_classes():
        monkeypatch.setattr(cls, "sample", reached)
    monkeypatch.setattr(BlockStreamer, "stream", reached)


HUGE = [1e308, -1e308, 10**400, math.inf, -math.inf, math.nan, True]


def numeric(config: type) -> list[DeclaredOption]:
    return [o for o in declarations(config).values() if o.kind in (int, float)]


def declared_values(o: DeclaredOption) -> tuple[list, list]:
    """Good and bad values of a numeric option by its declaration: its closed bounds; its open bounds, the numbers
    just past every bound, and huge, non-finite and boolean numbers."""
    spec, good, bad = o.spec, [], list(HUGE)
    for bound, way, closed in ((spec.at_least, -1, True), (spec.above, -1, False), (spec.at_most, 1, True),
                               (spec.below, 1, False)):
        if bound is not None:
            (good if closed else bad).append(bound)
            bad.append(bound + way if o.kind is int else math.nextafter(bound, way * math.inf))
    return good, bad


def with_declared(arguments: dict, options: list[DeclaredOption], good: bool = True) -> dict:
    """``arguments`` with each of ``options`` also given its declaration's bad values and (with ``good``) its
    good ones."""
    out = dict(arguments)
    for o in options:
        known_good, known_bad, word = out.get(o.name, ([None], [], o.name))
        declared_good, declared_bad = declared_values(o)
        out[o.name] = (known_good + (declared_good if good else []), known_bad + declared_bad, word)
    return out


# argument -> (good values, bad values, a word every message about a bad value holds)
IMAGE_ARGUMENTS = {
    "class_ids": ([None, 0, 7, [0, 7], "star", ["circle", 3], np.int64(2), torch.tensor(3), (1, 2), range(3),
                   np.array([1, 2])],
                  ["12", [1.7], True, [True], 1.5, -1, 8, 10**30, math.nan, [], [[1]], b"1", "zebra", "", LONG,
                   object(), 2**64, np.float32(1.0), torch.tensor([[1]]), torch.tensor(1.5), [None], {"a": 1}],
                  "class"),
    "num_images": ([None, 1, 3, np.int64(2)], [0, -1, 1.5, "2", True, math.nan, math.inf, 10**30, [2], 2**63],
                   "num_images"),
    "seed": ([None, 0, 2**64 - 1, np.uint64(5)], [-1, 2**64, 1.5, "3", True, math.nan, [1], LONG], "seed"),
    "generator": ([None, torch.Generator()], ["x", 3, np.random.default_rng(0), torch.Generator], "generator"),
    "cfg_scale": ([None, 0, 1, 4.0, 100, np.float32(2.0)],
                  [-1, math.inf, math.nan, 1e309, "2", [2], 10**400, 101, True, LONG], "cfg_scale"),
    "cfg_interval": ([None, -1, 0, 3], [-2, 1.5, "1", math.inf], "cfg_interval"),
    "temperature": ([None, 0, 1.0], [-0.1, math.inf, math.nan, "1"], "temperature"),
    "top_k": ([None, 0, 5], [-1, 2.5, math.inf, "5"], "top_k"),
    "top_p": ([None, 1.0, 0.5], [0, 1.5, -math.inf, math.nan], "top_p"),
    "sampler": ([None, "ar", "sjd", ""], ["nope", 3, LONG, ["ar"]], "sampler"),
    "prompt": ([None], ["a red circle", ["x"], 3, "", b"x"], "prompt"),
    "prompt_embeds": ([None], [torch.zeros(1, 4, 8), "x"], "prompt"),
    "prompt_ids": ([None], [torch.zeros(1, 4, dtype=torch.long), "x"], "prompt"),
    "batch_size": ([None, 1, 8, np.int64(2)], [0, -1, 1.5, "2", True, math.nan, 10**30, [2]], "batch_size"),
    "prefix": ([None], ["x", [[1, 2]], torch.zeros(1, 2), torch.tensor([[99999]])], "prefix|continue"),
    "nope": ([], [1, None], "nope"),
}
IMAGE_ARGUMENTS = with_declared(IMAGE_ARGUMENTS, numeric(SamplingParams))

TEXT_ARGUMENTS = {  # a text-to-image pipeline (shapes-t2i): the prompt rule and the other ways to give a prompt
    "prompt": (["a red circle", ["a red circle", "a blue star"], ("a ring",), "a red\tcircle"],
               [None, "", " ", [""], ["a ring", ""], b"a ring", [b"a ring"], -1, [1, 2], True, [], {"a": 1}, 3.5,
                ["a ring", None]], "prompt"),
    "prompt_embeds": ([None], [torch.zeros(1, 4, 256, dtype=torch.long), "x", torch.zeros(1, 30, 256)], "prompt"),
    "prompt_ids": ([None], [torch.zeros(1, 4, dtype=torch.long), [[1]]], "prompt"),
    "prompt_attention_mask": ([None], [torch.ones(1, 4), "x"], "prompt"),
    "class_ids": ([None], [0, [1], "star"], "class|prompt"),
    "num_images": ([None, 1, 3], [0, -1, 1.5, True, 10**30, 10**7], "num_images|sample-many"),
    "batch_size": ([None, 1, 4], [0, 2.5, "1", False], "batch_size"),
}

STREAM_ARGUMENTS = {
    "class_ids": ([None, 0, 2, [0, 2], "c", ["a", 1], np.int64(1)],
                  ["12", [1.7], True, 3, -1, [], "zebra", LONG, object(), torch.tensor(1.5)], "class"),
    "num_frames": ([1, 16, np.int64(4)], [0, -1, 2.5, "4", True, math.inf, 10**30, None], "num_frames"),
    "seed": IMAGE_ARGUMENTS["seed"],
    "control": ([None, StreamControl()], ["x", 3, object()], "control"),
    "steps": ([None, 1, 4], [0, -1, 100000, 2.5, "4", math.nan], "steps"),
    "cfg_scale": ([None, 1.0, 3.0], [-1, math.inf, "2", 1e309], "cfg_scale"),
    "window_frames": ([None, 2, 4], [3, 0, 8, -2, 1.5], "window"),
    "refresh": ([None, "none", "recompute"], ["sometimes", 1, LONG], "refresh"),
    "batch_size": ([None, 3, 8], [0, -1, 1.5, "2", True, 10**30], "batch_size"),
    "nope": ([], [1], "nope"),
}
# a stream's bounds may not fit the tiny model's frames (refused by the model, not the declaration): bad values only
STREAM_ARGUMENTS = with_declared(STREAM_ARGUMENTS, numeric(StreamConfig), good=False)
# another setting a good value needs: LANTERN++'s lambda, above LANTERN's total-variation budget of at most 1; a
# draft tree's exact rule, which the lossy presets replace with their own
NEEDS = {"lantern_delta": lambda value: {"lantern_mode": "relative"} if value > 1 else {},
         "candidates": lambda value: {"accept": "exact"} if value > 1 else {}}


def pick(arguments: dict, rng: random.Random) -> tuple[dict, list[str]]:
    """One to three arguments with a value each, and the names of those given a bad one."""
    kwargs, bad = {}, []
    for name in rng.sample(sorted(arguments), rng.randint(1, 3)):
        good, wrong, _ = arguments[name]
        if good and rng.random() < 0.4:
            kwargs[name] = rng.choice(good)
        else:
            kwargs[name] = rng.choice(wrong)
            bad.append(name)
    return kwargs, bad


def innermost_file(e: BaseException) -> str:
    return traceback.extract_tb(e.__traceback__)[-1].filename


def problem_of(call, kwargs: dict, bad: list[str], arguments: dict) -> str | None:
    """What was wrong with how ``call(**kwargs)`` ended, or None."""
    shown = {k: v if len(repr(v)) < 60 else f"{repr(v)[:40]}..." for k, v in kwargs.items()}
    try:
        call(**kwargs)
    except Reached:
        return f"{shown}: accepted, though {bad} are bad" if bad else None
    except (ValueError, TypeError) as e:
        message, where = str(e), innermost_file(e)
        if not bad:
            return f"{shown}: refused ({type(e).__name__}: {message[:200]}), though every argument is good"
        if Path(vgen.__file__).parent not in Path(where).parents:
            return f"{shown}: {type(e).__name__} from {where}: {message[:200]}"
        if "\n" in message or len(message) > 400:
            return f"{shown}: a message of {len(message)} characters or lines: {message[:200]!r}"
        words = "|".join(arguments[name][2] for name in bad)
        if not any(word in message for word in words.split("|")):
            return f"{shown}: the message names none of {bad}: {message[:200]}"
        return None
    except Exception as e:  # noqa: BLE001 - any other exception is what the fuzz looks for
        return f"{shown}: {type(e).__name__} from {innermost_file(e)}: {str(e)[:200]}"
    return f"{shown}: returned without sampling"


def fuzz(call, arguments: dict, seed: str, count: int) -> list[str]:
    rng = random.Random(seed)
    problems = []
    for _ in range(count):
        kwargs, bad = pick(arguments, rng)
        problem = problem_of(call, kwargs, bad, arguments)
        problems += [problem] if problem else []
    return problems


def test_every_bad_argument_of_an_image_pipeline_call_is_refused_by_name(pipe, no_sampling):
    problems = fuzz(pipe, IMAGE_ARGUMENTS, f"{SEED}-image", 1500)
    assert not problems, "\n".join(problems)


def test_every_numeric_sampler_option_is_taken_or_refused_by_name_as_declared(pipe, no_sampling):
    """Each registered sampler's numeric options at their declared bounds reach the sampler; past them, huge,
    non-finite or boolean, they are refused with a message naming the option."""
    problems, tried = [], 0
    for name in available_samplers():
        for o in numeric(type(get_sampler(name))):
            good, bad = declared_values(o)
            for value, is_good in [(v, True) for v in good] + [(v, False) for v in bad]:
                kwargs = {"sampler": name, o.name: value,
                          **(NEEDS[o.name](value) if is_good and o.name in NEEDS else {})}
                problem = problem_of(pipe, kwargs, [] if is_good else [o.name], {o.name: ([], [], o.name)})
                problems += [f"{name}: {problem}"] if problem else []
                tried += 1
    assert not problems, "\n".join(problems)
    assert tried > 200


def test_every_bad_prompt_of_a_text_pipeline_call_is_refused_by_name(no_sampling):
    text_pipe = vgen.load("shapes-t2i")
    problems = fuzz(lambda **kw: text_pipe(**{"prompt": "a ring", **kw}), TEXT_ARGUMENTS, f"{SEED}-text", 400)
    assert not problems, "\n".join(problems)


def test_every_bad_argument_of_a_stream_is_refused_by_name(stream_pipe, no_sampling):
    problems = fuzz(stream_pipe.stream_blocks, STREAM_ARGUMENTS, f"{SEED}-stream", 600)
    problems += fuzz(lambda **kw: stream_pipe(**{"num_frames": 2, **kw}), STREAM_ARGUMENTS, f"{SEED}-call", 300)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("kwargs, message", [
    (dict(name_or_path=None), "name_or_path must be a str or Path, got NoneType"),
    (dict(name_or_path=3), "name_or_path must be a str or Path, got int"),
    (dict(name_or_path=""), "name_or_path is an empty string"),
    (dict(name_or_path="nope"), "unknown model 'nope'"),
    (dict(name_or_path=LONG), "name_or_path is too long for a path (1000000 characters)"),
    (dict(name_or_path="b" * 200), "unknown model 'bbbb"),
    (dict(name_or_path="/"), "is not a vgen pipeline folder"),
    (dict(name_or_path="shapes-c2i\x00"), "name_or_path holds a NUL character"),
    (dict(device="nope"), "unknown device 'nope'"),
    (dict(device=3), "device must be a name such as cpu"),
    (dict(dtype="fp16"), "dtype must be a torch floating-point dtype"),
    (dict(dtype=torch.int64), "dtype must be a torch floating-point dtype"),
    (dict(max_params=-1), "max_params"),
    (dict(max_params="x"), "max_params"),
])
def test_load_refuses_bad_arguments_by_name(kwargs, message):
    with pytest.raises((ValueError, TypeError)) as e:
        vgen.load(**{"name_or_path": "shapes-c2i", **kwargs})
    assert message in str(e.value) and len(str(e.value)) < 400
    assert Path(vgen.__file__).parent in Path(innermost_file(e.value)).parents
