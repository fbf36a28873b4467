"""The KL tokenizer: images <-> scaled raster-order continuous tokens, and its config checks."""

import pytest
import torch

from vgen.hub import from_pretrained, save_pretrained
from vgen.tokenizers.kl import KLConfig, KLTokenizer

TOY = KLConfig(block_out_channels=(8, 8), norm_num_groups=4, image_size=16, latent_channels=3, latent_scale=2.0)


def test_tokens_are_the_scaled_posterior_means_in_raster_order():
    torch.manual_seed(0)
    tok = KLTokenizer(TOY).eval()
    x = torch.rand(2, 3, 16, 16) * 2 - 1
    tokens = tok.encode(x)
    assert tok.grid_size == 8 and tok.downsample_factor == 2 and tokens.shape == (2, 64, 3)
    mean = tok.posterior(x).mean  # [B, C, 8, 8]
    assert torch.allclose(tokens[1, 8 * 2 + 5], 2.0 * mean[1, :, 2, 5], atol=1e-6)  # row 2, column 5
    with torch.no_grad():
        expected = tok.decode_latents(mean).clamp(-1, 1)
    assert torch.allclose(tok.decode(tokens), expected, atol=1e-5)


def test_round_trip_through_save_and_load(tmp_path):
    tok = KLTokenizer(TOY).eval()
    save_pretrained(tok, tmp_path / "kl")
    loaded = from_pretrained(tmp_path / "kl")
    x = torch.rand(1, 3, 16, 16) * 2 - 1
    assert loaded.config == TOY and torch.equal(loaded.encode(x), tok.encode(x))


def test_bad_configs_and_token_shapes_are_refused():
    with pytest.raises(ValueError, match="divisible by norm_num_groups"):
        KLConfig(block_out_channels=(8, 12), norm_num_groups=8)
    with pytest.raises(ValueError, match="not divisible by the downsampling"):
        KLConfig(block_out_channels=(8, 8, 8), norm_num_groups=4, image_size=18)
    with pytest.raises(ValueError, match=r"expected tokens \[B, 64, 3\]"):
        KLTokenizer(TOY).decode(torch.zeros(1, 63, 3))


def test_latent_frames_are_the_tokens_of_each_frame_channel_last():
    """A clip [B, T, S, S, 3] goes to latent frames [B, T, h, w, C] and back, frame by frame, as encode / decode
    do for one image."""
    torch.manual_seed(0)
    tok = KLTokenizer(TOY).eval()
    clip = torch.rand(2, 3, 16, 16, 3) * 2 - 1
    latents = tok.encode_frames(clip)
    assert latents.shape == (2, 3, 8, 8, 3)
    frame = clip[1, 2].permute(2, 0, 1)[None]  # batch 1, frame 2 as an image [1, 3, S, S]
    assert torch.allclose(latents[1, 2].reshape(64, 3), tok.encode(frame)[0], atol=1e-6)
    decoded = tok.decode_frames(latents)
    assert decoded.shape == clip.shape
    assert torch.allclose(decoded[1, 2], tok.decode(tok.encode(frame))[0].permute(1, 2, 0), atol=1e-5)
    with pytest.raises(ValueError, match=r"expected frames \[..., 16, 16, 3\]"):
        tok.encode_frames(torch.zeros(1, 2, 32, 32, 3))
