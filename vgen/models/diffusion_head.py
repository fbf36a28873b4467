"""MAR's diffusion head: an MLP with AdaLN that denoises one continuous token given the transformer's output.

Layout as in MAR's ``SimpleMLPAdaLN``: the noisy token is projected to the head width, the timestep (sinusoidal,
256 frequencies, then an MLP) and the condition vector are embedded and summed into ``y``, and ``depth`` residual
blocks ``x + gate * MLP(modulate(LN(x), shift, scale))`` take their shift / scale / gate from ``y``. A final
AdaLN layer outputs ``2 * C`` channels: the noise prediction and the learned-range variance value. AdaLN and
output layers start at zero, so an untrained head predicts zero noise and the midpoint variance.

:meth:`DiffusionHead.sample` runs the whole reverse chain with the noise it is given (initial token plus one
draw per step), which lets a draft and a target head follow aligned trajectories; classifier-free guidance
mixes the noise predictions of a [cond; uncond] batch that shares the noise, as MAR does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from vgen.models.gaussian_diffusion import DiffusionSchedule, cosine_alpha_bar, reverse_step, sampling_timesteps


def timestep_embedding(t: torch.Tensor, dim: int = 256, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal embedding [B, dim] of (integer or fractional) timesteps [B]: cosines then sines."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


class ResBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.in_ln = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 3 * width))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        shift, scale, gate = self.adaLN_modulation(y).chunk(3, dim=-1)
        return x + gate * self.mlp(modulate(self.in_ln(x), shift, scale))


class FinalLayer(nn.Module):
    def __init__(self, width: int, out_channels: int) -> None:
        super().__init__()
        self.norm_final = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(width, out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 2 * width))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(y).chunk(2, dim=-1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


@dataclass(frozen=True)
class HeadConfig:
    token_channels: int = 16
    cond_dim: int = 768
    width: int = 1024
    depth: int = 6
    num_train_steps: int = 1000
    num_sampling_steps: int = 100
    clip_x0: float = 0.0  # > 0: clamp the implied clean token while sampling (0 = off, as in MAR)


class DiffusionHead(nn.Module):
    """Noise (and variance) prediction for tokens x_t [B, C] at timesteps t [B] given conditions z [B, cond_dim]."""

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.cfg = cfg
        w = cfg.width
        self.time_embed = nn.Sequential(nn.Linear(256, w), nn.SiLU(), nn.Linear(w, w))
        self.cond_embed = nn.Linear(cfg.cond_dim, w)
        self.input_proj = nn.Linear(cfg.token_channels, w)
        self.res_blocks = nn.ModuleList(ResBlock(w) for _ in range(cfg.depth))
        self.final_layer = FinalLayer(w, 2 * cfg.token_channels)
        self._init_weights()
        self.train_schedule = DiffusionSchedule(cosine_alpha_bar(cfg.num_train_steps), range(cfg.num_train_steps))
        self._sampling: dict[int, DiffusionSchedule] = {}

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.time_embed[0].weight, std=0.02)
        nn.init.normal_(self.time_embed[2].weight, std=0.02)
        for block in self.res_blocks:
            nn.init.zeros_(block.adaLN_modulation[-1].weight)
            nn.init.zeros_(block.adaLN_modulation[-1].bias)
        for layer in (self.final_layer.adaLN_modulation[-1], self.final_layer.linear):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor, t: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        h = self.input_proj(x)
        y = self.time_embed(timestep_embedding(t).to(h.dtype)) + self.cond_embed(z)
        for block in self.res_blocks:
            h = block(h, y)
        return self.final_layer(h, y)

    def sampling_schedule(self, num_steps: int | None = None) -> DiffusionSchedule:
        n = num_steps or self.cfg.num_sampling_steps
        if n not in self._sampling:
            alpha_bar = cosine_alpha_bar(self.cfg.num_train_steps)
            self._sampling[n] = DiffusionSchedule(alpha_bar, sampling_timesteps(self.cfg.num_train_steps, n))
        return self._sampling[n]

    def sample(self, z: torch.Tensor, noise: torch.Tensor, temperature: float = 1.0, cfg_scale: float = 1.0,
               num_steps: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Denoise one token per row; returns (x0, mean, std) of the last reverse step, each [B, C].

        ``noise`` [steps + 1, B, C] holds the initial token and the draw of each reverse step (last step first
        consumed last). With ``cfg_scale > 1``, ``z`` is [2B, cond_dim] as [cond; uncond] and the guided noise
        prediction ``uncond + s * (cond - uncond)`` drives both halves; the variance is the conditional half's.
        """
        schedule = self.sampling_schedule(num_steps)
        steps, c = len(schedule), self.cfg.token_channels
        if noise.shape[0] != steps + 1:
            raise ValueError(f"noise must hold {steps + 1} draws (initial + {steps} steps), got {noise.shape[0]}")
        guided = cfg_scale > 1
        x = noise[0].to(z.dtype)
        mean = std = x
        for k, i in enumerate(reversed(range(steps))):
            t = schedule.timesteps[i].to(z.device).expand(z.shape[0])
            out = self(torch.cat([x, x]) if guided else x, t, z).to(x.dtype)
            if guided:
                cond, uncond = out.chunk(2)
                eps = uncond[:, :c] + cfg_scale * (cond[:, :c] - uncond[:, :c])
                v = cond[:, c:]
            else:
                eps, v = out[:, :c], out[:, c:]
            x, mean, std = reverse_step(eps, v.clamp(-1, 1), x, i, schedule, noise[k + 1].to(x.dtype), temperature,
                                        self.cfg.clip_x0)
        return x, mean, std
