"""Continuous tokenizer: a small KL-regularised autoencoder (diffusers' ``AutoencoderKL``) to a token grid.

The shapes default maps 64x64 images to a 16x16 grid of 4-channel latents (three resolution levels, a 4x
reduction), as MAR's kl16 maps 256x256 images to 16x16x16. Tokens for an AR model are the posterior means in
raster order, multiplied by ``latent_scale`` (fitted after training so that they have unit standard deviation,
the role of MAR's 0.2325) so that the diffusion head's noise schedule sees unit-scale data.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vgen.models.backbone import GRID_LIMIT
from vgen.models.config_fields import ModelConfig, declare, size


@dataclass(frozen=True)
class KLConfig(ModelConfig):
    """diffusers' ``AutoencoderKL`` sizes (its channels per level, 2x downsampled between them), the image side it
    codes, and the factor its latents are scaled by."""

    block_out_channels: tuple[int, ...] = size((32, 64, 64), length=(1, 12))
    layers_per_block: int = size(1)
    latent_channels: int = size(4)
    norm_num_groups: int = size(16)
    image_size: int = size(64, at_most=GRID_LIMIT)
    latent_scale: float = declare(1.0, above=0)

    def __post_init__(self) -> None:
        super().__post_init__()
        if any(c % self.norm_num_groups for c in self.block_out_channels):
            raise ValueError(f"every channel count in {self.block_out_channels} must be divisible by "
                             f"norm_num_groups {self.norm_num_groups}")
        if self.image_size % self.downsample_factor:
            raise ValueError(f"image_size {self.image_size} is not divisible by the downsampling "
                             f"{self.downsample_factor}")

    @property
    def downsample_factor(self) -> int:
        return 2 ** (len(self.block_out_channels) - 1)


class KLTokenizer(nn.Module):
    """Images in [-1, 1] [B, 3, H, W] <-> continuous tokens [B, h * w, C] (raster order, scaled)."""

    def __init__(self, config: KLConfig = KLConfig()) -> None:
        super().__init__()
        from diffusers import AutoencoderKL

        self.config = config
        n = len(config.block_out_channels)
        self.vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * n,
                                 up_block_types=("UpDecoderBlock2D",) * n,
                                 block_out_channels=config.block_out_channels,
                                 layers_per_block=config.layers_per_block, latent_channels=config.latent_channels,
                                 norm_num_groups=config.norm_num_groups, sample_size=config.image_size)

    @property
    def downsample_factor(self) -> int:
        return self.config.downsample_factor

    @property
    def grid_size(self) -> int:
        return self.config.image_size // self.downsample_factor

    def posterior(self, images: torch.Tensor):
        """diffusers' diagonal Gaussian posterior over latents [B, C, h, w] (unscaled)."""
        return self.vae.encode(images).latent_dist

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Unscaled latents [B, C, h, w] -> images [B, 3, H, W]."""
        return self.vae.decode(latents).sample

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images -> tokens [B, h * w, C]: the posterior means, scaled, in raster order."""
        mean = self.posterior(images.to(self.vae.dtype)).mean * self.config.latent_scale
        return mean.flatten(2).transpose(1, 2).float()

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Tokens [B, h * w, C] -> images in [-1, 1] [B, 3, H, W]."""
        b, n, c = tokens.shape
        side = self.grid_size
        if n != side * side or c != self.config.latent_channels:
            raise ValueError(f"expected tokens [B, {side * side}, {self.config.latent_channels}], got "
                             f"{tuple(tokens.shape)}")
        latents = (tokens / self.config.latent_scale).transpose(1, 2).reshape(b, c, side, side)
        return self.decode_latents(latents.to(self.vae.dtype)).float().clamp(-1, 1)

    # -- latent frames: the channel-last layout of video models (a block-diffusion model in latent space) ---------
    def check_latent_frames(self, side: int, channels: int) -> None:
        """Raise ``ValueError`` unless this tokenizer's latent frames are ``side x side x channels`` (a latent
        model's frames)."""
        if (self.grid_size, self.config.latent_channels) != (side, channels):
            raise ValueError(f"the tokenizer's latent frames ({self.grid_size} x {self.grid_size} x "
                             f"{self.config.latent_channels}) are not the model's ({side} x {side} x {channels})")

    @torch.no_grad()
    def encode_frames(self, frames: torch.Tensor) -> torch.Tensor:
        """Frames [..., S, S, 3] in [-1, 1] -> latent frames [..., h, w, C]: the same scaled posterior means as
        :meth:`encode`, one small image per frame."""
        size, side = self.config.image_size, self.grid_size
        if tuple(frames.shape[-3:]) != (size, size, 3):
            raise ValueError(f"expected frames [..., {size}, {size}, 3], got {tuple(frames.shape)}")
        lead = frames.shape[:-3]
        images = frames.reshape(-1, size, size, 3).permute(0, 3, 1, 2)
        return self.encode(images).reshape(*lead, side, side, self.config.latent_channels)

    @torch.no_grad()
    def decode_frames(self, latents: torch.Tensor) -> torch.Tensor:
        """Latent frames [..., h, w, C] -> frames [..., S, S, 3] in [-1, 1] (:meth:`decode` per frame)."""
        lead = latents.shape[:-3]
        h, w, c = latents.shape[-3:]
        images = self.decode(latents.reshape(-1, h * w, c))
        return images.permute(0, 2, 3, 1).reshape(*lead, *images.shape[2:], 3)
