"""What a pipeline call takes, checked where it comes in: class ids or the class names a pipeline folder records
(``pipeline.json``'s ``class_names``), counts, seeds, generators, devices and dtypes. Each bad value gets one
specific ValueError, through the same :class:`~vgen.samplers.options.Option` check the sampling settings use."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from vgen.data.prompts import read_prompt_set
from vgen.samplers.options import Option, short_repr

ClassLabel = int | str  # a class id, or one of the pipeline's class names
MAX_SAMPLES = 10**7  # the most images, clips or frames a call or command asks for: far beyond an evaluation's
# count, yet a bound that keeps an absurd one (1e30) from building a list of that length before any work
SEED = Option("seed of the random generator", at_least=0, below=2**64)
COUNT = Option("how many to generate", at_least=1, at_most=MAX_SAMPLES)


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


def _scalar(x: Any) -> bool:
    """Whether ``x`` is a 0-d array or tensor (one class id, though it has ``__iter__``)."""
    return getattr(x, "ndim", None) == 0


def read_prompt_file(path: str | Path) -> list[str]:
    """The prompts of a text file, one a line (surrounding spaces stripped, blank lines skipped); a ValueError
    naming the file when it cannot be read, is not UTF-8 text, or holds no prompt. :mod:`vgen.data.prompts` reads
    it, as it reads the other prompt sets."""
    return list(read_prompt_set(path, "text").prompts)
