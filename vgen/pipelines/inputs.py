"""What a pipeline call takes, checked where it comes in: class ids or the class names a pipeline folder records
(``pipeline.json``'s ``class_names``), prompts, counts, batch sizes, the size of what a call returns, seeds,
generators, devices and dtypes. Each bad value gets one specific ValueError, through the same
:class:`~vgen.samplers.options.Option` check the sampling settings use."""

from __future__ import annotations

import operator
import unicodedata
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from vgen.data.prompts import read_prompt_set
from vgen.samplers.options import Option, short_repr
from vgen.samplers.streaming import check_switch_frames

ClassLabel = int | str  # a class id, or one of the pipeline's class names
SwitchTarget = ClassLabel | list[ClassLabel]  # a stream switch's class or prompt: one for all streams, or one each
MAX_SAMPLES = 10**7  # the most images, clips or frames a call or command asks for: far beyond an evaluation's
# count, yet a bound that keeps an absurd one (1e30) from building a list of that length before any work
SEED = Option("seed of the random generator", at_least=0, below=2**64)
COUNT = Option("how many to generate", at_least=1, at_most=MAX_SAMPLES)
DEFAULT_BATCH_SIZE = 64  # images or clips a pipeline draws at once unless told otherwise (its ``batch_size``): the
# largest batch vgen's own tools ask for by default (`vgen quality`), so their calls draw in one chunk
BATCH_SIZE = Option("images or clips drawn at once; a larger request is drawn in chunks of this many", at_least=1,
                    at_most=MAX_SAMPLES)
MAX_OUTPUT_BYTES = 4 * 2**30  # the most pixel bytes (uint8 RGB) one pipeline call returns; more goes to disk with
# `vgen sample-many`, which writes each batch as it is drawn


class ControlCharactersWarning(UserWarning):
    """A prompt held control characters (line breaks, tabs, NUL, escapes...), which were taken out of it."""


def check_prompts(prompt: Any, name: str = "prompt", many: bool = True) -> list[str]:
    """The one rule for prompts, at every entry point (the Python API, ``vgen sample --prompt``, the web demo): a
    string, or with ``many`` a non-empty list (any iterable but bytes) of strings; anything else, and a prompt that
    is empty or only spaces, is a ValueError naming ``name``. Control characters are taken out, each run of them
    becoming one space when it separates words, with a :class:`ControlCharactersWarning`. Returns the prompts as a
    list."""
    kinds = "a string or a list of strings" if many else "a string"
    if isinstance(prompt, str):
        prompts = [prompt]
    elif many and isinstance(prompt, Iterable) and not isinstance(prompt, (bytes, bytearray, dict)):
        prompts = list(prompt)
        if not prompts:
            raise ValueError(f"the {name} list is empty: give at least one prompt")
    else:
        raise ValueError(f"{name} must be {kinds}, got {_type_of(prompt)}")
    single = isinstance(prompt, str)
    cleaned = []
    for i, text in enumerate(prompts):
        where = name if single else f"{name}[{i}]"
        if not isinstance(text, str):
            raise ValueError(f"{name} must be {kinds}, got {_type_of(text)}" + ("" if single else f" at {where}"))
        clean = _without_control_characters(text)
        if not clean.strip():
            raise ValueError(f"{where} is empty: give the text of what to draw")
        if clean != text:
            warnings.warn(f"{where}: took out {sum(_is_control(c) for c in text)} control characters",
                          ControlCharactersWarning, stacklevel=2)
        cleaned.append(clean)
    return cleaned


def _type_of(value: Any) -> str:
    """A value's type for a message; bytes get a hint, since a prompt must be decoded text."""
    kind = type(value).__name__
    return f"{kind} (decode it to str)" if isinstance(value, (bytes, bytearray)) else kind


def _is_control(c: str) -> bool:
    return unicodedata.category(c) == "Cc"


def _without_control_characters(text: str) -> str:
    """``text`` with its control characters out: a run of them between two other characters becomes one space
    (a line break between words), elsewhere nothing."""
    if not any(_is_control(c) for c in text):
        return text
    out, gap = [], False
    for c in text:
        if _is_control(c):
            gap = True
            continue
        if gap and out and not out[-1].isspace() and not c.isspace():
            out.append(" ")
        gap = False
        out.append(c)
    return "".join(out)


def check_batch_size(batch_size: Any) -> None:
    """Raise a ValueError unless ``batch_size`` is an integer in [1, :data:`MAX_SAMPLES`]."""
    BATCH_SIZE.check("batch_size", batch_size, int)


def check_output_size(count: int, frames: int, side: int, what: str = "images") -> None:
    """Raise a ValueError, pointing to ``vgen sample-many``, when ``count`` outputs of ``frames`` uint8 RGB frames of
    ``side`` x ``side`` pixels take more than :data:`MAX_OUTPUT_BYTES`: a call returns them all in memory."""
    size = count * frames * side * side * 3
    if size > MAX_OUTPUT_BYTES:
        raise ValueError(f"{count} {what} of {side}x{side} pixels take {size / 2**30:.1f} GiB, more than the "
                         f"{MAX_OUTPUT_BYTES / 2**30:.0f} GiB one call returns (MAX_OUTPUT_BYTES): draw them to disk "
                         f"in batches with `vgen sample-many`")


def check_seed(seed: Any) -> None:
    """Raise a ValueError unless ``seed`` is an integer a ``torch.Generator`` takes (None: the pipelines' 0)."""
    if seed is not None:
        SEED.check("seed", seed, int)


def check_device(device: Any) -> torch.device:
    """``device`` (a name such as ``cpu``, ``cuda:1``, ``mps``, or a ``torch.device``) as a ``torch.device``; a
    ValueError naming it when torch does not know it or this machine does not have it (no CUDA, too few GPUs)."""
    if not isinstance(device, (str, torch.device)):
        raise ValueError(f"device must be a name such as cpu, cuda, cuda:1 or mps, got {short_repr(device)} "
                         f"({type(device).__name__})")
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise ValueError(f"unknown device {short_repr(device)}: use cpu, cuda, cuda:1, mps ...") from None
    backend = torch.backends.mps if parsed.type == "mps" else getattr(torch, parsed.type, None)
    if parsed.type != "cpu" and not getattr(backend, "is_available", lambda: False)():
        raise ValueError(f"device {parsed}: this machine has no {parsed.type} device (torch sees none)")
    if parsed.index is not None and hasattr(backend, "device_count") and parsed.index >= backend.device_count():
        raise ValueError(f"device {parsed}: this machine has {backend.device_count()} {parsed.type} devices "
                         f"(0..{backend.device_count() - 1})")
    return parsed


def check_dtype(dtype: Any) -> None:
    """Raise a ValueError unless ``dtype`` is None (keep the weights' own) or a floating-point ``torch.dtype``."""
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a torch floating-point dtype such as torch.bfloat16 (or None), got "
                         f"{short_repr(dtype)}")


def check_generator(generator: Any, device: torch.device) -> None:
    """Raise a ValueError unless ``generator`` is None or a ``torch.Generator`` on the pipeline's ``device``."""
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator (or None: a fresh one seeded with seed), got "
                         f"{short_repr(generator)} ({type(generator).__name__})")
    if generator.device.type != device.type:
        raise ValueError(f"generator is on {generator.device}, the pipeline on {device}: make it with "
                         f"torch.Generator({str(device)!r})")


def check_count(name: str, value: Any) -> None:
    """Raise a ValueError naming ``name`` unless ``value`` is an integer in [1, :data:`MAX_SAMPLES`]."""
    COUNT.check(name, value, int)


class ClassConditional:
    """Class ids and class names of a class-conditional pipeline, which has ``info`` (a
    :class:`~vgen.pipelines.PipelineInfo`) and ``num_classes``."""

    def class_name(self, class_id: int) -> str:
        """The name of ``class_id``, or the id as text when the pipeline records no names."""
        names = self.info.class_names
        return names[class_id] if names and 0 <= class_id < len(names) else str(class_id)

    def check_class_ids(self, class_ids: Iterable[int]) -> None:
        """Raise a ValueError unless every id is one of the model's classes."""
        for c in class_ids:
            if not 0 <= int(c) < self.num_classes:
                raise ValueError(f"class id {short_repr(int(c))} is out of range for {self.info.name} with "
                                 f"{self.num_classes} classes (valid: 0..{self.num_classes - 1})")

    def class_id(self, label: Any) -> int:
        """The class id of ``label``: a class id (an integer, numpy's or a 0-d tensor's included), or one of the
        pipeline's class names."""
        if isinstance(label, str):
            names = self.info.class_names or []
            if label not in names:
                listed = f"classes: {', '.join(names)}" if names else "it records no class names: give class ids"
                raise ValueError(f"unknown class {short_repr(label)} for {self.info.name}; {listed} "
                                 f"(or ids 0..{self.num_classes - 1})")
            class_id = names.index(label)
        else:
            try:
                if isinstance(label, bool) or str(getattr(label, "dtype", "")) in ("bool", "torch.bool"):
                    raise TypeError  # True is not class 1
                if getattr(label, "ndim", 0) != 0:
                    raise TypeError  # an array of one id is not an id
                class_id = operator.index(label)
            except TypeError:
                raise ValueError(f"a class must be an integer id or a class name, got {short_repr(label)} "
                                 f"({type(label).__name__})") from None
        self.check_class_ids([class_id])
        return class_id

    def class_list(self, class_ids: Sequence[ClassLabel] | ClassLabel | None, count: int | None = None,
                   count_name: str = "num_images") -> list[int]:
        """The class id of every sample asked for: every class in turn when ``class_ids`` is None, the given ids or
        names (one, or a list) otherwise, repeated in turn to ``count`` (named ``count_name`` in messages) when
        given. A string is one class name, never a list of ids."""
        if count is not None:
            check_count(count_name, count)
        if class_ids is None:
            ids = list(range(self.num_classes))
        elif isinstance(class_ids, (str, bytes)) or not isinstance(class_ids, Iterable) or _scalar(class_ids):
            ids = [self.class_id(class_ids)]
        else:
            ids = [self.class_id(c) for c in class_ids]
        if not ids:
            raise ValueError("class_ids is empty: give at least one class id or name (None: every class)")
        return ids if count is None else [ids[i % len(ids)] for i in range(count)]



def check_switches(switches: Mapping[int, Any] | Sequence[tuple[int, Any]], num_frames: int) -> list[tuple[int, Any]]:
    """The (frame, target) pairs of a stream's switches (a ``{frame: target}`` mapping or a sequence of pairs), in
    the order given: each frame an integer inside the stream and the frames strictly increasing as given (never
    sorted: a switch out of order is a mistake to report; :func:`~vgen.samplers.streaming.check_switch_frames`),
    and a prompt target non-blank (control characters taken out, as :func:`check_prompts` does). A target is one
    for every stream or a list of one per stream. Each bad switch is a ValueError naming it. What a target may be
    (a class or a prompt) is the model's to say."""
    if isinstance(switches, Mapping):
        pairs = list(switches.items())
    elif isinstance(switches, Iterable) and not isinstance(switches, (str, bytes)):
        pairs = list(switches)
    else:
        raise ValueError(f"switches must be a {{frame: target}} mapping or (frame, target) pairs, got "
                         f"{type(switches).__name__}")
    checked: list[tuple[int, Any]] = []
    for i, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"switches[{i}] must be a (frame, target) pair, got {short_repr(pair)}")
        frame, target = pair
        try:
            if isinstance(frame, bool):
                raise TypeError
            frame = operator.index(frame)
        except TypeError:
            raise ValueError(f"switches[{i}]: the frame must be an integer, got {short_repr(frame)}") from None
        checked.append((frame, target))
    check_switch_frames([frame for frame, _ in checked], num_frames)

    def cleaned(frame: int, target: Any) -> Any:
        return (check_prompts(target, f"the prompt of the switch at frame {frame}", many=False)[0]
                if isinstance(target, str) else target)

    return [(frame, [cleaned(frame, t) for t in target] if isinstance(target, (list, tuple)) else
             cleaned(frame, target)) for frame, target in checked]

def _scalar(x: Any) -> bool:
    """Whether ``x`` is a 0-d array or tensor (one class id, though it has ``__iter__``)."""
    return getattr(x, "ndim", None) == 0


def read_prompt_file(path: str | Path) -> list[str]:
    """The prompts of a text file, one a line (surrounding spaces stripped, blank lines skipped); a ValueError
    naming the file when it cannot be read, is not UTF-8 text, or holds no prompt. :mod:`vgen.data.prompts` reads
    it, as it reads the other prompt sets."""
    return list(read_prompt_set(path, "text").prompts)
