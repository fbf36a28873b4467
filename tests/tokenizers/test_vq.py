"""LlamaGen VQ tokenizer: the L2-normalised codebook lookup against an independent nearest-neighbour search,
``decode_code`` against ``decode``, the downsampling of VQ-16 / VQ-8, and LlamaGen's checkpoint key layout
(reference notes, section 1.8) on reduced-width configs so the tests stay fast.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from vgen.hub import from_pretrained, save_pretrained
from vgen.tokenizers.vq import VQ_CONFIGS, VQConfig, VQModel

# two levels (downsampling 2), narrow channels: a few thousand parameters
SMALL = VQConfig(codebook_size=32, codebook_embed_dim=4, ch=8, ch_mult=(1, 2), num_res_blocks=1, z_channels=8,
                 norm_groups=4)


def make_vq(config: VQConfig = SMALL, seed: int = 0) -> VQModel:
    """Eval model whose codebook rows have very different norms, so that normalising changes the lookup."""
    torch.manual_seed(seed)
    model = VQModel(config)
    with torch.no_grad():
        w = model.quantize.embedding.weight
        w.copy_(torch.randn_like(w) * torch.logspace(-1, 1, w.shape[0])[:, None])
    return model.eval()


def images(batch: int = 2, size: int = 8, seed: int = 1) -> torch.Tensor:
    return torch.rand(batch, 3, size, size, generator=torch.Generator().manual_seed(seed)) * 2 - 1


@torch.no_grad()
def test_codes_are_the_nearest_normalised_codebook_rows() -> None:
    model = make_vq()
    x = images()
    quant, codes, _ = model.encode(x)
    z = model.quant_conv(model.encoder(x)).permute(0, 2, 3, 1).reshape(-1, 4)
    z_n = z / z.norm(dim=-1, keepdim=True)
    book = model.quantize.embedding.weight
    book_n = book / book.norm(dim=-1, keepdim=True)
    expected = torch.cdist(z_n.double(), book_n.double()).argmin(dim=1)
    assert codes.shape == (2, 4, 4) and codes.dtype == torch.long
    assert torch.equal(codes.flatten(), expected)
    # the test can tell: without normalisation the nearest rows are different ones
    assert not torch.equal(torch.cdist(z.double(), book.double()).argmin(dim=1), expected)
    torch.testing.assert_close(quant.permute(0, 2, 3, 1).reshape(-1, 4), book_n[expected], atol=1e-6, rtol=0)


def test_codebook_is_the_normalised_embedding() -> None:
    model = make_vq()
    book = model.codebook()
    assert book.shape == (32, 4)
    torch.testing.assert_close(book.norm(dim=-1), torch.ones(32))
    torch.testing.assert_close(book, F.normalize(model.quantize.embedding.weight, dim=-1))


@torch.no_grad()
def test_without_l2_norm_the_raw_codebook_is_searched() -> None:
    model = make_vq(replace(SMALL, codebook_l2_norm=False))
    x = images()
    _, codes, _ = model.encode(x)
    z = model.quant_conv(model.encoder(x)).permute(0, 2, 3, 1).reshape(-1, 4)
    expected = torch.cdist(z.double(), model.quantize.embedding.weight.double()).argmin(dim=1)
    assert torch.equal(codes.flatten(), expected)


@torch.no_grad()
def test_decode_code_of_the_codes_equals_decode_of_the_quantised_latents() -> None:
    model = make_vq()
    quant, codes, _ = model.encode(images())
    pixels = model.decode_code(codes)
    assert pixels.shape == (2, 3, 8, 8)
    torch.testing.assert_close(pixels, model.decode(quant), atol=1e-5, rtol=0)
    assert torch.equal(model.decode_code(codes.flatten(1), grid=(4, 4)), pixels)  # LlamaGen's flat layout


@pytest.mark.parametrize(("name", "factor"), [("VQ-16", 16), ("VQ-8", 8)])
@torch.no_grad()
def test_downsampling_factor(name: str, factor: int) -> None:
    config = replace(VQ_CONFIGS[name], ch=8, norm_groups=8, z_channels=16, codebook_size=16)
    assert VQ_CONFIGS[name].downsample_factor == factor
    model = VQModel(config).eval()
    assert model.downsample_factor == factor
    quant, codes, _ = model.encode(images(1, 32))
    assert codes.shape == (1, 32 // factor, 32 // factor)
    assert quant.shape == (1, 8, 32 // factor, 32 // factor)
    assert model.decode_code(codes).shape == (1, 3, 32, 32)


def test_llamagen_vq_configs() -> None:
    vq16, vq8 = VQ_CONFIGS["VQ-16"], VQ_CONFIGS["VQ-8"]
    assert (vq16.codebook_size, vq16.codebook_embed_dim, vq16.codebook_l2_norm) == (16384, 8, True)
    assert (vq16.ch, vq16.ch_mult, vq16.num_res_blocks, vq16.z_channels) == (128, (1, 1, 2, 2, 4), 2, 256)
    assert vq8.ch_mult == (1, 2, 2, 4)
    assert VQConfig.from_dict(vq16.to_dict()) == vq16


# VQ-16's layout at a quarter of the width (ch 32): widths 32, 32, 64, 64, 128 from top to bottom.
REDUCED_VQ16 = replace(VQ_CONFIGS["VQ-16"], ch=32, norm_groups=32, codebook_size=64)
LLAMAGEN_VQ16_KEYS = {
    "encoder.conv_in.weight": (32, 3, 3, 3),
    "encoder.conv_blocks.0.res.0.conv1.weight": (32, 32, 3, 3),
    "encoder.conv_blocks.0.downsample.conv.weight": (32, 32, 3, 3),
    "encoder.conv_blocks.2.res.0.nin_shortcut.weight": (64, 32, 1, 1),
    "encoder.conv_blocks.3.downsample.conv.weight": (64, 64, 3, 3),
    "encoder.conv_blocks.4.res.0.nin_shortcut.weight": (128, 64, 1, 1),
    "encoder.conv_blocks.4.res.1.norm2.weight": (128,),
    "encoder.conv_blocks.4.attn.0.q.weight": (128, 128, 1, 1),
    "encoder.conv_blocks.4.attn.1.proj_out.bias": (128,),
    "encoder.mid.0.conv1.weight": (128, 128, 3, 3),
    "encoder.mid.1.norm.weight": (128,),
    "encoder.mid.1.k.weight": (128, 128, 1, 1),
    "encoder.mid.2.conv2.weight": (128, 128, 3, 3),
    "encoder.norm_out.weight": (128,),
    "encoder.conv_out.weight": (256, 128, 3, 3),
    "decoder.conv_in.weight": (128, 256, 3, 3),
    "decoder.mid.1.v.weight": (128, 128, 1, 1),
    "decoder.conv_blocks.0.res.2.conv2.weight": (128, 128, 3, 3),
    "decoder.conv_blocks.0.attn.2.proj_out.weight": (128, 128, 1, 1),
    "decoder.conv_blocks.0.upsample.conv.weight": (128, 128, 3, 3),
    "decoder.conv_blocks.1.res.0.nin_shortcut.weight": (64, 128, 1, 1),
    "decoder.conv_blocks.3.res.0.nin_shortcut.weight": (32, 64, 1, 1),
    "decoder.conv_blocks.3.upsample.conv.weight": (32, 32, 3, 3),
    "decoder.conv_blocks.4.res.2.conv1.weight": (32, 32, 3, 3),
    "decoder.norm_out.bias": (32,),
    "decoder.conv_out.weight": (3, 32, 3, 3),
    "quantize.embedding.weight": (64, 8),
    "quantize.codebook_used": (65536,),
    "quant_conv.weight": (8, 256, 1, 1),
    "post_quant_conv.weight": (256, 8, 1, 1),
}
# LlamaGen's VQ_16() state dict has 344 entries; no key outside this layout may appear
LLAMAGEN_VQ16_NUM_KEYS = 344
ABSENT_KEYS = [
    "encoder.conv_blocks.4.downsample.conv.weight",  # no downsampling after the lowest resolution
    "decoder.conv_blocks.4.upsample.conv.weight",  # nor upsampling after the highest
    "encoder.conv_blocks.3.attn.0.q.weight",  # encoder attention only at the lowest resolution
    "decoder.conv_blocks.1.attn.0.q.weight",  # decoder attention only in its first (lowest) level
    "encoder.conv_blocks.1.res.0.nin_shortcut.weight",  # shortcuts only where the width changes
    "decoder.conv_blocks.2.res.0.nin_shortcut.weight",
    "encoder.conv_blocks.0.res.2.conv1.weight",  # 2 res blocks per encoder level, 3 per decoder level
]


def test_llamagen_vq16_key_layout() -> None:
    state = VQModel(REDUCED_VQ16).state_dict()
    got = {k: tuple(state[k].shape) for k in LLAMAGEN_VQ16_KEYS if k in state}
    assert got == LLAMAGEN_VQ16_KEYS
    assert len(state) == LLAMAGEN_VQ16_NUM_KEYS
    assert not [k for k in ABSENT_KEYS if k in state]
    assert sum(k.endswith("attn.0.q.weight") for k in state) == 2  # encoder level 4 and decoder level 0
    assert sum(".nin_shortcut.weight" in k for k in state) == 4


@pytest.mark.parametrize("bad", [-1, 32])
def test_out_of_range_codes_raise(bad: int) -> None:
    model = make_vq()
    codes = torch.zeros(1, 4, 4, dtype=torch.long)
    codes[0, 2, 1] = bad
    with pytest.raises(ValueError, match=r"codes must lie in \[0, 32\)"):
        model.decode_code(codes)


def test_codes_of_the_wrong_rank_raise() -> None:
    with pytest.raises(ValueError, match=r"\[B, h, w\]"):
        make_vq().decode_code(torch.zeros(1, 16, dtype=torch.long))


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="not divisible by norm_groups=32"):
        VQConfig(ch=48)
    with pytest.raises(ValueError, match="codebook"):
        VQConfig(codebook_size=1)
    with pytest.raises(ValueError, match="encoder must be one of"):
        VQConfig(encoder="vit")


def test_encode_has_a_straight_through_gradient() -> None:
    model = make_vq()
    x = images().requires_grad_()
    quant, _, loss = model.encode(x)
    assert loss.ndim == 0 and loss.item() > 0
    quant.sum().backward()
    assert x.grad is not None and torch.count_nonzero(x.grad) > 0


def latents_before_and_after_changing_one_patch(config: VQConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Encoder latents [B, C, 4, 4] of 8-px images, and of the same images with patch (row 1, col 2) redrawn."""
    model = make_vq(config)
    x = images()
    changed = x.clone()
    changed[:, :, 2:4, 4:6] = torch.rand(2, 3, 2, 2) * 2 - 1
    with torch.no_grad():
        return model.encoder(x), model.encoder(changed)


def test_a_patch_encoder_code_reads_only_its_own_patch() -> None:
    before, after = latents_before_and_after_changing_one_patch(replace(SMALL, encoder="patch"))
    moved = (before - after).abs().amax(dim=(0, 1))  # [4, 4]
    assert moved[1, 2] > 1e-3
    moved[1, 2] = 0
    assert torch.equal(moved, torch.zeros_like(moved))


def test_the_conv_encoder_mixes_the_whole_frame_into_every_code() -> None:
    before, after = latents_before_and_after_changing_one_patch(SMALL)
    assert bool(((before - after).abs().amax(dim=(0, 1)) > 1e-6).all())


def test_a_patch_encoder_model_round_trips_through_its_config(tmp_path) -> None:
    model = make_vq(replace(SMALL, encoder="patch"))
    save_pretrained(model, tmp_path)
    loaded = from_pretrained(tmp_path)
    assert loaded.config.encoder == "patch"
    x = images()
    with torch.no_grad():
        assert torch.equal(loaded.encode(x)[1], model.encode(x)[1])
