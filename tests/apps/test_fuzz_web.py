"""Fuzzing the web demo's endpoints, called as the page calls them (``generate``, ``stream_video`` and the class
switch of :mod:`vgen.apps.gradio_app`): every field gets values from a seeded list of nasty ones (numbers as text
and as floats, nan, inf, 1e400, huge integers, empty, a 1 MB string, unicode, a NUL byte, line breaks, lists,
server paths, unknown models, samplers and classes), several fields at once.

Each request ends in one of two ways: refused with an error the page shows (``ValueError``, ``CheckpointError`` or
``OSError``: a one-line message short enough never to echo a long value), or accepted, when it reaches the sampler
or the streamer, where the fuzz stops it (:class:`Reached`). A value that is no number for a number field is never
accepted, and neither is a missing or negative page number.
"""

from __future__ import annotations

import math
import os
import random

import pytest

from vgen.apps.gradio_app import (
    PAGE_FIELDS,
    SAMPLER_FIELDS,
    SAMPLING_FIELDS,
    InputError,
    ModelAccess,
    StreamSessions,
    generate,
    stream_video,
)
from vgen.apps.options import sampler_classes
from vgen.hub import CheckpointError
from vgen.samplers import available_samplers
from vgen.samplers.streaming import BlockStreamer, StreamControl

SEED = 45
LONG = "9" * 1_000_000
NOT_NUMBERS = [math.nan, math.inf, -math.inf, "nan", "inf", "1e400", "ünïcødé ✨", LONG, "\x00", "1\n2", [1],
               {"a": 1}, "many"]
NUMBERS = [-1, 0, 1, 2, 3, 1.5, "2", " 3 ", 10**30, 2**63, -0.0, "1e300", True, "", None]
TEXTS = ["", " ", None, "ünïcødé ✨", LONG, "x" * 300, "\x00", "a\nb", "/etc", "../../", "/no/such/file.pt", "nope",
         "shapes-c2i", "star", 3, [1]]
PROMPTS = ["a red star", "a large blue ring on a yellow background", " ".join(["star"] * 300), "", None, LONG, 3]


class Reached(Exception):
    """The request was accepted: it got to the sampler (or the streamer)."""


def reached(*args, **kwargs):
    raise Reached


@pytest.fixture
def no_sampling(monkeypatch):
    for cls in sampler_classes():
        monkeypatch.setattr(cls, "sample", reached)
    monkeypatch.setattr(BlockStreamer, "stream", reached)


@pytest.fixture(scope="module")
def models(tiny_pipeline_dir, tiny_video_pipeline_dir, tiny_stream_pipeline_dir, tiny_t2i_pipeline_dir) -> dict:
    return {"image": str(tiny_pipeline_dir), "video": str(tiny_video_pipeline_dir),
            "stream": str(tiny_stream_pipeline_dir), "t2i": str(tiny_t2i_pipeline_dir)}


@pytest.fixture(scope="module")
def access(models) -> ModelAccess:
    return ModelAccess(folders=tuple(models.values()))


def run(call, **fields) -> tuple[str, str | None]:
    """How ``call(**fields)`` ended: ("refused", message), ("accepted", None) or ("returned", None); any other
    exception fails the test."""
    try:
        call(**fields)
    except Reached:
        return "accepted", None
    except (ValueError, CheckpointError, OSError) as e:
        return "refused", str(e)
    return "returned", None


def first_frame(**fields):
    """The stream's first block, as the page asks for it."""
    return next(stream_video(**fields))


def check_ending(fields: dict, outcome: str, message: str | None, must_refuse: list[str]) -> str | None:
    """What was wrong with how a request with ``fields`` ended, or None."""
    shown = {k: v if len(repr(v)) < 50 else f"{repr(v)[:30]}..." for k, v in fields.items()}
    if outcome == "returned":
        return f"{shown}: returned without reaching the sampler"
    if outcome == "accepted" and must_refuse:
        return f"{shown}: accepted, though {must_refuse} are bad"
    if outcome == "refused" and ("\n" in message or len(message) > 1000 or not message.strip()):
        return f"{shown}: a message that is empty, long or not one line: {message[:200]!r}"
    echoed = [k for k, v in fields.items() if len(str(v)) > 100 and str(v)[:100] in (message or "")]
    if echoed:
        return f"{shown}: the message echoes the long {echoed}: {message[:200]!r}"
    return None


def page_number_is_bad(name: str, value) -> bool:
    """Whether a page number field (class id, count, seed, frames) must refuse ``value``."""
    if value in NOT_NUMBERS or value is None or isinstance(value, (bool, list, dict)) or str(value).strip() == "":
        return True
    try:
        number = float(value)
    except (TypeError, ValueError):
        return True
    spec = PAGE_FIELDS[name].spec
    return not (math.isfinite(number) and number.is_integer() and spec.in_range(number))


def option_is_bad(value) -> bool:
    """Whether an option field (empty: the default) must refuse ``value`` whatever its bounds: no number at all."""
    return any(value is v or value == v for v in NOT_NUMBERS if not (isinstance(v, float) and math.isnan(v))) or (
        isinstance(value, float) and not math.isfinite(value))


def test_generate_refuses_every_bad_field_with_a_short_message(access, models, tmp_path, no_sampling):
    rng = random.Random(f"{SEED}-generate")
    numbers = [o.name for o in SAMPLING_FIELDS] + [o.name for o in SAMPLER_FIELDS if o.kind in (int, float)]
    problems, outcomes = [], []
    for _ in range(int(os.environ.get("VGEN_FUZZ_WEB", 600))):
        kind = rng.choice(["image", "video", "t2i", "stream", "other"])
        fields = {"model": models[kind] if kind in models else rng.choice(TEXTS),
                  "sampler": rng.choice(["ar", "sjd", "lantern", "gsd", "nar", *TEXTS[:6]]),
                  "class_id": rng.choice([0, 1, 2, *NUMBERS, *NOT_NUMBERS[:3]]),
                  "num_images": rng.choice([1, 2, 4, *NUMBERS, *NOT_NUMBERS[:3]]),
                  "seed": rng.choice([0, 7, *NUMBERS, *NOT_NUMBERS[:3]]),
                  "prompt": rng.choice(PROMPTS)}
        for name in rng.sample(numbers, rng.randint(0, 3)):
            fields[name] = rng.choice(NUMBERS + NOT_NUMBERS)
        if rng.random() < 0.1:
            fields.update(gpt_ckpt=rng.choice(TEXTS), vq_ckpt=rng.choice(TEXTS))
        must_refuse = [n for n in ("num_images", "seed") if page_number_is_bad(n, fields[n])]
        must_refuse += [n for n in numbers if n in fields and option_is_bad(fields[n])]
        if kind == "image":
            must_refuse += ["class_id"] if page_number_is_bad("class_id", fields["class_id"]) else []
        outcome, message = run(generate, **fields, folder=tmp_path, access=access)
        outcomes.append(outcome)
        problem = check_ending(fields, outcome, message, must_refuse)
        problems += [problem] if problem else []
    assert not problems, "\n".join(problems)
    assert {"accepted", "refused"} <= set(outcomes)


def test_stream_video_refuses_every_bad_field_with_a_short_message(access, models, tmp_path, no_sampling):
    rng = random.Random(f"{SEED}-stream")
    problems, outcomes = [], []
    for _ in range(int(os.environ.get("VGEN_FUZZ_WEB", 600)) // 2):
        fields = {"model": models["stream"] if rng.random() < 0.8 else rng.choice([models["image"], *TEXTS]),
                  "class_id": rng.choice([0, 1, 2, *NUMBERS, *NOT_NUMBERS[:4]]),
                  "num_frames": rng.choice([2, 8, 2000, 2001, *NUMBERS, *NOT_NUMBERS[:4]]),
                  "seed": rng.choice([0, *NUMBERS, *NOT_NUMBERS[:4]]),
                  "steps": rng.choice(["", " ", 2, 1000, 1001, *NUMBERS, *NOT_NUMBERS]),
                  "cfg_scale": rng.choice(["", 1.0, 3, 100, 101, *NUMBERS, *NOT_NUMBERS])}
        must_refuse = [n for n in ("num_frames", "seed") if page_number_is_bad(n, fields[n])]
        must_refuse += [n for n in ("steps", "cfg_scale") if option_is_bad(fields[n])]
        outcome, message = run(first_frame, **fields, folder=tmp_path, access=access)
        outcomes.append(outcome)
        problem = check_ending(fields, outcome, message, must_refuse)
        problems += [problem] if problem else []
    assert not problems, "\n".join(problems)
    assert {"accepted", "refused"} <= set(outcomes)


def test_the_class_switch_refuses_every_bad_class_with_a_short_message():
    sessions = StreamSessions()
    with sessions.running("visitor") as control:
        assert isinstance(control, StreamControl)
        for value in NUMBERS + NOT_NUMBERS:
            try:
                answer = sessions.switch("visitor", value)
            except InputError as e:
                assert page_number_is_bad("class_id", value), (value, str(e))
                assert "\n" not in str(e) and len(str(e)) < 300
            else:
                assert not page_number_is_bad("class_id", value) and answer.startswith("class ")


def test_a_refusal_says_the_same_for_a_server_path_that_exists_and_one_that_does_not(tmp_path, no_sampling):
    answers = set()
    for path in ("/etc", "/no/such/folder", str(tmp_path), "../../"):
        outcome, message = run(generate, model=path, sampler="ar", class_id=0, num_images=1, seed=0, folder=tmp_path,
                               access=ModelAccess())
        assert outcome == "refused"
        answers.add(message.replace(repr(path), "PATH"))
    assert len(answers) == 1
    assert sorted(available_samplers())  # the registry the sampler field is checked against
