"""Fuzzing the web demo's endpoints, called as the page calls them (``generate``, ``stream_video`` and the class
switch of :mod:`vgen.apps.gradio_app`): every field gets values from a seeded list of nasty ones (numbers as text
and as floats, nan, inf, 1e400, huge integers, empty, a 1 MB string, unicode, a NUL byte, line breaks, lists,
server paths, unknown models, samplers and classes), several fields at once.

Each request ends in one of two ways: refused with an error the page shows (``ValueError``, ``CheckpointError`` or
``OSError``: a one-line message, as the page shows it, that never echoes a long value), or accepted, when it
reaches the sampler or the streamer, where the fuzz stops it (:class:`Reached`). A value that is no number for a
number field is never accepted, and neither is a missing or negative page number.

Then the live server on loopback, over raw HTTP: seeded uploads (empty files and not, one or many, on every route)
are all refused and leave no file; every handler the page does not call itself is refused by number and by name,
and a page handler given another number of values than it takes, in one line without a traceback; and another
client that sends a session's hash cannot end or steer that session's stream.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import socket
import tempfile
import time
from pathlib import Path

import pytest

from vgen.apps.gradio_app import (
    PAGE_FIELDS,
    SAMPLER_FIELDS,
    SAMPLING_FIELDS,
    InputError,
    ModelAccess,
    StreamSessions,
    build_app,
    generate,
    page_handlers,
    page_message,
    serve,
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
        return "refused", page_message(e)
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
    echoed = [k for k, v in fields.items() if len(str(v)) > 70 and str(v)[:70] in (message or "")]
    if echoed:
        return f"{shown}: the message echoes the long {echoed}: {message[:200]!r}"
    if re.search(r"\d{61}", message or ""):
        return f"{shown}: the message echoes a number of more than 60 digits: {message[:200]!r}"
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
        assert outcome == "refused" and message.startswith("unknown model ")
        answers.add(message.split("; ", 1)[1])  # all but the name, which is echoed (and cut when long)
    assert len(answers) == 1
    assert sorted(available_samplers())  # the registry the sampler field is checked against


# ---- the live server --------------------------------------------------------------------------------------------

httpx = pytest.importorskip("httpx")
gradio_client = pytest.importorskip("gradio_client")


@pytest.fixture(scope="module")
def server(access, models, tmp_path_factory):
    """The app served on a free loopback port, with Gradio's cache (``gradio``) and the temporary files a multipart
    body would be spooled to (``spool``) in folders of their own: (url, app, its stream sessions, the folder)."""
    temp = tmp_path_factory.mktemp("web")
    (temp / "spool").mkdir()
    sessions = StreamSessions()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRADIO_TEMP_DIR", str(temp / "gradio"))
        mp.setenv("GRADIO_HEARTBEAT_INTERVAL", "0.2")
        mp.setattr(tempfile, "tempdir", str(temp / "spool"))
        app = build_app(models["image"], 2, access, sessions)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        serve(app, port=port, prevent_thread_lock=True, quiet=True)
        try:
            yield f"http://127.0.0.1:{port}", app, sessions, temp
        finally:
            app.close()


def files_in(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


UPLOAD_ROUTES = ["/gradio_api/upload", "/gradio_api/upload/", "/upload", "/gradio_api/upload?upload_id=fuzz",
                 "/gradio_api/process_recording", "/gradio_api/component_server", "/gradio_api/queue/join",
                 "/gradio_api/run/predict", "/"]
UPLOADS = [b"", b"", b"x", b"\x00" * 1000, os.urandom(100_000)]


def test_every_upload_is_refused_and_nothing_is_stored(server) -> None:
    url, _, _, temp = server
    rng = random.Random(f"{SEED}-upload")
    for _ in range(int(os.environ.get("VGEN_FUZZ_WEB", 600)) // 10):
        route = rng.choice(UPLOAD_ROUTES)
        files = [("files", (rng.choice(["a.png", "../b.pt", "c", ""]), rng.choice(UPLOADS)))
                 for _ in range(rng.choice([1, 3, 50]))]
        answer = httpx.post(url + route, files=files, data={"session_hash": "fuzz"}, timeout=30)
        assert answer.status_code == 403 and "takes no uploads" in answer.json()["detail"], (route, answer.text[:200])
    for body in (b"", b"x" * 1000):  # a body that is not multipart, on the upload route
        answer = httpx.post(f"{url}/gradio_api/upload", content=body, headers={"content-type": "text/plain"})
        assert answer.status_code == 403
    assert not files_in(temp)  # neither Gradio's cache nor a spooled part


def test_a_handler_the_page_does_not_call_is_refused_by_number_and_by_name(server, monkeypatch) -> None:
    url, app, sessions, _ = server
    ended = []
    monkeypatch.setattr(sessions, "end", ended.append)
    page = page_handlers(app)
    private = sorted(set(app.fns) - set(page))
    assert private and not {"generate", "stream", "stop_stream", "switch_class"} - set(page.values())
    for number in [*private, -1, max(app.fns) + 1, 10**6, *map(str, private), *map(float, private)]:
        answer = httpx.post(f"{url}/gradio_api/queue/join", json={"data": [], "fn_index": number,
                                                                  "session_hash": "fuzz"})
        assert answer.status_code == 404 and "names no handler" in answer.json()["detail"], (number, answer.text)
        answer = httpx.post(f"{url}/gradio_api/run/generate", json={"data": [], "fn_index": number})
        assert answer.status_code == 404, (number, answer.text)
    for name in [*(app.fns[n].api_name for n in private), "nope", "x" * 10_000]:
        for route in ("call", "call/v2", "run", "api"):
            answer = httpx.post(f"{url}/gradio_api/{route}/{name}", json={"data": [], "session_hash": "fuzz"})
            assert answer.status_code == 404 and len(answer.text) < 200, (route, name[:20], answer.text[:200])
    assert ended == []  # the session's unload handler never ran
    stop = next(n for n, name in page.items() if name == "stop_stream")
    answer = httpx.post(f"{url}/gradio_api/queue/join", json={"data": [], "fn_index": stop, "session_hash": "fuzz"})
    assert answer.status_code == 200  # the page's own handlers go on, by number as the page calls them


def test_a_call_with_another_number_of_values_is_refused_in_one_line_without_a_traceback(server, capsys) -> None:
    url, app, _, _ = server
    rng = random.Random(f"{SEED}-values")
    for number, name in page_handlers(app).items():
        takes = len(app.fns[number].inputs)
        for count in {0, takes + 1, *(rng.randint(0, 3 * takes + 3) for _ in range(3))} - {takes}:
            data = [rng.choice(["", 0, None, "x", [1]]) for _ in range(count)]
            for route, body in (("queue/join", {"data": data, "fn_index": number, "session_hash": "fuzz"}),
                                (f"call/{name}", {"data": data})):
                answer = httpx.post(f"{url}/gradio_api/{route}", json=body)
                assert answer.status_code == 422, (route, count, answer.text[:200])
                assert answer.json()["detail"] == f"{name} takes {takes} values, got {count}"
    assert "Traceback" not in capsys.readouterr().err


def wait_for(condition, timeout: float = 60) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline and not condition():
        time.sleep(0.05)
    return condition()


def call_result(url: str, name: str, body: dict) -> object:
    """The final data of a call of ``name`` through Gradio's HTTP API."""
    posted = httpx.post(f"{url}/gradio_api/call/{name}", json=body)
    posted.raise_for_status()
    with httpx.stream("GET", f"{url}/gradio_api/call/{name}/{posted.json()['event_id']}", timeout=60) as answer:
        lines = [line for line in answer.iter_lines() if line.startswith("data: ")]
    return json.loads(lines[-1].removeprefix("data: "))


def test_another_client_with_a_sessions_hash_cannot_end_or_steer_its_stream(server, models) -> None:
    url, app, sessions, _ = server
    visitor = gradio_client.Client(url, verbose=False)
    job = visitor.submit(models["stream"], 0, 2000, 0, "1", "", api_name="/stream")
    try:
        assert wait_for(lambda: len(job.outputs()) >= 1), "no frames arrived"
        session = visitor.session_hash
        control = sessions.newest(session)
        unload = next(n for n in app.fns if n not in page_handlers(app) and app.fns[n].fn is not None)
        answer = httpx.post(f"{url}/gradio_api/queue/join", json={"data": [], "fn_index": unload,
                                                                  "session_hash": session})
        assert answer.status_code == 404
        answer = httpx.post(f"{url}/gradio_api/call/session_gone", json={"data": [], "session_hash": session})
        assert answer.status_code == 404
        with httpx.stream("GET", f"{url}/gradio_api/heartbeat/{session}", timeout=10) as heartbeat:
            assert heartbeat.status_code == 409  # closing a second heartbeat would end the session
        other = gradio_client.Client(url, verbose=False)
        assert other.predict(api_name="/stop_stream") == "no stream is running"
        assert other.predict(3, api_name="/switch_class") == "no stream is running"
        other.close()
        assert call_result(url, "stop_stream", {"data": []}) == ["no stream is running"]  # no session at all
        time.sleep(0.5)
        assert control is not None and not control.stopped and control.pending_switch() is None and not job.done()
        assert visitor.predict(api_name="/stop_stream") == "stopping"  # the session itself still can
        assert job.result(timeout=60)[1].startswith("stopped: ")
    finally:
        visitor.close()


def test_a_request_without_a_session_reaches_no_other_stream() -> None:
    sessions = StreamSessions()
    with sessions.running(None) as first, sessions.running(None) as second:
        assert sessions.stop(None) == "no stream is running" and sessions.switch(None, 1) == "no stream is running"
        sessions.end(None)
        assert not first.stopped and not second.stopped and sessions.count() == 2
