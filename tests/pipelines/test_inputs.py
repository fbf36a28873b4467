"""The pipelines' call boundary: class ids or class names, counts, seeds and sampling settings are checked where
they come in, each bad value with one specific message; nothing is silently converted (a string is a class name,
not a list of ids; 1.7 and True are not class 1)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import vgen
from vgen.pipelines import ImagePipeline, PipelineInfo, StreamPipeline, VideoPipeline
from vgen.pipelines.inputs import ControlCharactersWarning, check_prompts, read_prompt_file


@pytest.fixture(scope="module")
def pipe(tiny_pipeline_dir) -> ImagePipeline:
    return vgen.load(tiny_pipeline_dir)


@pytest.fixture(scope="module")
def stream_pipe(tiny_stream_pipeline_dir) -> StreamPipeline:
    return vgen.load(tiny_stream_pipeline_dir)


def test_class_names_work_wherever_ids_do(pipe) -> None:
    assert pipe.class_list(["c", 0, "a"]) == [2, 0, 0]
    assert pipe.class_list("b", 3) == [1, 1, 1]
    assert pipe.class_list([np.int64(2), torch.tensor(1), torch.tensor([0])[0]]) == [2, 1, 0]
    assert pipe.class_list(None) == [0, 1, 2] and pipe.class_list(torch.tensor(1)) == [1]
    named, numbered = pipe(["c", "a"], seed=0), pipe([2, 0], seed=0)
    assert named.class_ids == [2, 0] and torch.equal(named.tokens, numbered.tokens)


@pytest.mark.parametrize("class_ids, message", [
    ("12", "unknown class '12' for tiny; classes: a, b, c (or ids 0..2)"),
    (["a", "z"], "unknown class 'z' for tiny; classes: a, b, c (or ids 0..2)"),
    ([1.7], "a class must be an integer id or a class name, got 1.7 (float)"),
    (1.0, "a class must be an integer id or a class name, got 1.0 (float)"),
    (True, "a class must be an integer id or a class name, got True (bool)"),
    ([False], "a class must be an integer id or a class name, got False (bool)"),
    (np.array([True]), "a class must be an integer id or a class name, got np.True_ (bool)"),
    (torch.tensor([1.0]), "a class must be an integer id or a class name, got tensor(1.) (Tensor)"),
    ([b"a"], "a class must be an integer id or a class name, got b'a' (bytes)"),
    ([[1, 2]], "a class must be an integer id or a class name, got [1, 2] (list)"),
    ([3], "class id 3 is out of range for tiny with 3 classes (valid: 0..2)"),
    ([np.int64(5)], "class id 5 is out of range for tiny with 3 classes (valid: 0..2)"),
    ([10**300], "class id 1000000000000000000000000000000000000000... (301 characters) is out of range for tiny"),
    (torch.tensor([[1]]), "a class must be an integer id or a class name, got tensor([1]) (Tensor)"),
    ([], "class_ids is empty: give at least one class id or name"),
])
def test_a_bad_class_is_refused_with_what_was_wrong(pipe, class_ids, message) -> None:
    with pytest.raises(ValueError) as caught:
        pipe(class_ids)
    assert str(caught.value).startswith(message)


def test_names_of_a_pipeline_that_records_none_are_refused_with_the_ids_to_use(pipe) -> None:
    unnamed = ImagePipeline(pipe.model, pipe.tokenizer, PipelineInfo(name="ids-only", image_size=16))
    with pytest.raises(ValueError, match=r"^unknown class 'a' for ids-only; it records no class names: give class "
                                         r"ids \(or ids 0..2\)$"):
        unnamed("a")
    assert unnamed.class_list([1]) == [1]


@pytest.mark.parametrize("kwargs, message", [
    ({"class_ids": [], "num_images": 2}, "class_ids is empty"),
    ({"num_images": 0}, "num_images must be an integer in [1, 10000000], got 0"),
    ({"num_images": 2.0}, "num_images must be an integer in [1, 10000000], got 2.0"),
    ({"num_images": True}, "num_images must be an integer in [1, 10000000], got True"),
    ({"num_images": 10**30}, "num_images must be an integer in [1, 10000000], got 1" + "0" * 30),
    ({"seed": -1}, "seed must be an integer in [0, 2**64), got -1"),
    ({"seed": "1"}, "seed must be an integer in [0, 2**64), got '1'"),
    ({"seed": 2**64}, "seed must be an integer in [0, 2**64)"),
    ({"cfg_scale": math.inf}, "cfg_scale must be a finite number in [0, 100.0] (guidance only above 1), got inf"),
    ({"cfg_scale": 1e309}, "cfg_scale must be a finite number in [0, 100.0]"),
    ({"cfg_scale": "4"}, "cfg_scale must be a number in [0, 100.0] (guidance only above 1), got '4'"),
    ({"temperature": math.nan}, "temperature must be a finite number in [0, 100] (0 = greedy), got nan"),
    ({"top_p": -math.inf}, "top_p must be a finite number in (0, 1] (1 = off), got -inf"),
    ({"top_k": math.inf}, "top_k must be an integer in [0, 262144] (0 = off), got inf"),
    ({"top_k": 2.5}, "top_k must be an integer in [0, 262144] (0 = off), got 2.5"),
    ({"sampler": "lantern", "lantern_delta": math.nan}, "lantern_delta must be a finite number"),
    ({"sampler": ["ar"]}, "sampler must be a registered name, a to_dict mapping or a Sampler, got ['ar'] (list)"),
    ({"sampler": "s" * 1000}, "unknown sampler 'sssss"),
    ({"generator": "x"}, "generator must be a torch.Generator (or None: a fresh one seeded with seed), got 'x'"),
    ({"class_ids": torch.tensor([[1]])}, "a class must be an integer id or a class name, got tensor([1])"),
])
def test_counts_seeds_and_sampling_settings_are_checked_before_sampling(pipe, kwargs, message) -> None:
    with pytest.raises(ValueError) as caught:
        pipe(**{"class_ids": [0], **kwargs})
    assert str(caught.value).startswith(message)


def test_numpy_numbers_are_numbers(pipe) -> None:
    out = pipe([0], num_images=np.int64(2), seed=np.int64(3), cfg_scale=np.float32(2.0), top_k=np.int64(4))
    assert len(out.images) == 2


def test_prompts_must_be_text(tiny_janus_dir) -> None:
    t2i = vgen.load(tiny_janus_dir)
    for prompt, kind in ((["a cat", 3], "int at prompt\\[1\\]"), (7, "int"), (b"a cat", "bytes \\(decode it to str\\)"),
                         ([b"a cat"], "bytes \\(decode it to str\\) at prompt\\[0\\]")):
        with pytest.raises(ValueError, match=f"^prompt must be a string or a list of strings, got {kind}$"):
            t2i(prompt=prompt)


# ---- prompts: one rule (check_prompts) for the Python API, `vgen sample --prompt` and the web demo ---------------
@pytest.mark.parametrize(("prompt", "message"), [
    ("", "prompt is empty: give the text of what to draw"),
    ("  \t\n", "prompt is empty: give the text of what to draw"),
    ([""], "prompt[0] is empty: give the text of what to draw"),
    (["a cat", "\x00"], "prompt[1] is empty: give the text of what to draw"),
    ([], "the prompt list is empty: give at least one prompt"),
    (b"a red star", "prompt must be a string or a list of strings, got bytes (decode it to str)"),
    (-1, "prompt must be a string or a list of strings, got int"),
    (True, "prompt must be a string or a list of strings, got bool"),
    ([1, 2], "prompt must be a string or a list of strings, got int at prompt[0]"),
    (["a cat", None], "prompt must be a string or a list of strings, got NoneType at prompt[1]"),
    ({"a": "b"}, "prompt must be a string or a list of strings, got dict"),
])
def test_empty_and_non_string_prompts_are_refused_by_name(prompt, message) -> None:
    with pytest.raises(ValueError) as caught:
        check_prompts(prompt)
    assert str(caught.value) == message


def test_control_characters_are_taken_out_with_a_warning() -> None:
    with pytest.warns(ControlCharactersWarning, match="prompt\\[1\\]: took out 3 control characters"):
        assert check_prompts(["a cat", "a red\tstar\x00\n"]) == ["a cat", "a red star"]
    with pytest.warns(ControlCharactersWarning, match="^prompt: took out 2"):
        assert check_prompts("\x1b[a] \x7fring") == ["[a] ring"]
    assert check_prompts(("a cat", "  a dog ")) == ["a cat", "  a dog "]  # nothing else changes
    with pytest.raises(ValueError, match="^the page's prompt must be a string, got list$"):
        check_prompts(["a cat"], "the page's prompt", many=False)


def test_every_entry_point_refuses_an_empty_or_non_string_prompt(tiny_t2i_pipeline_dir, tmp_path, capsys) -> None:
    from vgen.apps.cli import main
    from vgen.apps.gradio_app import InputError, page_condition

    t2i = vgen.load(tiny_t2i_pipeline_dir)
    for prompt in ("", [""], " ", ["a red star", ""]):  # the Python API
        with pytest.raises(ValueError, match="is empty: give the text of what to draw"):
            t2i(prompt=prompt)
    with pytest.warns(ControlCharactersWarning):
        assert t2i(prompt="a red\nstar").prompts == ["a red star"]
    out = str(tmp_path / "x.png")  # the command line
    assert main(["sample", "--model", str(tiny_t2i_pipeline_dir), "--prompt", "a red star", "--prompt", " ",
                 "--out", out]) == 2
    assert capsys.readouterr().err.strip() == "vgen: error: --prompt is empty: give the text of what to draw"
    for value, kind in ((-1, "int"), ([1, 2], "list"), (True, "bool"), (["a red star"], "list")):  # the web demo
        with pytest.raises(ValueError, match=f"^prompt must be a string, got {kind}$"):
            page_condition(t2i, None, value)
    with pytest.raises(InputError, match="the prompt is empty"):
        page_condition(t2i, None, "")
    assert page_condition(t2i, None, "a red star") == {"prompt": "a red star"}


def test_a_video_pipeline_names_its_own_count(tiny_video_pipeline_dir) -> None:
    video = vgen.load(tiny_video_pipeline_dir)
    assert isinstance(video, VideoPipeline)
    with pytest.raises(ValueError, match="^num_videos must be an integer in \\[1, 10000000\\], got 0$"):
        video(["a"], num_videos=0)
    with pytest.raises(ValueError, match="^unknown class 'star' for tiny-video; classes: a, b, c"):
        video("star")


def test_a_stream_takes_class_names_and_checks_its_arguments_before_the_first_block(stream_pipe) -> None:
    by_name, by_id = stream_pipe(["c", "a"], num_frames=2, seed=0), stream_pipe([2, 0], num_frames=2, seed=0)
    assert by_name.class_ids == [2, 0] and np.array_equal(by_name.videos, by_id.videos)
    assert len(next(iter(stream_pipe.stream("b", num_frames=2)))) == 2
    for call, message in [
        (lambda: stream_pipe.stream_blocks("12"), "unknown class '12' for tiny-stream"),
        (lambda: stream_pipe.stream_blocks([True]), "a class must be an integer id or a class name, got True"),
        (lambda: stream_pipe.stream_blocks([0], num_frames=0), "num_frames must be an integer in [1, 10000000], got 0"),
        (lambda: stream_pipe.stream_blocks([0], num_frames=2.5),
         "num_frames must be an integer in [1, 10000000], got 2.5"),
        (lambda: stream_pipe.stream_blocks([0], seed=1.5), "seed must be an integer in [0, 2**64), got 1.5"),
        (lambda: stream_pipe.stream_blocks([0], cfg_scale=math.inf), "cfg_scale must be a finite number in [0, 100.0]"),
        (lambda: stream_pipe([], num_frames=2), "class_ids is empty"),
        (lambda: stream_pipe.stream_blocks([0], control="stop"), "control must be a StreamControl (or None), got str"),
    ]:
        with pytest.raises(ValueError) as caught:
            call()
        assert str(caught.value).startswith(message)


@pytest.mark.parametrize("device, message", [
    ("nope", "unknown device 'nope': use cpu, cuda, cuda:1, mps ..."),
    (3, "device must be a name such as cpu, cuda, cuda:1 or mps, got 3 (int)"),
    ("cuda" if not torch.cuda.is_available() else "cuda:999", "device cuda"),
])
def test_load_refuses_a_device_torch_does_not_know_or_this_machine_lacks(tiny_pipeline_dir, device, message) -> None:
    with pytest.raises(ValueError) as e:
        vgen.load(tiny_pipeline_dir, device=device)
    assert str(e.value).startswith(message)


def test_a_prompt_file_is_read_one_prompt_a_line_without_blank_lines(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("\n  a red star  \n\n\ta blue ring\r\n   \n")
    assert read_prompt_file(path) == ["a red star", "a blue ring"]
    path.write_text("\n \n")
    with pytest.raises(ValueError, match=f"prompt file {path} holds no prompts: write one prompt a line"):
        read_prompt_file(path)
    path.write_bytes(b"a red \xff star\n")
    with pytest.raises(ValueError, match=f"prompt file {path} is not UTF-8 text"):
        read_prompt_file(path)
    with pytest.raises(ValueError, match=f"cannot read prompt file {tmp_path / 'missing.txt'}: No such file"):
        read_prompt_file(tmp_path / "missing.txt")
