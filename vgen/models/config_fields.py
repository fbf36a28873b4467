"""Model and tokenizer configs, checked field by field through their declarations before any tensor is built.

Every config of a model or tokenizer (what a folder's ``config.json`` holds) is a frozen dataclass deriving from
:class:`ModelConfig`, and each of its fields is declared with :func:`declare` (or :func:`size` /
:func:`probability`): the annotation gives the type, the declaration the valid values, a range (``at_least`` /
``above`` / ``at_most`` / ``below``, met by every number a tuple field holds), the ``choices`` of a string, and how
many items a tuple has (``length``). :meth:`ModelConfig.__post_init__` checks every field against its declaration,
so the ``__post_init__`` of a config, which calls it first, checks only the relations between fields (``dim %
n_head == 0``...). Types are as JSON gives them and strict: an ``int`` field refuses ``8.0`` and ``True``, a
``float`` field takes an integer (stored as a float) but no bool, inf or nan, a tuple field takes a list (stored
as a tuple). A bad field is one ValueError naming it; :func:`vgen.hub.from_pretrained` adds the file.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass
from typing import Any, ClassVar, TypeVar

DECLARATION = "vgen.config_field"  # the metadata key of a declared field
SIZE_LIMIT = 1 << 24
"""The largest width, count or length a :func:`size` field holds (16,777,216): far above any model's, and small
enough that the shapes it gives stay within torch's integers, so that an absurd size is refused by name here and a
large one by the parameter limit of :func:`vgen.hub.from_pretrained`."""

ConfigT = TypeVar("ConfigT", bound="ModelConfig")


def is_int(x: Any) -> bool:
    """An integer (numpy's included), and not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def is_number(x: Any) -> bool:
    """A finite real number (numpy's included), and not a bool: inf, nan and an integer too large for a float are
    no setting's value."""
    if not isinstance(x, numbers.Real) or isinstance(x, bool):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an integer too large for a float
        return False


def short_repr(value: Any, limit: int = 40) -> str:
    """``repr(value)`` for a message, cut to ``limit`` characters (a message never echoes a long input whole)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


@dataclass(frozen=True, kw_only=True)
class Bounds:
    """The range of a declared number (``at_least`` / ``above`` / ``at_most`` / ``below``), which model configs and
    sampler options alike check and describe; a bound of at least ``powers_from`` that is a power of two reads
    ``2**n``."""

    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None
    below: float | None = None
    powers_from: ClassVar[int] = 2**16

    def bound_text(self, x: float) -> str:
        if is_int(x) and x >= self.powers_from and x & (x - 1) == 0:
            return f"2**{x.bit_length() - 1}"
        return str(x)

    def range_text(self) -> str:
        """The bounds as text: ``>= 0``, ``in (0, 1]``, ``in [1, 2**24]``, or empty when there are none."""
        lower = (("[", ">=", self.bound_text(self.at_least)) if self.at_least is not None
                 else ("(", ">", self.bound_text(self.above)) if self.above is not None else None)
        upper = (("]", "<=", self.bound_text(self.at_most)) if self.at_most is not None
                 else (")", "<", self.bound_text(self.below)) if self.below is not None else None)
        if lower and upper:
            return f"in {lower[0]}{lower[2]}, {upper[2]}{upper[0]}"
        bound = lower or upper
        return f"{bound[1]} {bound[2]}" if bound else ""

    def in_range(self, x: float) -> bool:
        return ((self.at_least is None or x >= self.at_least) and (self.above is None or x > self.above)
                and (self.at_most is None or x <= self.at_most) and (self.below is None or x < self.below))


@dataclass(frozen=True, kw_only=True)
class Declared(Bounds):
    """What a config field accepts besides its type: :class:`Bounds` for its numbers, ``choices`` for a string, and
    the fewest and most items of a tuple of any length (``length``; at least one unless told)."""

    choices: tuple[str, ...] | None = None
    length: tuple[int, int] = (1, SIZE_LIMIT)


def declare(default: Any = MISSING, **valid: Any) -> Any:
    """A config field with its valid values (keywords of :class:`Declared`); without ``default`` it is required."""
    if isinstance(valid.get("choices"), Sequence):
        valid["choices"] = tuple(valid["choices"])
    return dataclasses.field(default=default, metadata={DECLARATION: Declared(**valid)})


def size(default: Any = MISSING, at_least: int = 1, at_most: int = SIZE_LIMIT, **valid: Any) -> Any:
    """A width, count or length: an integer (each integer of a tuple) from ``at_least`` (1 unless told) to
    :data:`SIZE_LIMIT`."""
    return declare(default, at_least=at_least, at_most=at_most, **valid)


def probability(default: Any = MISSING) -> Any:
    """A dropout or a class-dropout rate: a number in [0, 1]."""
    return declare(default, at_least=0, at_most=1)


@functools.cache
def declarations(cls: type) -> dict[str, tuple[Any, Declared]]:
    """Each field of the config class ``cls`` with its type and declaration, in field order. A subclass that only
    changes a default keeps the declaration of the class that made the field. A field without a declaration is a
    TypeError: every config field is checked."""
    hints = typing.get_type_hints(cls)  # the modules use postponed annotations
    found = {}
    for f in dataclasses.fields(cls):
        spec = next((fields[f.name].metadata[DECLARATION] for klass in cls.__mro__
                     if f.name in (fields := getattr(klass, "__dataclass_fields__", {}))
                     and DECLARATION in fields[f.name].metadata), None)
        if spec is None:
            raise TypeError(f"{cls.__name__}.{f.name} has no declaration: declare it with vgen.models.config_fields")
        found[f.name] = (hints[f.name], spec)
    return found


def _kind_text(kind: Any, spec: Declared) -> str:
    """What a value of ``kind`` must be, for a message: ``an integer >= 1``, ``a finite number in [0, 1]``."""
    bounds = spec.range_text()
    if kind is int:
        return " ".join(filter(None, ["an integer", bounds]))
    if kind is float:
        return " ".join(filter(None, ["a finite number", bounds]))
    if kind is bool:
        return "true or false"
    return f"one of {list(spec.choices)}" if spec.choices is not None else "a string"


def checked(name: str, value: Any, kind: Any, spec: Declared) -> Any:
    """``value`` as the field ``name`` of type ``kind`` stores it, or a ValueError naming the field (an item of a
    tuple as ``name[i]``)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (types.UnionType, typing.Union):  # X | None
        if value is None:
            return None
        (kind,) = [a for a in args if a is not type(None)]
        return checked(name, value, kind, spec)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{name} must be a list, got {short_repr(value)}")
        variable = len(args) == 2 and args[1] is Ellipsis
        lo, hi = spec.length if variable else (len(args), len(args))
        if not lo <= len(value) <= hi:
            count = f"{lo}" if lo == hi else f"{lo} to {hi}" if hi < SIZE_LIMIT else f"at least {lo}"
            raise ValueError(f"{name} must hold {count} item(s), got {short_repr(value)}")
        kinds = [args[0]] * len(value) if variable else args
        return tuple(checked(f"{name}[{i}]", v, k, spec) for i, (v, k) in enumerate(zip(value, kinds)))
    if kind is bool:
        valid = isinstance(value, bool)
    elif kind is str:
        valid = isinstance(value, str) and (spec.choices is None or value in spec.choices)
    elif kind in (int, float):
        valid = (is_int(value) if kind is int else is_number(value)) and spec.in_range(value)
    else:
        raise TypeError(f"{name}: no check for fields of type {kind}")
    if not valid:
        raise ValueError(f"{name} must be {_kind_text(kind, spec)}, got {short_repr(value)}")
    return kind(value) if kind in (int, float) else value


def _plain(value: Any) -> Any:
    """A field's value in JSON's types (tuples as lists)."""
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class ModelConfig:
    """The base of every model and tokenizer config: checks each declared field on construction (a subclass's
    ``__post_init__`` calls this first, then checks its relations) and round-trips through JSON."""

    def __post_init__(self) -> None:
        for name, (kind, spec) in declarations(type(self)).items():
            value = getattr(self, name)
            stored = checked(name, value, kind, spec)
            if stored is not value:
                object.__setattr__(self, name, stored)

    def to_dict(self) -> dict:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls: type[ConfigT], d: Mapping[str, Any]) -> ConfigT:
        """The config of the JSON object ``d``; a ValueError names the fields it lacks or does not know."""
        if not isinstance(d, Mapping):
            raise ValueError(f"a {cls.__name__} is an object of its fields, got {type(d).__name__}")
        fields = dataclasses.fields(cls)
        unknown = sorted(set(d) - {f.name for f in fields})
        if unknown:
            raise ValueError(f"unknown {cls.__name__} field(s) {short_repr(unknown, 200)}; expected some of "
                             f"{[f.name for f in fields]}")
        missing = [f.name for f in fields if f.name not in d and f.default is MISSING]
        if missing:
            raise ValueError(f"{cls.__name__} needs the field(s) {missing}")
        return cls(**d)
