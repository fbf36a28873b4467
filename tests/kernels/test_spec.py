"""Rule specs: the kinds the kernels know, each with the tables it needs (these checks import no triton)."""

import re

import pytest
import torch

from vgen.kernels import RULE_KINDS, RuleSpec


def test_every_kind_builds_with_its_tables() -> None:
    tables = {"lantern": dict(neighbours=torch.zeros(4, 2, dtype=torch.long)), "gsd": dict(embeddings=torch.ones(4, 3))}
    assert [RuleSpec(kind, **tables.get(kind, {})).kind for kind in RULE_KINDS] == list(RULE_KINDS)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(kind="typical"), "rule kind must be one of ['exact', 'lantern', 'gsd', 'match'], got 'typical'"),
    (dict(kind="lantern", delta=0.1), "a 'lantern' rule spec needs its neighbours table"),
    (dict(kind="gsd", rank_window=7), "a 'gsd' rule spec needs its embedding table"),
])
def test_a_spec_without_what_its_kind_needs_raises(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        RuleSpec(**kwargs)
