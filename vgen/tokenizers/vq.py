"""LlamaGen-compatible VQ tokenizer (``tokenizer/tokenizer_image/vq_model.py`` layout).

Parameter names, shapes and numerics follow LlamaGen's released ``vq_ds16_c2i.pt`` / ``vq_ds8_c2i.pt`` so that
those files load strictly; the same class with a small :class:`VQConfig` is the tokenizer of vgen's embedded
models. Codes index an L2-normalised codebook: both the encoder output and the codebook rows are normalised
before the nearest-neighbour lookup.

``encoder="patch"`` swaps LlamaGen's convolutional encoder for one that reads each code's own pixel patch and
nothing else (a vgen variant, not in LlamaGen's files): a patch that does not change between two video frames then
keeps its code. LlamaGen's encoder mixes the whole frame into every code (3x3 convolutions, attention and
GroupNorm's statistics over the frame), so a small moving object changes codes everywhere.

``codebook_l2_norm=False, level_attn=False`` is taming's VQGAN (the layout of Chameleon's image tokenizer, read by
:func:`vgen.models.chameleon.load_vqgan`): a raw codebook, and attention in the middle blocks only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vgen.models.config_fields import ModelConfig, declare, probability, size

ENCODER_KINDS = ("conv", "patch")


@dataclass(frozen=True)
class VQConfig(ModelConfig):
    """Architecture of a VQ model; defaults are LlamaGen's VQ-16."""

    codebook_size: int = size(16384, at_least=2)
    codebook_embed_dim: int = size(8)
    codebook_l2_norm: bool = declare(True)
    commit_loss_beta: float = declare(0.25, at_least=0)
    ch: int = size(128)
    ch_mult: tuple[int, ...] = size((1, 1, 2, 2, 4), length=(1, 12))
    num_res_blocks: int = size(2)
    z_channels: int = size(256)
    norm_groups: int = size(32)
    dropout: float = probability(0.0)
    encoder: str = declare("conv", choices=ENCODER_KINDS)
    # LlamaGen's attention block after each residual block of the encoder's last level and the decoder's first;
    # taming's VQGAN with ``attn_resolutions: []`` (Chameleon's tokenizer) has only the middle blocks' attention
    level_attn: bool = declare(True)

    def __post_init__(self) -> None:
        super().__post_init__()
        first = (self.ch,) if self.encoder == "conv" else ()  # the conv encoder's first stage is ch wide
        for width in (*first, *(self.ch * m for m in self.ch_mult)):
            if width % self.norm_groups:
                raise ValueError(f"channel width {width} is not divisible by norm_groups={self.norm_groups}")

    @property
    def downsample_factor(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)


VQ_CONFIGS: dict[str, VQConfig] = {
    "VQ-16": VQConfig(ch_mult=(1, 1, 2, 2, 4)),
    "VQ-8": VQConfig(ch_mult=(1, 2, 2, 4)),
}


def _norm(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(num_groups=groups, num_channels=channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, groups: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = _norm(in_ch, groups)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, 1, 1)
        self.norm2 = _norm(out_ch, groups)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, 1, 1)
        if in_ch != out_ch:
            self.nin_shortcut = nn.Conv2d(in_ch, out_ch, 1, 1, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        if hasattr(self, "nin_shortcut"):
            x = self.nin_shortcut(x)
        return x + h


class AttnBlock(nn.Module):
    """Single-head spatial self-attention with 1x1 projections."""

    def __init__(self, ch: int, groups: int) -> None:
        super().__init__()
        self.norm = _norm(ch, groups)
        self.q = nn.Conv2d(ch, ch, 1)
        self.k = nn.Conv2d(ch, ch, 1)
        self.v = nn.Conv2d(ch, ch, 1)
        self.proj_out = nn.Conv2d(ch, ch, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        y = self.norm(x)
        q, k, v = (m(y).reshape(b, 1, c, h * w).transpose(-1, -2) for m in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v)
        return x + self.proj_out(out.transpose(-1, -2).reshape(b, c, h, w))


class Downsample(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, 2, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x.float(), scale_factor=2.0, mode="nearest").to(x.dtype))


def _run_level(block: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """One resolution level: its residual blocks, each followed by its attention block where the level has them."""
    for i, res in enumerate(block.res):
        h = res(h)
        if len(block.attn):
            h = block.attn[i](h)
    return h


class Encoder(nn.Module):
    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        g, n = cfg.norm_groups, len(cfg.ch_mult)
        self.conv_in = nn.Conv2d(3, cfg.ch, 3, 1, 1)
        in_mult = (1, *cfg.ch_mult)
        self.conv_blocks = nn.ModuleList()
        block_in = cfg.ch
        for level in range(n):
            block = nn.Module()
            block.res, block.attn = nn.ModuleList(), nn.ModuleList()
            block_in, block_out = cfg.ch * in_mult[level], cfg.ch * cfg.ch_mult[level]
            for _ in range(cfg.num_res_blocks):
                block.res.append(ResnetBlock(block_in, block_out, g, cfg.dropout))
                block_in = block_out
                if level == n - 1 and cfg.level_attn:
                    block.attn.append(AttnBlock(block_in, g))
            if level != n - 1:
                block.downsample = Downsample(block_in)
            self.conv_blocks.append(block)
        self.mid = nn.ModuleList([ResnetBlock(block_in, block_in, g, cfg.dropout), AttnBlock(block_in, g),
                                  ResnetBlock(block_in, block_in, g, cfg.dropout)])
        self.norm_out = _norm(block_in, g)
        self.conv_out = nn.Conv2d(block_in, cfg.z_channels, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for block in self.conv_blocks:
            h = _run_level(block, h)
            if hasattr(block, "downsample"):
                h = block.downsample(h)
        for m in self.mid:
            h = m(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class PositionNorm(nn.Module):
    """LayerNorm over the channels of each position of a [B, C, H, W] map (no statistics across positions)."""

    def __init__(self, ch: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(ch, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class PatchMLPBlock(nn.Module):
    """Pre-norm residual MLP applied to each position on its own (1x1 convolutions)."""

    def __init__(self, ch: int) -> None:
        super().__init__()
        self.norm = PositionNorm(ch)
        self.fc1 = nn.Conv2d(ch, 4 * ch, 1)
        self.fc2 = nn.Conv2d(4 * ch, ch, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.silu(self.fc1(self.norm(x))))


class PatchEncoder(nn.Module):
    """Each output position from its own ``downsample_factor``-pixel patch only: a strided patch embedding, then as
    many residual MLP blocks as the conv encoder has residual blocks (levels x num_res_blocks + 2 in the middle)."""

    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        width, f = cfg.ch * cfg.ch_mult[-1], cfg.downsample_factor
        self.conv_in = nn.Conv2d(3, width, f, f)
        self.blocks = nn.ModuleList(PatchMLPBlock(width) for _ in range(len(cfg.ch_mult) * cfg.num_res_blocks + 2))
        self.norm_out = PositionNorm(width)
        self.conv_out = nn.Conv2d(width, cfg.z_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for block in self.blocks:
            h = block(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        g, n = cfg.norm_groups, len(cfg.ch_mult)
        block_in = cfg.ch * cfg.ch_mult[-1]
        self.conv_in = nn.Conv2d(cfg.z_channels, block_in, 3, 1, 1)
        self.mid = nn.ModuleList([ResnetBlock(block_in, block_in, g, cfg.dropout), AttnBlock(block_in, g),
                                  ResnetBlock(block_in, block_in, g, cfg.dropout)])
        self.conv_blocks = nn.ModuleList()
        for level in range(n):
            block = nn.Module()
            block.res, block.attn = nn.ModuleList(), nn.ModuleList()
            block_out = cfg.ch * cfg.ch_mult[n - level - 1]
            for _ in range(cfg.num_res_blocks + 1):
                block.res.append(ResnetBlock(block_in, block_out, g, cfg.dropout))
                block_in = block_out
                if level == 0 and cfg.level_attn:
                    block.attn.append(AttnBlock(block_in, g))
            if level != n - 1:
                block.upsample = Upsample(block_in)
            self.conv_blocks.append(block)
        self.norm_out = _norm(block_in, g)
        self.conv_out = nn.Conv2d(block_in, 3, 3, 1, 1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)
        for m in self.mid:
            h = m(h)
        for block in self.conv_blocks:
            h = _run_level(block, h)
            if hasattr(block, "upsample"):
                h = block.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class VectorQuantizer(nn.Module):
    """Nearest-neighbour codebook lookup with a straight-through gradient."""

    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        self.l2_norm = cfg.codebook_l2_norm
        self.beta = cfg.commit_loss_beta
        self.embedding = nn.Embedding(cfg.codebook_size, cfg.codebook_embed_dim)
        self.embedding.weight.data.uniform_(-1.0 / cfg.codebook_size, 1.0 / cfg.codebook_size)
        if self.l2_norm:
            self.embedding.weight.data = F.normalize(self.embedding.weight.data, p=2, dim=-1)
        # LlamaGen keeps a usage ring buffer in its checkpoints; kept so that they load strictly.
        self.register_buffer("codebook_used", torch.zeros(65536))

    def codebook(self) -> torch.Tensor:
        """The (normalised) code vectors the lookup compares against, shape [codebook_size, dim]."""
        w = self.embedding.weight
        return F.normalize(w, p=2, dim=-1) if self.l2_norm else w

    def lookup(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Channel-last vectors [..., dim] -> (normalised inputs, nearest code indices)."""
        if self.l2_norm:
            z = F.normalize(z, p=2, dim=-1)
        flat = z.reshape(-1, z.shape[-1]).float()
        book = self.codebook().float()
        # |z - e|^2 = |z|^2 + |e|^2 - 2 z.e; |z|^2 is the same for every code, so the argmin needs only the rest,
        # in one fused matmul (the full sum cost three passes over an [N, codebook] matrix, 40% of encoding)
        dist = torch.addmm(book.pow(2).sum(1), flat, book.t(), alpha=-2.0)
        return z, dist.argmin(dim=1).reshape(z.shape[:-1])

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[B, C, H, W] -> (quantised z with straight-through grad, codes [B, H, W], vq + commit loss)."""
        z = z.permute(0, 2, 3, 1)
        z, codes = self.lookup(z)
        z_q = self.codebook()[codes].to(z.dtype)
        loss = F.mse_loss(z_q, z.detach()) + self.beta * F.mse_loss(z_q.detach(), z)
        z_q = z + (z_q - z).detach()
        return z_q.permute(0, 3, 1, 2).contiguous(), codes, loss

    def embed_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes [B, H, W] -> channel-first code vectors [B, dim, H, W]."""
        return self.codebook()[codes].permute(0, 3, 1, 2).contiguous()


class VQModel(nn.Module):
    """Encoder -> quant_conv -> codebook -> post_quant_conv -> decoder; pixels live in [-1, 1]."""

    def __init__(self, config: VQConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = PatchEncoder(config) if config.encoder == "patch" else Encoder(config)
        self.decoder = Decoder(config)
        self.quantize = VectorQuantizer(config)
        self.quant_conv = nn.Conv2d(config.z_channels, config.codebook_embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(config.codebook_embed_dim, config.z_channels, 1)

    @property
    def codebook_size(self) -> int:
        return self.config.codebook_size

    @property
    def downsample_factor(self) -> int:
        return self.config.downsample_factor

    def codebook(self) -> torch.Tensor:
        """The code vectors the tokens index (LANTERN builds its neighbourhoods from these)."""
        return self.quantize.codebook()

    def encode(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Images [B, 3, H, W] in [-1, 1] -> (quantised latents, codes [B, h, w], vq loss)."""
        return self.quantize(self.quant_conv(self.encoder(images)))

    def decode(self, quant: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.post_quant_conv(quant))

    def decode_code(self, codes: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        """Codes [B, h, w] (or [B, h*w] with ``grid``) -> images [B, 3, H, W] in about [-1, 1]."""
        if grid is not None:
            codes = codes.reshape(codes.shape[0], *grid)
        if codes.dim() != 3:
            raise ValueError(f"codes must be [B, h, w] or [B, h*w] with grid=(h, w); got shape {tuple(codes.shape)}")
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.codebook_size):
            raise ValueError(f"codes must lie in [0, {self.codebook_size}); got [{int(codes.min())}, "
                             f"{int(codes.max())}]")
        return self.decode(self.quantize.embed_codes(codes))

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Reconstruction, codes and vq loss (training)."""
        quant, codes, loss = self.encode(images)
        return self.decode(quant), codes, loss
