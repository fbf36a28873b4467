"""Options declared once: a config dataclass's fields carry their help text and valid values, and everything
else is built from that declaration.

A field declared with :func:`option` holds an :class:`Option` in its metadata. :func:`check_options` validates an
instance against it (called from the dataclass's ``__post_init__``; checks that involve several fields stay
there), :func:`declared_options` lists the options of one or more classes for the command line's flags and the
web demo's fields, :func:`parse_option` reads an option's value from text (``vgen bench`` specs, the web demo's
text boxes), and :func:`merge_settings` lays what a user set over a pipeline's recommended defaults.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from vgen.models.config_fields import Bounds, is_int, is_number, short_repr

OPTION = "vgen.option"  # the metadata key of a declared field
TRUE_WORDS, FALSE_WORDS = ("true", "yes", "on"), ("false", "no", "off")


@dataclass(frozen=True)
class Option(Bounds):
    """What a field accepts: :class:`~vgen.models.config_fields.Bounds` for a number, a set of ``choices`` (or a
    function giving them, for a registry) for a string, and a ``note`` that the error message adds (e.g. ``0 =
    greedy``). ``unknown`` names what a string picks (``acceptance rule``) for the message ``unknown acceptance
    rule 'x'; available: ...``. Bounds read ``2**n`` from 2**32 on (a seed's range)."""

    help: str
    choices: Sequence[str] | Callable[[], Sequence[str]] | None = None
    note: str | None = None
    unknown: str | None = None
    powers_from: ClassVar[int] = 2**32

    def allowed(self) -> list[str] | None:
        """The accepted strings, or None when any is."""
        if self.choices is None:
            return None
        return list(self.choices() if callable(self.choices) else self.choices)

    def check(self, name: str, value: Any, kind: Any) -> None:
        """Raise a ValueError naming ``name`` unless ``value`` is a valid ``kind`` (int, float, str, bool)."""
        choices = self.allowed()
        if choices is not None:
            if isinstance(value, str) and value in choices:
                return
            if self.unknown:
                raise ValueError(f"unknown {self.unknown} {short_repr(value)}; available: {', '.join(choices)}")
            raise ValueError(f"{name} must be one of {choices}, got {short_repr(value)}")
        if kind is bool and not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, got {short_repr(value)}")
        valid_number = is_int(value) if kind is int else is_number(value)
        if kind in (int, float) and not (valid_number and self.in_range(value)):
            what = ("an integer" if kind is int else "" if valid_number
                    else "a finite number" if isinstance(value, numbers.Real) and not isinstance(value, bool)
                    else "a number")
            bounds = " ".join(filter(None, [what, self.range_text()]))
            note = f" ({self.note})" if self.note else ""
            raise ValueError(f"{name} must be {bounds}{note}, got {short_repr(value)}")

    def describe(self, default: str | None = None) -> str:
        """The help text with the valid values and what a special value means (``0 = off``), as the command line
        and the web demo show it; ``default`` adds what an unset option stands for."""
        extra = [self.range_text()] if self.range_text() else []
        choices = self.allowed()
        if choices is not None:
            extra.append(f"one of: {', '.join(choices)}")
        extra += [text for text in (self.note, default and f"default: {default}") if text]
        return f"{self.help} ({'; '.join(extra)})" if extra else self.help


def option(default: Any, help: str, **valid: Any) -> Any:
    """A dataclass field with its help text and valid values (keywords of :class:`Option`)."""
    return dataclasses.field(default=default, metadata={OPTION: Option(help, **valid)})


@dataclass(frozen=True)
class DeclaredOption:
    """One declared field as the front ends see it: its name, value type (``bool | str`` for a union), the
    declaration, and the class's default."""

    name: str
    kind: Any
    spec: Option
    default: Any

    @property
    def flag(self) -> str:
        """The command-line flag: ``--kebab-name``."""
        return "--" + self.name.replace("_", "-")

    @property
    def help(self) -> str:
        return self.spec.describe()


@functools.cache
def declarations(cls: type) -> dict[str, DeclaredOption]:
    """The declared fields of the dataclass ``cls``, in field order, with ``cls``'s defaults. A subclass that only
    changes a default (a preset such as ``lantern``) keeps the declaration of the class that made the field."""
    hints = typing.get_type_hints(cls)  # the modules use postponed annotations
    found = {}
    for f in dataclasses.fields(cls):
        spec = next((fields[f.name].metadata[OPTION] for klass in cls.__mro__
                     if f.name in (fields := getattr(klass, "__dataclass_fields__", {}))
                     and OPTION in fields[f.name].metadata), None)
        if spec is not None:
            found[f.name] = DeclaredOption(f.name, hints[f.name], spec, f.default)
    return found


def check_options(obj: Any) -> None:
    """Validate every declared field of the dataclass instance ``obj`` (a ValueError names the first bad one), and
    store a numpy number as the plain ``int`` / ``float`` its field declares."""
    for name, declared in declarations(type(obj)).items():
        value = getattr(obj, name)
        declared.spec.check(name, value, declared.kind)
        if declared.kind in (int, float) and type(value) is not declared.kind:
            object.__setattr__(obj, name, declared.kind(value))


def declared_options(classes: Iterable[type], exclude: Iterable[str] = ()) -> list[DeclaredOption]:
    """The declared fields of ``classes`` in declaration order, each name once (the first class that has it
    gives its default), without ``exclude``. A name declared differently by two classes is an error: a name
    means one thing."""
    found: dict[str, DeclaredOption] = {}
    skip = set(exclude)
    for cls in classes:
        for name, declared in declarations(cls).items():
            if name in skip:
                continue
            seen = found.setdefault(name, declared)
            if (seen.kind, seen.spec) != (declared.kind, declared.spec):
                raise TypeError(f"option {name!r} is declared differently by {cls.__name__}")
    return list(found.values())


def parse_option(name: str, text: str, kind: Any) -> Any:
    """``text`` read as a value of ``kind``: a finite number for int / float (an int must be whole), ``true`` /
    ``false`` for a bool (a ``bool | str`` takes any other word as the string), the text itself for a string. A
    ValueError names ``name`` when the text is not of that kind; the range is checked where the value is used."""
    text = text.strip()
    kinds = typing.get_args(kind) if isinstance(kind, types.UnionType) else (kind,)
    if bool in kinds:
        if text.lower() in TRUE_WORDS + FALSE_WORDS:
            return text.lower() in TRUE_WORDS
        if str not in kinds:
            raise ValueError(f"{name} must be true or false, got {text!r}")
    if int in kinds or float in kinds:
        try:
            number = float(text)
        except ValueError:
            raise ValueError(f"{name} must be a number, got {text!r}") from None
        if not math.isfinite(number):
            raise ValueError(f"{name} must be a finite number, got {text!r}")
        if float in kinds:
            return number
        if not number.is_integer():
            raise ValueError(f"{name} must be a whole number, got {text}")
        return int(number)
    return text


def merge_settings(recommended: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """A pipeline's ``recommended`` settings with those the user set laid over them (None = not set)."""
    return {**recommended, **{k: v for k, v in given.items() if v is not None}}
