"""Chameleon's VQGAN (taming-transformers' VQModel, as Lumina-mGPT reads it from ``ckpts/chameleon/tokenizer/``) in
vgen's :class:`VQModel`: a tiny checkpoint in taming's layout loads strictly; its codes equal ``transformers``'
``ChameleonVQVAE.encode`` on the same weights (``transformers``' converter copies taming's encoder keys unchanged),
and its decoder equals a reference decode written here from taming's ``Decoder``; a bad file is one line."""

from __future__ import annotations

import re
import shutil

import pytest
import torch
import torch.nn.functional as F

from vgen.hub import CheckpointError
from vgen.models.chameleon import TOKENIZER_DIR, load_vqgan, vqgan_config, vqgan_state_dict
from vgen.tokenizers.vq import VQConfig

transformers = pytest.importorskip("transformers", reason="the parity test needs transformers (pip install -e .[t2i])")


@pytest.fixture(scope="module")
def tokenizer_dir(tiny_lumina_dir):
    return tiny_lumina_dir / TOKENIZER_DIR


@pytest.fixture(scope="module")
def taming(tokenizer_dir) -> dict[str, torch.Tensor]:
    return torch.load(tokenizer_dir / "vqgan.ckpt", weights_only=True)["state_dict"]


def test_vqgan_yaml_is_a_raw_codebook_vq_with_middle_attention_only(tokenizer_dir) -> None:
    config = vqgan_config(tokenizer_dir / "vqgan.yaml")
    assert config == VQConfig(codebook_size=4, codebook_embed_dim=4, codebook_l2_norm=False, ch=32,
                              ch_mult=(1, 1, 1, 1, 2), num_res_blocks=1, z_channels=32, level_attn=False)
    assert config.downsample_factor == 16


def test_taming_keys_map_onto_vgen_keys(tokenizer_dir, taming) -> None:
    """Encoder levels keep their number, decoder levels run reversed (taming's ``up.4`` is the decoder's first)."""
    state = vqgan_state_dict(taming, vqgan_config(tokenizer_dir / "vqgan.yaml"))
    pairs = {"decoder.conv_blocks.0.res.0.conv1.weight": "decoder.up.4.block.0.conv1.weight",
             "decoder.conv_blocks.1.res.0.nin_shortcut.weight": "decoder.up.3.block.0.nin_shortcut.weight",
             "decoder.conv_blocks.3.upsample.conv.bias": "decoder.up.1.upsample.conv.bias",
             "encoder.conv_blocks.4.res.0.nin_shortcut.weight": "encoder.down.4.block.0.nin_shortcut.weight",
             "encoder.conv_blocks.0.downsample.conv.weight": "encoder.down.0.downsample.conv.weight",
             "encoder.mid.1.q.weight": "encoder.mid.attn_1.q.weight",
             "decoder.mid.2.conv1.bias": "decoder.mid.block_2.conv1.bias"}
    assert all(state[vgen] is taming[key] for vgen, key in pairs.items())


@torch.no_grad()
def test_codes_equal_transformers_chameleon_vqvae_encode(tokenizer_dir, taming) -> None:
    vq = load_vqgan(tokenizer_dir)
    config = transformers.ChameleonVQVAEConfig(embed_dim=4, num_embeddings=4, base_channels=32, latent_channels=32,
                                               channel_multiplier=[1, 1, 1, 1, 2], num_res_blocks=1, resolution=64,
                                               attn_resolutions=[])
    hf = transformers.ChameleonVQVAE(config).eval()
    hf.load_state_dict({k: v for k, v in taming.items() if not k.startswith("decoder.")}, strict=True)
    images = torch.rand(3, 3, 64, 64, generator=torch.Generator().manual_seed(0)) * 2 - 1
    out = hf.encode(images)
    quant, codes, _ = vq.encode(images)
    assert codes.shape == (3, 4, 4)
    assert len(set(codes.flatten().tolist())) > 1  # a test over one code would hide an order mismatch
    assert torch.equal(codes.flatten(), out.image_tokens)
    torch.testing.assert_close(quant, out.quantized_last_hidden_state, rtol=1e-4, atol=1e-5)


def taming_decode(sd: dict[str, torch.Tensor], z: torch.Tensor, levels: int, res_blocks: int) -> torch.Tensor:
    """taming's ``post_quant_conv`` + ``Decoder.forward`` on its own state dict (``attn_resolutions: []``)."""
    def conv(x, name, pad=1):
        return F.conv2d(x, sd[name + ".weight"], sd[name + ".bias"], padding=pad)

    def norm(x, name):
        return F.group_norm(x, 32, sd[name + ".weight"], sd[name + ".bias"], eps=1e-6)

    def res(x, name):
        h = conv(F.silu(norm(x, name + ".norm1")), name + ".conv1")
        h = conv(F.silu(norm(h, name + ".norm2")), name + ".conv2")
        return (conv(x, name + ".nin_shortcut", 0) if name + ".nin_shortcut.weight" in sd else x) + h

    def attn(x, name):
        b, c, hh, ww = x.shape
        y = norm(x, name + ".norm")
        q, k, v = (conv(y, f"{name}.{p}", 0).reshape(b, c, hh * ww) for p in "qkv")
        w = torch.softmax(q.transpose(1, 2) @ k * c ** -0.5, dim=2)
        return x + conv((v @ w.transpose(1, 2)).reshape(b, c, hh, ww), name + ".proj_out", 0)

    h = conv(conv(z, "post_quant_conv", 0), "decoder.conv_in")
    h = res(attn(res(h, "decoder.mid.block_1"), "decoder.mid.attn_1"), "decoder.mid.block_2")
    for i in reversed(range(levels)):
        for j in range(res_blocks + 1):
            h = res(h, f"decoder.up.{i}.block.{j}")
        if i:
            h = conv(F.interpolate(h, scale_factor=2.0, mode="nearest"), f"decoder.up.{i}.upsample.conv")
    return conv(F.silu(norm(h, "decoder.norm_out")), "decoder.conv_out")


@torch.no_grad()
def test_decode_code_equals_taming_decoder(tokenizer_dir, taming) -> None:
    vq = load_vqgan(tokenizer_dir)
    codes = torch.tensor([[[0, 1], [2, 3]], [[3, 3], [1, 0]]])
    z = taming["quantize.embedding.weight"][codes].permute(0, 3, 1, 2)  # taming's get_codebook_entry
    expected = taming_decode(taming, z, levels=5, res_blocks=1)
    assert expected.shape == (2, 3, 32, 32)
    torch.testing.assert_close(vq.decode_code(codes), expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(vq.codebook(), taming["quantize.embedding.weight"])  # raw rows (LANTERN's space)


class LightningState:
    """Stands for the trainer objects a Lightning checkpoint pickles beside the weights."""


def test_a_pickle_that_needs_code_is_refused_and_vqgan_safetensors_is_read_instead(tokenizer_dir, taming,
                                                                                  tmp_path) -> None:
    from safetensors.torch import save_file

    folder = tmp_path / "tokenizer"
    folder.mkdir()
    shutil.copy(tokenizer_dir / "vqgan.yaml", folder)
    torch.save({"state_dict": taming, "callbacks": LightningState()}, folder / "vqgan.ckpt")
    with pytest.raises(CheckpointError) as err:
        load_vqgan(folder)
    message = str(err.value)
    assert "\n" not in message and str(folder / "vqgan.ckpt") in message
    assert str(folder / "vqgan.safetensors") in message
    save_file(taming, str(folder / "vqgan.safetensors"))
    codes = torch.tensor([[[0, 1], [2, 3]]])
    torch.testing.assert_close(load_vqgan(folder).decode_code(codes), load_vqgan(tokenizer_dir).decode_code(codes))


@pytest.mark.parametrize(("edit", "expected"), [
    (lambda y: y.replace("attn_resolutions: []", "attn_resolutions: [16]"), "attn_resolutions [16] is not supported"),
    (lambda y: y.replace("    n_embed:", "    n_embeds:"), "'n_embed' missing"),
    (lambda y: y.replace("double_z: false", "double_z: true"), "double_z"),
    (lambda y: y.replace("ch: 32", "ch: 30"), "norm_groups"),
    (lambda y: y + "  : [", "not a readable YAML"),
])
def test_a_bad_vqgan_yaml_is_one_line_naming_it(tokenizer_dir, tmp_path, edit, expected) -> None:
    path = tmp_path / "vqgan.yaml"
    path.write_text(edit((tokenizer_dir / "vqgan.yaml").read_text()))
    with pytest.raises(ValueError, match=re.escape(expected)) as err:
        vqgan_config(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_weights_that_do_not_fit_the_yaml_are_one_line(tokenizer_dir, taming, tmp_path) -> None:
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    shutil.copy(tokenizer_dir / "vqgan.yaml", folder)
    torch.save({"state_dict": {k: v for k, v in taming.items() if k != "decoder.up.0.block.1.conv2.weight"}},
               folder / "vqgan.ckpt")
    with pytest.raises(CheckpointError, match="missing keys: decoder.conv_blocks.4.res.1.conv2.weight") as err:
        load_vqgan(folder)
    assert "\n" not in str(err.value) and "vqgan.ckpt" in str(err.value)


def test_taming_training_loss_weights_in_the_checkpoint_are_left_out(tokenizer_dir, taming, tmp_path) -> None:
    """A taming checkpoint saved from training also holds its loss (LPIPS and the discriminator) under ``loss.``."""
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    shutil.copy(tokenizer_dir / "vqgan.yaml", folder)
    torch.save({"state_dict": {**taming, "loss.discriminator.main.0.weight": torch.ones(4, 3, 4, 4)}},
               folder / "vqgan.ckpt")
    codes = torch.tensor([[[0, 1], [2, 3]]])
    torch.testing.assert_close(load_vqgan(folder).decode_code(codes), load_vqgan(tokenizer_dir).decode_code(codes))
