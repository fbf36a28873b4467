"""The backbone settings shared by LlamaGen, NAR and NBP: one validation for all three, and the shipped models'
configs round-trip through ``to_dict`` / ``from_dict`` with the keys of their ``config.json``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vgen.models.backbone import BackboneConfig
from vgen.models.llamagen import GPTConfig
from vgen.models.nar import NARConfig
from vgen.models.nbp import NBPConfig

ASSETS = Path(__file__).parents[2] / "vgen" / "assets"
CONFIGS = {"LlamaGenGPT": GPTConfig, "NARTransformer": NARConfig, "NBPTransformer": NBPConfig}
SHIPPED = [p for p in sorted(ASSETS.glob("*/gpt/config.json")) if json.loads(p.read_text())["class"] in CONFIGS]


@pytest.mark.parametrize("config_cls, extra", [(GPTConfig, {}), (NARConfig, {"grid": (4, 4)}),
                                               (NBPConfig, {"grid": (3, 4), "block": "row"})])
@pytest.mark.parametrize("kwargs, message", [
    (dict(n_layer=0), r"n_layer must be an integer in \[1, 2\*\*24\], got 0"),
    (dict(dim=30, n_head=4), "dim 30 is not divisible by n_head 4"),
    (dict(dim=48, n_head=8), "head_dim 6 .* must be divisible by 4"),
    (dict(dim=64, n_head=4, n_kv_head=3), "n_head 4 is not divisible by n_kv_head 3"),
])
def test_every_backbone_checks_its_blocks_alike(config_cls: type[BackboneConfig], extra: dict, kwargs: dict,
                                                message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config_cls(**extra, **kwargs)


def test_every_shipped_backbone_is_checked() -> None:
    assert {p.parts[-3] for p in SHIPPED} >= {"shapes-c2i", "shapes-nar", "shapes-video-nar", "shapes-video-nbp"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.parts[-3])
def test_shipped_configs_round_trip_with_their_keys(path: Path) -> None:
    saved = json.loads(path.read_text())
    config = CONFIGS[saved["class"]].from_dict(saved["config"])
    written = config.to_dict()
    assert {k: written[k] for k in saved["config"]} == saved["config"]
    # keys a config.json predates (shapes-nar's image_first) are written with their defaults
    assert all(getattr(type(config)(), k) == written[k] for k in set(written) - set(saved["config"]))
    assert type(config).from_dict(json.loads(json.dumps(written))) == config
