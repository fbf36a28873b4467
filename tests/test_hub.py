"""Checkpoints: vgen's folders round-trip bit for bit; LlamaGen ``.pt`` files in each of the formats its
scripts write (DDP ``{"model": ...}`` with the trainer's argparse options, EMA, raw FSDP ``consolidated.pth``)
load strictly; and every kind of bad file fails with a :class:`CheckpointError` that says what is wrong.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from vgen.hub import (
    ASSETS,
    MODEL_CLASSES,
    SAME_AS,
    CheckpointError,
    from_pretrained,
    load_weights,
    meta_device,
    model_folder,
    read_safetensors,
    read_torch_checkpoint,
    register_model_class,
    safetensors_shapes,
    save_pretrained,
)
from vgen.models.config_fields import ModelConfig, size
from vgen.models.llamagen import GPTConfig, LlamaGenGPT, gpt_config
from vgen.tokenizers.vq import VQConfig, VQModel

TINY_GPT = GPTConfig(vocab_size=40, dim=64, n_layer=2, n_head=4, num_classes=5, block_size=16)
TINY_VQ = VQConfig(codebook_size=32, codebook_embed_dim=4, ch=8, ch_mult=(1, 2), num_res_blocks=1,
                   z_channels=8, norm_groups=4)
SHIPPED_CONFIGS = [p for p in sorted(ASSETS.rglob("config.json")) if SAME_AS not in json.loads(p.read_text())]
"""The embedded model folders that hold their weights (the others name one of these by ``same_as``)."""


def randomised(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter and buffer random, so a round trip cannot pass by matching the init."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in model.state_dict().values():
            t.copy_(torch.randn(t.shape, generator=g))
    return model.eval()


def llamagen_gpt_shapes(n_layer: int, dim: int, hidden: int, vocab: int,
                        num_classes: int) -> dict[str, tuple]:
    """LlamaGen c2i GPT state-dict keys and shapes (reference notes 1.2), with n_kv_head = n_head."""
    shapes: dict[str, tuple] = {"cls_embedding.embedding_table.weight": (num_classes + 1, dim),
                                "tok_embeddings.weight": (vocab, dim)}
    for i in range(n_layer):
        shapes |= {f"layers.{i}.attention.wqkv.weight": (3 * dim, dim),
                   f"layers.{i}.attention.wo.weight": (dim, dim),
                   f"layers.{i}.feed_forward.w1.weight": (hidden, dim),
                   f"layers.{i}.feed_forward.w3.weight": (hidden, dim),
                   f"layers.{i}.feed_forward.w2.weight": (dim, hidden),
                   f"layers.{i}.attention_norm.weight": (dim,), f"layers.{i}.ffn_norm.weight": (dim,)}
    return shapes | {"norm.weight": (dim,), "output.weight": (vocab, dim)}


def tiny_state() -> dict[str, torch.Tensor]:
    return randomised(LlamaGenGPT(TINY_GPT)).state_dict()


# ---- vgen folders ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", [randomised(LlamaGenGPT(TINY_GPT)), randomised(VQModel(TINY_VQ))],
                         ids=["gpt", "vq"])
def test_save_then_from_pretrained_is_bit_exact(model: torch.nn.Module, tmp_path: Path) -> None:
    folder = save_pretrained(model, tmp_path / "m")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    loaded = from_pretrained(folder)
    assert type(loaded) is type(model) and loaded.config == model.config and not loaded.training
    before, after = model.state_dict(), loaded.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) and before[k].dtype == after[k].dtype for k in before)


def test_round_tripped_gpt_gives_identical_logits(tmp_path: Path) -> None:
    model = randomised(LlamaGenGPT(TINY_GPT))
    loaded = from_pretrained(save_pretrained(model, tmp_path))
    tokens = torch.randint(0, 40, (2, 9))
    with torch.no_grad():
        assert torch.equal(model(torch.tensor([1, 5]), tokens), loaded(torch.tensor([1, 5]), tokens))


def test_save_pretrained_can_cast_to_bf16(tmp_path: Path) -> None:
    model = randomised(LlamaGenGPT(TINY_GPT))
    loaded = from_pretrained(save_pretrained(model, tmp_path, dtype=torch.bfloat16))
    w, w_loaded = model.output.weight, loaded.output.weight
    assert torch.equal(w_loaded, w.bfloat16().float())


def test_config_json_names_the_class_and_its_config(tmp_path: Path) -> None:
    save_pretrained(randomised(VQModel(TINY_VQ)), tmp_path)
    meta = json.loads((tmp_path / "config.json").read_text())
    assert meta["class"] == "VQModel"
    assert VQConfig.from_dict(meta["config"]) == TINY_VQ


def test_every_shipped_model_folder_names_a_registered_class_of_its_config() -> None:
    assert len(SHIPPED_CONFIGS) >= 10
    for path in SHIPPED_CONFIGS:
        meta = json.loads(path.read_text())
        model_cls, config_cls = MODEL_CLASSES[meta["class"]]
        assert model_cls.__name__ == meta["class"], path
        assert isinstance(config_cls.from_dict(meta["config"]), config_cls), path


def test_from_pretrained_without_config_json_fails_clearly(tmp_path: Path) -> None:
    save_pretrained(randomised(LlamaGenGPT(TINY_GPT)), tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(CheckpointError, match="no config.json in .*a folder written by save_pretrained"):
        from_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="no config.json"):
        from_pretrained(tmp_path / "does-not-exist")


SHARED_TOKENIZERS = {
    "shapes-c2i/vq": "2ad73a9610d4778ae3427e517aa41c33bbfd5819bc292157a9390401381cf0c1",
    "shapes-c2i-continuous/kl": "06ff03d346865e85ff62baa7de0ad4d91dd3f9a032d6083f04588050235673a9"}
"""The tokenizer folders several embedded models share, with the SHA-256 of the weights each model shipped."""


def test_a_folder_naming_another_by_same_as_loads_its_model_bit_for_bit(tmp_path: Path) -> None:
    owner = save_pretrained(randomised(VQModel(TINY_VQ)), tmp_path / "a" / "vq")
    (tmp_path / "b" / "vq").mkdir(parents=True)
    (tmp_path / "b" / "vq" / "config.json").write_text(json.dumps({SAME_AS: "../../a/vq"}))
    assert model_folder(tmp_path / "b" / "vq") == owner and model_folder(owner) == owner
    loaded, expected = from_pretrained(tmp_path / "b" / "vq").state_dict(), from_pretrained(owner).state_dict()
    assert loaded.keys() == expected.keys() and all(torch.equal(v, expected[k]) for k, v in loaded.items())


@pytest.mark.parametrize("meta, message", [
    ({SAME_AS: "../a", "class": "VQModel"}, "'same_as' must be the only key, with a relative path"),
    ({SAME_AS: "/abs/vq"}, "'same_as' must be the only key, with a relative path"),
    ({SAME_AS: 3}, "'same_as' must be the only key, with a relative path"),
    ({SAME_AS: "../nowhere"}, r"names '../nowhere' by 'same_as', but .*nowhere has no config.json$"),
    ({SAME_AS: "../c"}, r"names .*c by 'same_as', which names another folder in turn"),
])
def test_a_bad_same_as_is_one_line_naming_the_file(tmp_path: Path, meta: dict, message: str) -> None:
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "config.json").write_text(json.dumps({SAME_AS: "../a"}))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=message) as error:
        from_pretrained(tmp_path / "b")
    assert str(error.value).startswith(str(tmp_path / "b" / "config.json")) and "\n" not in str(error.value)


def test_the_embedded_models_share_each_tokenizer_as_one_file_of_the_shipped_hash() -> None:
    """Seven embedded models name a shared tokenizer folder instead of holding a copy; the file they load is the
    one each shipped (its SHA-256), so each model decodes, and samples, as before."""
    named = {}
    for config in sorted(ASSETS.rglob("config.json")):
        if SAME_AS in json.loads(config.read_text()):
            named[config.parent.relative_to(ASSETS).as_posix()] = model_folder(config.parent)
            assert not (config.parent / "model.safetensors").exists(), config
    assert len(named) == 7 and {f.relative_to(ASSETS).as_posix() for f in named.values()} == set(SHARED_TOKENIZERS)
    for folder, digest in SHARED_TOKENIZERS.items():
        assert hashlib.sha256((ASSETS / folder / "model.safetensors").read_bytes()).hexdigest() == digest


def test_from_pretrained_rejects_bad_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"class": "Nope", "config": {}}))
    with pytest.raises(CheckpointError, match="names model class 'Nope'"):
        from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"class": "LlamaGenGPT", "config": {"dim": 100}}))
    with pytest.raises(CheckpointError, match="bad model config"):
        from_pretrained(tmp_path)


@pytest.mark.parametrize("change, message", [
    ({"n_head": 0}, r"n_head must be an integer in \[1, 2\*\*24\], got 0"),
    ({"dim": -256}, r"dim must be an integer in \[1, 2\*\*24\], got -256"),
    ({"n_layer": 8.0}, r"n_layer must be an integer in \[1, 2\*\*24\], got 8.0"),
    ({"n_layer": True}, r"n_layer must be an integer in \[1, 2\*\*24\], got True"),
    ({"dim": 102}, "dim 102 is not divisible by n_head 4"),
    ({"heads": 4}, r"unknown GPTConfig field\(s\) \['heads'\]"),
])
def test_a_bad_config_field_is_named_with_its_file_before_any_tensor_is_built(tmp_path: Path, monkeypatch,
                                                                              change: dict, message: str) -> None:
    folder = with_config(save_pretrained(randomised(LlamaGenGPT(TINY_GPT)), tmp_path), **change)
    monkeypatch.setattr("vgen.hub.meta_device", lambda: pytest.fail("a model was built from a bad config"))
    with pytest.raises(CheckpointError, match=f"^bad model config in {folder / 'config.json'}: {message}") as error:
        from_pretrained(folder)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("path", SHIPPED_CONFIGS, ids=lambda p: str(p.parent.relative_to(ASSETS)))
def test_every_shipped_config_names_a_field_of_the_wrong_type_with_its_file(tmp_path: Path, path: Path) -> None:
    meta = json.loads(path.read_text())
    name = next(iter(meta["config"]))
    meta["config"][name] = {"a": 1}
    (tmp_path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=rf"^bad model config in {tmp_path / 'config.json'}: {name} must "):
        from_pretrained(tmp_path)


def test_from_pretrained_with_missing_or_corrupt_weights(tmp_path: Path) -> None:
    folder = save_pretrained(randomised(LlamaGenGPT(TINY_GPT)), tmp_path)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    corrupt = f"^cannot read {weights}: the file is corrupt or not a safetensors checkpoint$"
    with pytest.raises(CheckpointError, match=corrupt):
        from_pretrained(folder)
    with pytest.raises(CheckpointError, match=corrupt):
        read_safetensors(weights)
    weights.unlink()
    with pytest.raises(CheckpointError, match="weights file not found: .*model.safetensors"):
        from_pretrained(folder)
    with pytest.raises(CheckpointError, match="not found"):
        read_safetensors(tmp_path / "x.safetensors")


def test_from_pretrained_takes_only_a_path(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="^from_pretrained's path must be a str or Path, got NoneType$"):
        from_pretrained(None)
    with pytest.raises(ValueError, match="^from_pretrained's path is an empty string"):
        from_pretrained("")
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="holds a JSON list, not an object"):
        from_pretrained(tmp_path)


def with_config(folder: Path, **changes) -> Path:
    """``folder``'s config.json with ``changes`` to the model config; the weights stay as they are."""
    meta = json.loads((folder / "config.json").read_text())
    meta["config"].update(changes)
    (folder / "config.json").write_text(json.dumps(meta))
    return folder


@pytest.fixture
def constructions(monkeypatch) -> list[str]:
    """The default device at every construction of a LlamaGenGPT that from_pretrained builds."""
    devices: list[str] = []

    class Recorded(LlamaGenGPT):
        def __init__(self, config: GPTConfig) -> None:
            devices.append(torch.get_default_device().type)
            super().__init__(config)

    monkeypatch.setitem(MODEL_CLASSES, "LlamaGenGPT", (Recorded, GPTConfig))
    return devices


def test_a_config_far_larger_than_its_weights_is_refused_before_anything_is_allocated(tmp_path: Path,
                                                                                       constructions) -> None:
    folder = with_config(save_pretrained(randomised(LlamaGenGPT(TINY_GPT)), tmp_path), dim=8192, n_layer=200,
                         n_head=64)
    expected = (f"^the LlamaGenGPT of {folder / 'config.json'} has over 52 parameter tensors, far more than the 18 of "
                rf"{folder / 'model.safetensors'} \(building it stopped at Linear.weight \[\d+, 8192\]\)$")
    with pytest.raises(CheckpointError, match=expected):
        from_pretrained(folder)
    assert constructions == ["meta"]


@pytest.mark.parametrize("change, message", [
    ({"n_layer": 3}, r"missing keys: layers\.2\.attention\.wo\.weight, .*layers\.2\.ffn_norm\.weight$"),
    ({"vocab_size": 41}, r"shape mismatches: output\.weight: checkpoint \(40, 64\) vs model \(41, 64\), "
                         r"tok_embeddings\.weight: checkpoint \(40, 64\) vs model \(41, 64\)$"),
    ({"dim": 8192, "n_head": 64}, r"shape mismatches: cls_embedding\.embedding_table\.weight: checkpoint "
                                  r"\(6, 64\) vs model \(6, 8192\), .* \(18 in all\)$"),
], ids=["a-layer-more", "another-vocabulary", "wider"])
def test_a_config_that_does_not_fit_its_weights_names_the_keys_before_anything_is_allocated(
        change: dict, message: str, tmp_path: Path, constructions) -> None:
    folder = with_config(save_pretrained(randomised(LlamaGenGPT(TINY_GPT)), tmp_path), **change)
    with pytest.raises(CheckpointError, match=f"^{folder / 'model.safetensors'} does not match the LlamaGenGPT of "
                                              f"{folder / 'config.json'}: {message}"):
        from_pretrained(folder)
    assert constructions == ["meta"]


def test_models_over_max_params_are_refused_unless_the_limit_is_raised(tmp_path: Path, constructions) -> None:
    folder = save_pretrained(randomised(LlamaGenGPT(TINY_GPT)), tmp_path)
    size = sum(t.numel() for t in LlamaGenGPT(TINY_GPT).state_dict().values())
    constructions.clear()
    with pytest.raises(CheckpointError, match=f"^the LlamaGenGPT of {folder / 'config.json'} holds {size:,} values "
                                              f"in its parameters and buffers, over the limit of 1,000: pass "
                                              f"max_params={size} to load a model this large$"):
        from_pretrained(folder, max_params=1000)
    assert constructions == ["meta"]
    assert from_pretrained(folder, max_params=size).config == TINY_GPT
    assert constructions == ["meta", "meta", "cpu"]


def test_every_shipped_model_builds_on_the_meta_device_to_its_weights_header() -> None:
    for path in SHIPPED_CONFIGS:
        meta = json.loads(path.read_text())
        model_cls, config_cls = MODEL_CLASSES[meta["class"]]
        with meta_device():
            skeleton = model_cls(config_cls.from_dict(meta["config"]))
        state = skeleton.state_dict()
        assert all(t.is_meta for t in state.values()), path
        assert {k: tuple(t.shape) for k, t in state.items()} == safetensors_shapes(path.parent / "model.safetensors")


def test_the_meta_build_skips_value_initialisation_and_so_never_imports_dynamo() -> None:
    """normal_, trunc_normal_ and F.normalize have Python meta kernels that import torch._dynamo (seconds)."""
    code = "import sys; import vgen; vgen.load('shapes-c2i'); print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["False"]
    with meta_device():
        layer = torch.nn.Linear(3, 4)
        assert torch.nn.init.trunc_normal_(layer.weight) is layer.weight
        assert torch.nn.functional.normalize(layer.weight).shape == (4, 3)
        assert torch.empty(4, 3).unsqueeze_(0).shape == (1, 4, 3)  # shape changes still happen


def test_save_pretrained_rejects_unregistered_classes(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="Linear is not a registered vgen model class"):
        save_pretrained(torch.nn.Linear(2, 2), tmp_path)


@dataclass(frozen=True)
class ScaleConfig(ModelConfig):
    width: int = size(3)


class Scale(torch.nn.Module):
    def __init__(self, config: ScaleConfig) -> None:
        super().__init__()
        self.config, self.weight = config, torch.nn.Parameter(torch.randn(config.width))


def test_a_registered_outside_class_round_trips(tmp_path: Path) -> None:
    model = Scale(ScaleConfig(width=5))
    with pytest.raises(TypeError, match="Scale is not a registered vgen model class"):
        save_pretrained(model, tmp_path / "scale")
    register_model_class("Scale", Scale, ScaleConfig)
    try:
        loaded = from_pretrained(save_pretrained(model, tmp_path / "scale"))
    finally:
        MODEL_CLASSES.pop("Scale")
    assert isinstance(loaded, Scale) and loaded.config == model.config and torch.equal(loaded.weight, model.weight)


def test_a_class_whose_config_is_not_a_checked_model_config_is_not_registered() -> None:
    @dataclass(frozen=True)
    class LooseConfig:
        width: int = 3

    with pytest.raises(TypeError, match="the config class of Loose must derive from .*ModelConfig"):
        register_model_class("Loose", Scale, LooseConfig)
    assert "Loose" not in MODEL_CLASSES


# ---- strict loading ----------------------------------------------------------------------------------------


def test_load_weights_names_missing_unexpected_and_misshapen_keys() -> None:
    state = tiny_state()
    del state["layers.1.ffn_norm.weight"]
    state["layers.0.attention.bias"] = torch.zeros(3)
    state["tok_embeddings.weight"] = torch.zeros(41, 64)
    with pytest.raises(CheckpointError) as err:
        load_weights(LlamaGenGPT(TINY_GPT), state, source="c2i_B_256.pt")
    message = str(err.value)
    assert message.startswith("c2i_B_256.pt does not match LlamaGenGPT")
    assert "missing keys: layers.1.ffn_norm.weight" in message
    assert "unexpected keys: layers.0.attention.bias" in message
    assert "tok_embeddings.weight: checkpoint (41, 64) vs model (40, 64)" in message


@pytest.mark.parametrize("problem", ["missing", "unexpected", "shape"])
def test_each_kind_of_mismatch_alone_raises_and_leaves_the_model_untouched(problem: str) -> None:
    state = tiny_state()
    if problem == "missing":
        del state["output.weight"]
    elif problem == "unexpected":
        state["freqs_cis"] = torch.zeros(17, 8, 2)
    else:
        state["layers.0.feed_forward.w2.weight"] = torch.zeros(256, 64)
    model = LlamaGenGPT(TINY_GPT)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    expected = {"missing": "missing keys: output.weight", "unexpected": "unexpected keys: freqs_cis",
                "shape": r"w2.weight: checkpoint \(256, 64\) vs model \(64, 256\)"}[problem]
    with pytest.raises(CheckpointError, match=expected):
        load_weights(model, state)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_long_key_lists_are_clipped() -> None:
    with pytest.raises(CheckpointError, match=r"missing keys: .*\(18 in all\)"):
        load_weights(LlamaGenGPT(TINY_GPT), {})


def test_ignored_prefixes_are_dropped_before_the_strict_check() -> None:
    state = tiny_state() | {"freqs_cis": torch.zeros(3)}
    model = LlamaGenGPT(TINY_GPT)
    load_weights(model, state, ignore=("freqs_cis",))
    assert torch.equal(model.output.weight, state["output.weight"])


# ---- LlamaGen .pt files ------------------------------------------------------------------------------------

LLAMAGEN_FORMATS = {
    # train_c2i.py also pickles its argparse options and the optimizer next to the weights
    "ddp": lambda sd: {"model": sd, "optimizer": {}, "steps": 1000,
                       "args": argparse.Namespace(gpt_model="GPT-B", lr=1e-4)},
    "ema": lambda sd: {"ema": sd},
    "fsdp": lambda sd: sd,
    "deepspeed": lambda sd: {"module": {f"module.{k}": v for k, v in sd.items()}},
    "compiled": lambda sd: {"state_dict": {f"_orig_mod.{k}": v for k, v in sd.items()}},
}


@pytest.mark.parametrize("fmt", list(LLAMAGEN_FORMATS))
def test_tiny_llamagen_checkpoints_load_in_every_format(fmt: str, tmp_path: Path) -> None:
    state = tiny_state()
    torch.save(LLAMAGEN_FORMATS[fmt](state), tmp_path / "ckpt.pt")
    model = LlamaGenGPT(TINY_GPT)
    load_weights(model, read_torch_checkpoint(tmp_path / "ckpt.pt", "GPT"))
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


@pytest.mark.slow
def test_gpt_b_checkpoints_in_llamagens_formats_load(tmp_path: Path) -> None:
    """A GPT-B-sized state dict (bf16, 222 MB) written the way LlamaGen's scripts write it, loaded into a bf16
    GPT-B; each tensor is filled with its own index, so every key must land in its own parameter."""
    shapes = llamagen_gpt_shapes(n_layer=12, dim=768, hidden=2048, vocab=16384, num_classes=1000)
    state = {k: torch.full(s, float(i), dtype=torch.bfloat16) for i, (k, s) in enumerate(shapes.items())}
    with torch.device("meta"):
        model = LlamaGenGPT(gpt_config("GPT-B", vocab_size=16384, num_classes=1000))
    model = model.to(torch.bfloat16).to_empty(device="cpu")
    for fmt in ("ddp", "ema", "fsdp"):
        path = tmp_path / f"c2i_B_256_{fmt}.pt"
        torch.save(LLAMAGEN_FORMATS[fmt](state), path)
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(-1.0)
        load_weights(model, read_torch_checkpoint(path, "GPT"), source=path.name)
        index = {k: float(i) for i, k in enumerate(shapes)}
        assert all(bool((v == index[k]).all()) for k, v in model.state_dict().items())
        path.unlink()
    assert sum(p.numel() for p in model.parameters()) == sum(t.numel() for t in state.values())


def test_a_gpt_b_checkpoint_does_not_fit_gpt_l(tmp_path: Path) -> None:
    shapes = llamagen_gpt_shapes(n_layer=12, dim=768, hidden=2048, vocab=16384, num_classes=1000)
    state = {k: torch.empty(s, device="meta") for k, s in shapes.items()}
    with torch.device("meta"):
        model = LlamaGenGPT(gpt_config("GPT-L"))
    expected = (r"missing keys: layers\.12\..*shape mismatches: "
                r"cls_embedding\.embedding_table\.weight: checkpoint \(1001, 768\) vs model \(1001, 1024\)")
    with pytest.raises(CheckpointError, match=expected):
        load_weights(model, state)


def test_missing_llamagen_checkpoint_says_where_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="GPT checkpoint not found: .*c2i_L_384.pt.*LlamaGen"):
        read_torch_checkpoint(tmp_path / "c2i_L_384.pt", "GPT")
    with pytest.raises(TypeError, match="^the GPT checkpoint must be a str or Path, got NoneType$"):
        read_torch_checkpoint(None, "GPT")


class Doubler(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * x


def write_truncated(path: Path) -> None:
    torch.save({"model": tiny_state()}, path)
    path.write_bytes(path.read_bytes()[:2000])


UNREADABLE = {
    "random-bytes": lambda path: path.write_bytes(torch.randint(0, 256, (4096,), dtype=torch.uint8,
                                                                generator=torch.Generator().manual_seed(0))
                                                  .numpy().tobytes()),
    "empty": lambda path: path.write_bytes(b""),
    "truncated-zip": write_truncated,
    "pickled-object": lambda path: torch.save({"model": tiny_state(), "hook": Path("/")}, path),
    "torchscript": lambda path: torch.jit.save(torch.jit.script(Doubler()), str(path)),
}


@pytest.mark.parametrize("kind", list(UNREADABLE))
def test_an_unreadable_checkpoint_is_named_as_corrupt_without_advice_to_unpickle_it(kind: str,
                                                                                    tmp_path: Path) -> None:
    path = tmp_path / "vq_ds16_c2i.pt"
    UNREADABLE[kind](path)
    with pytest.raises(CheckpointError) as e:
        read_torch_checkpoint(path, "VQ")
    assert str(e.value) == f"cannot read VQ checkpoint {path}: the file is corrupt or not a checkpoint"


def test_checkpoints_without_a_state_dict_are_refused(tmp_path: Path) -> None:
    torch.save(torch.zeros(3), tmp_path / "tensor.pt")
    with pytest.raises(CheckpointError, match="holds a Tensor, not a state dict"):
        read_torch_checkpoint(tmp_path / "tensor.pt", "GPT")
    torch.save({"steps": 3, "args": {"lr": 1e-4}}, tmp_path / "empty.pt")
    with pytest.raises(CheckpointError, match="holds no tensors"):
        read_torch_checkpoint(tmp_path / "empty.pt", "GPT")
