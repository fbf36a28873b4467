"""Every model and tokenizer config checks each field through its declaration (type, range, choices, length) and
then the relations between fields, before any model is built: a bad value is one ValueError that starts with the
field's name.

The fields are walked, not listed: for every field of every config class, values of a wrong type and values out of
the declared range are derived from the declaration and fed to a valid config, so a field added later is covered
the day it is declared (and a field left undeclared is refused)."""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass
from typing import Any

import pytest

import vgen.hub  # noqa: F401  (imports every registered config class)
from vgen.models.backbone import BackboneConfig, GridConfig
from vgen.models.blockdiff import BlockDiffConfig
from vgen.models.classifier import AttributeClassifierConfig, ClassifierConfig, VideoClassifierConfig
from vgen.models.config_fields import SIZE_LIMIT, Declared, ModelConfig, declarations, declare, size
from vgen.models.diffusion_head import HeadConfig
from vgen.models.draft_head import DraftHeadConfig
from vgen.models.janus import JanusT2IConfig
from vgen.models.llamagen import GPTConfig
from vgen.models.mar import MARConfig
from vgen.models.mllm import MLLMConfig
from vgen.models.nar import NARConfig
from vgen.models.nbp import NBPConfig
from vgen.models.word_encoder import WordEncoderConfig
from vgen.tokenizers.kl import KLConfig
from vgen.tokenizers.vq import VQConfig

VALID: dict[type, ModelConfig] = {config.__class__: config for config in (
    BackboneConfig(), GridConfig(), GPTConfig(), GPTConfig(model_type="t2i"), NARConfig(), NBPConfig(), MARConfig(),
    HeadConfig(), DraftHeadConfig(dim=64, n_head=4, block_size=16), BlockDiffConfig(), ClassifierConfig(),
    AttributeClassifierConfig(attributes=(("shape", 8), ("colour", 4))), VideoClassifierConfig(),
    WordEncoderConfig.for_words(["a", "red", "star"]), JanusT2IConfig(boi_token_id=100, pad_token_id=101),
    MLLMConfig(row_end=(8803,), head_tokens=(8197, 8824, 8824), tail=(8196,)), VQConfig(), KLConfig())}
"""A valid config of each class (GPTConfig's is a text-to-image one, where every field is in use)."""

RELATIONS: list[tuple[ModelConfig, dict, str]] = [
    (BackboneConfig(), dict(dim=30, n_head=4), "dim 30 is not divisible by n_head 4"),
    (BackboneConfig(), dict(dim=48, n_head=8), r"head_dim 6 \(dim 48 / n_head 8\) must be divisible by 4"),
    (BackboneConfig(), dict(n_head=4, n_kv_head=3), "n_head 4 is not divisible by n_kv_head 3"),
    (GridConfig(), dict(rope="spatial"), "rope='spatial' encodes the frames of a video grid"),
    (GridConfig(), dict(grid=(2, 2, 2), dim=16, n_head=4),
     r"head_dim 4 gives 2 rotation pairs, fewer than 3 axes of grid \(2, 2, 2\) that rope='grid' rotates"),
    (GPTConfig(), dict(block_size=20), r"block_size 20 must be 1 frame\(s\) of a square number"),
    (GPTConfig(), dict(cls_token_num=2), "cls_token_num must be 1, got 2"),
    (GPTConfig(), dict(rope="spatial"), "rope='spatial' encodes the frames of a clip"),
    (GPTConfig(), dict(block_size=8, frames=2, dim=16, n_head=4), "head_dim 4 gives 2 rotation pairs, fewer than 3"),
    (NARConfig(), dict(image_first=True), "image_first draws frame 0 of a video grid"),
    (NBPConfig(), dict(grid=(8, 8)), r"frame blocks need a video grid"),
    (NBPConfig(), dict(hybrid_blocks=2), "hybrid_blocks must be 1, or with hybrid=True"),
    (MARConfig(), dict(num_sampling_steps=2000), "num_sampling_steps 2000 is more than num_train_steps 1000"),
    (MARConfig(), dict(dim=30, n_head=4), "dim 30 is not divisible by n_head 4"),
    (HeadConfig(), dict(num_train_steps=50), "num_sampling_steps 100 is more than num_train_steps 50"),
    (VALID[DraftHeadConfig], dict(block_size=20), r"block_size 20 must be 1 frame\(s\) of a square number"),
    (BlockDiffConfig(), dict(frame_size=30), "frame_size 30 is not a multiple of patch_size 4"),
    (BlockDiffConfig(), dict(train_frames=5), "train_frames 5 must be a multiple of frames_per_block 2"),
    (BlockDiffConfig(), dict(dim=32, n_head=8), "dim 32 / n_head 8 must give an even head_dim >= 6"),
    (ClassifierConfig(), dict(image_size=4), "4 widths halve an image 3 times, more than image_size 4 allows"),
    (VALID[AttributeClassifierConfig], dict(attributes=(("shape", 8), ("shape", 4))),
     r"attributes has repeated names: \['shape', 'shape'\]"),
    (VALID[WordEncoderConfig], dict(vocabulary=("a", "b")), "the vocabulary must start with"),
    (VALID[WordEncoderConfig], dict(dim=30), "dim 30 is not divisible by n_head 4"),
    (VALID[JanusT2IConfig], dict(pad_token_id=None), "a Janus config needs boi_token_id and pad_token_id"),
    (VALID[JanusT2IConfig], dict(boi_token_id=102400), "boi_token_id 102400 is not a token of the text_vocab_size"),
    (VALID[MLLMConfig], dict(vocab_size=70000), "vocab_size 70000 .image codes. exceeds the text_vocab_size 65536"),
    (VALID[MLLMConfig], dict(tail=(65536,)), "tail id 65536 is not a token of the text_vocab_size 65536"),
    (VALID[MLLMConfig], dict(max_positions=2048), "a 48x48 image after a prompt of max_prompt_tokens 256 takes 2609 "
                                                  "positions, more than the model's max_positions 2048"),
    (VQConfig(), dict(norm_groups=3), "channel width 128 is not divisible by norm_groups=3"),
    (VQConfig(), dict(ch=4, ch_mult=(2, 4), norm_groups=8), "channel width 4 is not divisible by norm_groups=8"),
    (KLConfig(), dict(image_size=30), "image_size 30 is not divisible by the downsampling 4"),
]


def config_classes() -> set[type]:
    """Every subclass of ModelConfig that vgen defines."""
    found, todo = set(), [ModelConfig]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("vgen."):
                found.add(sub)
    return found


FIELDS = [(cls, name) for cls in VALID for name in declarations(cls)]


def _leaf(kind: Any) -> Any:
    """The type of the numbers or strings a field of ``kind`` holds (through ``| None`` and tuples)."""
    args = [a for a in typing.get_args(kind) if a is not type(None) and a is not Ellipsis]
    if typing.get_origin(kind) is tuple:
        numeric = [a for a in args if _leaf(a) in (int, float)]
        return _leaf((numeric or args)[0])
    return _leaf(args[0]) if args else kind


def _with_leaf(kind: Any, value: Any, new: Any) -> Any:
    """``value`` with its first number (or, without one, its first string) replaced by ``new``."""
    if typing.get_origin(kind) is not tuple:
        return new
    args = typing.get_args(kind)
    kinds = [args[0]] * len(value) if args[-1] is Ellipsis else list(args)
    at = next(i for i, k in enumerate(kinds) if _leaf(k) is _leaf(kind))
    return type(value)([*value[:at], _with_leaf(kinds[at], value[at], new), *value[at + 1:]])


def wrong_types(kind: Any, value: Any) -> list[Any]:
    """Values of the wrong type for a field of ``kind`` whose valid value is ``value``."""
    leaf = _leaf(kind)
    wrong = {int: [8.0, True, "8"], float: [True, "1.0", None], bool: [1, "true"], str: [3, None]}[leaf]
    if typing.get_origin(kind) is tuple:
        return [3, "abc", _with_leaf(kind, value, wrong[0])]
    if type(None) in typing.get_args(kind):
        wrong = [w for w in wrong if w is not None]
    return wrong


def out_of_range(kind: Any, spec: Declared, value: Any) -> list[Any]:
    """Values of the right type outside the declaration of a field of ``kind`` whose valid value is ``value``."""
    leaf = _leaf(kind)
    step = 1 if leaf is int else 0.5
    bad = []
    if spec.at_least is not None:
        bad.append(spec.at_least - step)
    if spec.above is not None:
        bad.append(spec.above)
    if spec.at_most is not None:
        bad.append(spec.at_most + step)
    if spec.below is not None:
        bad.append(spec.below)
    bad = [leaf(b) for b in bad] if leaf in (int, float) else ["no-such-choice"] if spec.choices else []
    if typing.get_origin(kind) is not tuple:
        return bad
    lengths = ([[]] if spec.length[0] > 0 else []) + ([] if spec.length[1] == SIZE_LIMIT
                                                       else [list(value) * (spec.length[1] + 1)])
    return [_with_leaf(kind, value, b) for b in bad] + lengths


def test_every_config_class_of_vgen_is_walked():
    assert config_classes() == set(VALID)
    assert all(type(config) is cls for cls, config in VALID.items())


@pytest.mark.parametrize("cls, name", FIELDS, ids=[f"{c.__name__}.{n}" for c, n in FIELDS])
def test_each_field_refuses_a_wrong_type_and_a_value_out_of_range_naming_itself(cls, name):
    kind, spec = declarations(cls)[name]
    valid = VALID[cls]
    cases = wrong_types(kind, getattr(valid, name)) + out_of_range(kind, spec, getattr(valid, name))
    if _leaf(kind) in (int, float) or spec.choices:
        assert out_of_range(kind, spec, getattr(valid, name)), f"{cls.__name__}.{name} declares no range"
    for bad in cases:
        with pytest.raises(ValueError) as error:
            dataclasses.replace(valid, **{name: bad})
        message = str(error.value)
        assert (message.startswith(f"{name} must") or message.startswith(f"{name}[")) and "\n" not in message, \
            (bad, message)


@pytest.mark.parametrize("config, change, message", RELATIONS,
                         ids=[f"{type(c).__name__}-{'-'.join(ch)}" for c, ch, _ in RELATIONS])
def test_a_broken_relation_between_fields_is_refused_naming_them(config, change, message):
    with pytest.raises(ValueError, match=message) as error:
        dataclasses.replace(config, **change)
    assert "\n" not in str(error.value)


def test_the_relations_cover_every_config_class_that_has_any():
    """A class whose __post_init__ checks more than its fields has a broken relation above."""
    with_relations = {cls for cls in VALID if "__post_init__" in vars(cls)}
    assert with_relations <= {type(config) for config, _, _ in RELATIONS}


@pytest.mark.parametrize("cls", list(VALID), ids=lambda c: c.__name__)
def test_each_config_round_trips_through_json_and_stores_what_json_gives_as_declared(cls):
    config = VALID[cls]
    text = json.dumps(config.to_dict())
    assert cls.from_dict(json.loads(text)) == config
    for name, (kind, _) in declarations(cls).items():
        if typing.get_origin(kind) is tuple:
            assert isinstance(getattr(cls.from_dict(json.loads(text)), name), tuple)


def test_a_number_is_stored_as_its_field_declares():
    config = BackboneConfig(rope_base=500, norm_eps=1e-6)
    assert type(config.rope_base) is float and config.rope_base == 500.0
    assert NARConfig(grid=[4, 4]).grid == (4, 4)


def test_from_dict_names_unknown_and_missing_fields_and_refuses_a_non_object():
    with pytest.raises(ValueError, match=r"^unknown GPTConfig field\(s\) \['heads'\]; expected some of"):
        GPTConfig.from_dict({"heads": 4})
    with pytest.raises(ValueError, match=r"^DraftHeadConfig needs the field\(s\) \['n_head', 'block_size'\]"):
        DraftHeadConfig.from_dict({"dim": 64})
    with pytest.raises(ValueError, match="^a VQConfig is an object of its fields, got list"):
        VQConfig.from_dict([1, 2])


def test_a_long_bad_value_is_cut_in_the_message():
    with pytest.raises(ValueError) as error:
        BackboneConfig(dim="x" * 10_000)
    assert len(str(error.value)) < 150 and "(10002 characters)" in str(error.value)


def test_a_config_field_without_a_declaration_is_refused():
    @dataclass(frozen=True)
    class Loose(ModelConfig):
        width: int = size(4)
        depth: int = 2

    with pytest.raises(TypeError, match="Loose.depth has no declaration"):
        Loose()


def test_declared_choices_are_a_tuple():
    @dataclass(frozen=True)
    class Picky(ModelConfig):
        kind: str = declare("a", choices=["a", "b"])

    assert Picky(kind="b").kind == "b"
    with pytest.raises(ValueError, match=r"^kind must be one of \['a', 'b'\], got 'c'$"):
        Picky(kind="c")
