"""Options declared once: every sampler, sampling and stream setting is a declared field whose declaration
validates it, describes it and reads it from text; a pipeline's recommended settings yield to what a user set."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pytest

from vgen.samplers import SamplingParams, available_samplers, get_sampler
from vgen.samplers.options import (
    OPTION,
    Option,
    check_options,
    declarations,
    declared_options,
    merge_settings,
    option,
    parse_option,
    short_repr,
)
from vgen.samplers.streaming import StreamConfig

CONFIGS = [SamplingParams, StreamConfig, *(type(get_sampler(name)) for name in available_samplers())]


@dataclass(frozen=True)
class Knobs:
    count: int = option(2, "how many", at_least=1, note="1 = one")
    share: float = option(0.5, "a share", above=0, below=1)
    mode: str = option("fast", "how", choices=("fast", "slow"))
    rule: str = option("a", "which rule", choices=lambda: ["a", "b"], unknown="rule")
    flag: bool = option(False, "on or off")

    def __post_init__(self) -> None:
        check_options(self)


@dataclass(frozen=True)
class Preset(Knobs):
    mode: str = "slow"  # a preset changes a default, not the declaration


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.__name__)
def test_every_setting_is_a_declared_field_with_help(config) -> None:
    undeclared = [f.name for f in dataclasses.fields(config) if f.name not in declarations(config)]
    assert undeclared == []
    assert all(d.help for d in declarations(config).values())


@pytest.mark.parametrize("kwargs, message", [
    (dict(count=0), "count must be an integer >= 1 (1 = one), got 0"),
    (dict(count=1.5), "count must be an integer >= 1 (1 = one), got 1.5"),
    (dict(share=1.0), "share must be in (0, 1), got 1.0"),
    (dict(share="half"), "share must be a number in (0, 1), got 'half'"),
    (dict(share=float("nan")), "share must be a finite number in (0, 1), got nan"),
    (dict(count=float("inf")), "count must be an integer >= 1 (1 = one), got inf"),
    (dict(count=True), "count must be an integer >= 1 (1 = one), got True"),
    (dict(mode="medium"), "mode must be one of ['fast', 'slow'], got 'medium'"),
    (dict(rule="c"), "unknown rule 'c'; available: a, b"),
    (dict(flag=1), "flag must be true or false, got 1"),
])
def test_the_declaration_validates_the_field(kwargs, message) -> None:
    with pytest.raises(ValueError) as e:
        Knobs(**kwargs)
    assert str(e.value) == message


def test_a_preset_keeps_the_declaration_with_its_own_default() -> None:
    assert declarations(Preset)["mode"].spec is declarations(Knobs)["mode"].spec
    assert declarations(Preset)["mode"].default == "slow"
    with pytest.raises(ValueError, match="mode must be one of"):
        Preset(mode="medium")
    lantern = declarations(type(get_sampler("lantern")))
    assert lantern["accept"].default == "lantern" and lantern["accept"].spec.unknown == "acceptance rule"


def test_numpy_numbers_are_stored_as_the_declared_type() -> None:
    knobs = Knobs(count=np.int64(3), share=np.float32(0.25))
    assert (type(knobs.count), type(knobs.share), knobs.count, knobs.share) == (int, float, 3, 0.25)
    assert type(SamplingParams(cfg_scale=4).cfg_scale) is float


def test_the_help_shows_the_valid_values_what_a_special_value_means_and_a_default() -> None:
    d = declarations(Knobs)
    assert d["count"].help == "how many (>= 1; 1 = one)" and d["share"].help == "a share (in (0, 1))"
    assert d["count"].spec.describe(default="2") == "how many (>= 1; 1 = one; default: 2)"
    assert declarations(SamplingParams)["top_k"].help == "keep the k most likely tokens (in [0, 262144]; 0 = off)"
    assert declarations(SamplingParams)["temperature"].help == "sampling temperature (in [0, 100]; 0 = greedy)"
    assert d["rule"].help == "which rule (one of: a, b)" and d["flag"].help == "on or off"
    assert d["count"].flag == "--count" and declarations(StreamConfig)["window_frames"].flag == "--window-frames"


def test_a_name_means_one_thing_across_configs() -> None:
    names = [o.name for o in declared_options(CONFIGS[2:])]
    assert len(names) == len(set(names)) and {"window", "draft_length", "cfg_schedule", "compile"} <= set(names)

    @dataclass(frozen=True)
    class Other:
        count: int = option(2, "something else", at_least=0)

    with pytest.raises(TypeError, match="option 'count' is declared differently by Other"):
        declared_options([Knobs, Other])
    assert [o.name for o in declared_options([Knobs], exclude=("flag",))] == ["count", "share", "mode", "rule"]


@pytest.mark.parametrize("text, kind, value", [
    ("8", int, 8), (" 8.0 ", int, 8), ("0.25", float, 0.25), ("3", float, 3.0), ("vertical", str, "vertical"),
    ("true", bool | str, True), ("Off", bool | str, False), ("reduce-overhead", bool | str, "reduce-overhead"),
    ("yes", bool, True),
])
def test_text_is_read_as_the_declared_type(text, kind, value) -> None:
    parsed = parse_option("x", text, kind)
    assert parsed == value and type(parsed) is type(value)


@pytest.mark.parametrize("text, kind, message", [
    ("2.5", int, "x must be a whole number, got 2.5"), ("many", int, "x must be a number, got 'many'"),
    ("wide", float, "x must be a number, got 'wide'"), ("maybe", bool, "x must be true or false, got 'maybe'"),
    ("1e309", float, "x must be a finite number, got '1e309'"), ("nan", float, "x must be a finite number, got 'nan'"),
    ("1e400", int, "x must be a finite number, got '1e400'"),
])
def test_text_of_the_wrong_type_is_refused(text, kind, message) -> None:
    with pytest.raises(ValueError) as e:
        parse_option("x", text, kind)
    assert str(e.value) == message


def test_what_a_user_set_overrides_the_recommended_settings_and_none_means_not_set() -> None:
    recommended = {"cfg_scale": 2.0, "top_k": 50}
    merged = merge_settings(recommended, {"cfg_scale": None, "top_k": 0, "temperature": 0.5})
    assert merged == {"cfg_scale": 2.0, "top_k": 0, "temperature": 0.5}
    assert recommended == {"cfg_scale": 2.0, "top_k": 50}  # the pipeline's own record is left as it is
    assert SamplingParams(**merge_settings({}, {"cfg_scale": None})) == SamplingParams()


def test_the_metadata_key_holds_the_declaration() -> None:
    field = next(f for f in dataclasses.fields(SamplingParams) if f.name == "top_p")
    assert field.metadata[OPTION].range_text() == "in (0, 1]"


def test_a_range_up_to_a_large_power_of_two_reads_as_one() -> None:
    assert Option("seed", at_least=0, below=2**64).range_text() == "in [0, 2**64)"
    assert Option("n", at_most=1024).range_text() == "<= 1024"


def test_a_message_never_echoes_a_long_value_whole() -> None:
    with pytest.raises(ValueError) as caught:
        Knobs(mode="x" * 1_000_000)
    assert len(str(caught.value)) < 120 and str(caught.value).endswith("... (1000002 characters)")
    with pytest.raises(ValueError, match="^share must be a finite number in \\(0, 1\\), got 1000"):
        Knobs(share=10**400)  # an integer no float holds


# every numeric option of every registered sampler, of the shared sampling settings and of a stream: (what builds
# the config from keyword arguments, the option)
NUMERIC = [(build, o) for name, build in [*((n, lambda n=n, **kw: get_sampler(n, **kw)) for n in available_samplers()),
                                          ("sampling", SamplingParams), ("stream", StreamConfig)]
           for o in declared_options([type(build())]) if o.kind in (int, float)]
NUMERIC_IDS = [f"{type(build()).__name__}.{o.name}" for build, o in NUMERIC]
# what another field must be for a value at a bound to be valid: LANTERN++'s lambda, retrieval from a bank
COMPANIONS = {"lantern_delta": {"lantern_mode": "relative"}, "retrieved_blocks": {"bank_blocks": 1},
              "candidates": {"accept": "exact"}}  # a draft tree takes the exact rule (the lossy presets' own refuse it)


def largest_and_above(o) -> tuple[float, float]:
    """The largest value ``o`` takes and the next one above it (an integer's + 1, a float's next float)."""
    top = o.spec.at_most if o.spec.at_most is not None else o.spec.below
    if o.kind is int:
        largest = top if o.spec.at_most is not None else math.ceil(top) - 1
        return largest, largest + 1
    largest = top if o.spec.at_most is not None else math.nextafter(top, -math.inf)
    return largest, math.nextafter(largest, math.inf)


def refusal(build, **kwargs) -> str:
    with pytest.raises(ValueError) as e:
        build(**kwargs)
    return str(e.value)


def test_the_walk_covers_every_registered_sampler() -> None:
    covered = {type(build()).name for build, _ in NUMERIC if hasattr(type(build()), "name")}
    assert covered == {n for n in available_samplers() if any(o.kind in (int, float)
                                                               for o in declarations(type(get_sampler(n))).values())}
    assert {"cspd", "sjd", "lantern", "gsd", "continuous-ar"} <= covered


@pytest.mark.parametrize("build, o", NUMERIC, ids=NUMERIC_IDS)
def test_every_numeric_option_has_a_finite_upper_bound_that_its_declaration_enforces(build, o) -> None:
    """The bound is finite; the largest value is accepted and the next one above it refused with the declaration's
    one-line message."""
    top = o.spec.at_most if o.spec.at_most is not None else o.spec.below
    assert top is not None and math.isfinite(top), f"{o.name} has no finite upper bound"
    largest, above = largest_and_above(o)
    assert getattr(build(**COMPANIONS.get(o.name, {}), **{o.name: largest}), o.name) == largest
    message = refusal(build, **COMPANIONS.get(o.name, {}), **{o.name: above})
    assert message.startswith(f"{o.name} must be ") and o.spec.range_text() in message and "\n" not in message


@pytest.mark.parametrize("build, o", NUMERIC, ids=NUMERIC_IDS)
def test_non_finite_absurd_and_boolean_values_get_the_declaration_s_message(build, o) -> None:
    for value in (1e308, -1e308, math.inf, math.nan, 10**400, True, "3"):
        message = refusal(build, **{o.name: value})
        assert message.startswith(f"{o.name} must be ") and message.endswith(f"got {short_repr(value)}"), message
