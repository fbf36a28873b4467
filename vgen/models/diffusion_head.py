"""MAR's diffusion head: an MLP with AdaLN that denoises one continuous token given the transformer's output.

Layout as in MAR's ``SimpleMLPAdaLN``: the noisy token is projected to the head width, the timestep (sinusoidal,
256 frequencies, then an MLP) and the condition vector are embedded and summed into ``y``, and ``depth`` residual
blocks ``x + gate * MLP(modulate(LN(x), shift, scale))`` take their shift / scale / gate from ``y``. A final
AdaLN layer outputs ``2 * C`` channels: the noise prediction and the learned-range variance value. AdaLN and
output layers start at zero, so an untrained head predicts zero noise and the midpoint variance.

:meth:`DiffusionHead.sample` runs the whole reverse chain with the noise it is given (initial token plus one
draw per step), which lets a draft and a target head follow aligned trajectories; classifier-free guidance
mixes the noise predictions of a [cond; uncond] batch that shares the noise, as MAR does. The chain's steps run in
:func:`reverse_steps`, a few at a time, which the continuous samplers can hand to ``torch.compile``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from vgen.models.config_fields import ModelConfig, declare, size
from vgen.models.gaussian_diffusion import DiffusionSchedule, cosine_alpha_bar, reverse_step, sampling_timesteps
from vgen.models.linear import Linear


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
        self.mlp = nn.Sequential(Linear(width, width, reused=True), nn.SiLU(), Linear(width, width, reused=True))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), Linear(width, 3 * width, reused=True))

    def forward(self, x: torch.Tensor, modulation: torch.Tensor) -> torch.Tensor:
        """``modulation``: this block's ``adaLN_modulation(y)``, shift, scale and gate side by side."""
        shift, scale, gate = modulation.chunk(3, dim=-1)
        return x + gate * self.mlp(modulate(self.in_ln(x), shift, scale))


class FinalLayer(nn.Module):
    def __init__(self, width: int, out_channels: int) -> None:
        super().__init__()
        self.norm_final = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.linear = Linear(width, out_channels, reused=True)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), Linear(width, 2 * width, reused=True))

    def forward(self, x: torch.Tensor, modulation: torch.Tensor) -> torch.Tensor:
        """``modulation``: this layer's ``adaLN_modulation(y)``, shift and scale side by side."""
        shift, scale = modulation.chunk(2, dim=-1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


MODULATION_BYTES = 32 * 2**20
"""Memory a reverse chain may spend on AdaLN modulations computed ahead for several steps at once."""

STEPS_PER_CALL = 5
"""Reverse steps one call of a chain's step function runs (:func:`reverse_steps`). Compiled, a call is one graph
(100 steps: 20 graph calls); longer calls unroll into larger graphs, slower to compile
(``benchmarks/continuous_compiled.py`` times both)."""


MAX_DIFFUSION_STEPS = 1 << 16
"""The most timesteps a diffusion schedule has (MAR trains with 1000): its tables are built step by step."""


@dataclass(frozen=True)
class HeadConfig(ModelConfig):
    """The head's token channels, the width of the condition it reads, its own width and residual blocks, and its
    diffusion: ``num_train_steps`` timesteps, respaced to ``num_sampling_steps`` for sampling."""

    token_channels: int = size(16)
    cond_dim: int = size(768)
    width: int = size(1024)
    depth: int = size(6)
    num_train_steps: int = size(1000, at_most=MAX_DIFFUSION_STEPS)
    num_sampling_steps: int = size(100, at_most=MAX_DIFFUSION_STEPS)
    clip_x0: float = declare(0.0, at_least=0)  # > 0: clamp the implied clean token while sampling (0 = off, as in MAR)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_sampling_steps > self.num_train_steps:
            raise ValueError(f"num_sampling_steps {self.num_sampling_steps} is more than num_train_steps "
                             f"{self.num_train_steps}")


class DiffusionHead(nn.Module):
    """Noise (and variance) prediction for tokens x_t [B, C] at timesteps t [B] given conditions z [B, cond_dim]."""

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.cfg = cfg
        w = cfg.width
        self.time_embed = nn.Sequential(Linear(256, w, reused=True), nn.SiLU(), Linear(w, w, reused=True))
        self.cond_embed = Linear(cfg.cond_dim, w, reused=True)
        self.input_proj = Linear(cfg.token_channels, w, reused=True)
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
        return self.predict(x, self.embed_time(t) + self.cond_embed(z))

    def embed_time(self, t: torch.Tensor) -> torch.Tensor:
        """Timesteps [B] -> their embeddings [B, width]."""
        return self.time_embed(timestep_embedding(t).to(self.cond_embed.weight.dtype))

    def predict(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Noise and variance outputs [B, 2C] for tokens x [B, C] given ``y``, the sum of the timestep's and the
        condition's embeddings."""
        return self.predict_modulated(x, self.modulations(y))

    def modulations(self, y: torch.Tensor) -> list[torch.Tensor]:
        """Every AdaLN layer's modulation of ``y`` [..., width], blocks first, then the final layer. They depend on
        the timestep and condition only, not on the token, so a reverse chain computes many steps' at once."""
        return [block.adaLN_modulation(y) for block in self.res_blocks] + [self.final_layer.adaLN_modulation(y)]

    def predict_modulated(self, x: torch.Tensor, modulations: list[torch.Tensor]) -> torch.Tensor:
        """:meth:`predict` with the modulations already computed."""
        h = self.input_proj(x)
        for block, modulation in zip(self.res_blocks, modulations):
            h = block(h, modulation)
        return self.final_layer(h, modulations[-1])

    def sampling_schedule(self, num_steps: int | None = None) -> DiffusionSchedule:
        n = num_steps or self.cfg.num_sampling_steps
        if n not in self._sampling:
            alpha_bar = cosine_alpha_bar(self.cfg.num_train_steps)
            self._sampling[n] = DiffusionSchedule(alpha_bar, sampling_timesteps(self.cfg.num_train_steps, n))
        return self._sampling[n]

    def sample(self, z: torch.Tensor, noise: torch.Tensor, temperature: float = 1.0,
               cfg_scale: float | torch.Tensor = 1.0, num_steps: int | None = None,
               guided: bool | None = None, steps: ChainSteps | None = None,
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Denoise one token per row; returns (x0, mean, std) of the last reverse step, each [B, C] in fp32.

        ``noise`` [steps + 1, B, C] holds the initial token and the draw of each reverse step (last step first
        consumed last). When ``guided`` (by default: ``cfg_scale > 1``), ``z`` is [2B, cond_dim] as [cond; uncond]
        and the guided noise prediction ``uncond + s * (cond - uncond)`` drives both halves, ``s`` the scale or
        a scale per row ([B]); the variance is the conditional half's. ``steps`` runs the chain
        :data:`STEPS_PER_CALL` steps at a time: :func:`reverse_steps` or a compiled copy of it.
        """
        if guided is None:
            guided = isinstance(cfg_scale, torch.Tensor) or cfg_scale > 1
        schedule = self.sampling_schedule(num_steps)
        count = len(schedule)
        if noise.shape[0] != count + 1:
            raise ValueError(f"noise must hold {count + 1} draws (initial + {count} steps), got {noise.shape[0]}")
        run = steps or reverse_steps
        x = noise[0].float()
        mean = std = x
        condition = self.cond_embed(z)
        order = list(reversed(range(count)))  # the chain runs from the noisiest kept step down
        times = self.embed_time(schedule.timesteps.to(z.device))[order]
        coefficients = schedule.coefficients(z.device)[order]
        per_chunk = self._steps_per_chunk(z)
        for start in range(0, count, per_chunk):
            modulations = self.modulations(times[start:start + per_chunk][:, None] + condition[None])
            for a in range(0, len(modulations[0]), STEPS_PER_CALL):
                first, b = start + a, a + STEPS_PER_CALL
                x, mean, std = run(self, x, [m[a:b] for m in modulations],
                                   coefficients[first:first + STEPS_PER_CALL],
                                   noise[1 + first:1 + first + STEPS_PER_CALL], temperature, cfg_scale, guided)
        return x, mean, std

    def _steps_per_chunk(self, z: torch.Tensor) -> int:
        """How many steps' modulations a chain computes at once: as many as fit in ``MODULATION_BYTES``, a
        multiple of :data:`STEPS_PER_CALL` (at least one call's)."""
        layers = [block.adaLN_modulation[-1] for block in self.res_blocks] + [self.final_layer.adaLN_modulation[-1]]
        per_step = z.shape[0] * sum(layer.out_features for layer in layers) * z.element_size()
        return max(1, MODULATION_BYTES // per_step // STEPS_PER_CALL) * STEPS_PER_CALL


ChainSteps = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
"""The signature of :func:`reverse_steps`."""


def reverse_steps(head: DiffusionHead, x: torch.Tensor, modulations: list[torch.Tensor], coefficients: torch.Tensor,
                  noise: torch.Tensor, temperature: float, cfg_scale: float | torch.Tensor,
                  guided: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``len(noise)`` reverse steps of ``head`` from tokens x [B, C] (fp32): step j reads every AdaLN layer's
    modulation ``[j]`` ([steps, rows, *], rows [cond; uncond] when ``guided``), its schedule's
    ``coefficients[j]`` (:meth:`~vgen.models.gaussian_diffusion.DiffusionSchedule.coefficients`) and the draw
    ``noise[j]`` [B, C]; returns (x, mean, std) of the last step (see :meth:`DiffusionHead.sample`).

    A function of its inputs alone, so that ``torch.compile`` makes it one graph (the continuous samplers'
    ``compile``): a step is some 40 small operations, which eagerly cost more in dispatch than in arithmetic."""
    c = head.cfg.token_channels
    dtype = modulations[0].dtype
    for j in range(len(noise)):
        h = x.to(dtype)
        out = head.predict_modulated(torch.cat([h, h]) if guided else h, [m[j] for m in modulations]).float()
        if guided:
            cond, uncond = out.chunk(2)
            scale = cfg_scale[:, None] if isinstance(cfg_scale, torch.Tensor) else cfg_scale
            eps = uncond[:, :c] + scale * (cond[:, :c] - uncond[:, :c])
            v = cond[:, c:]
        else:
            eps, v = out[:, :c], out[:, c:]
        x, mean, std = reverse_step(eps, v.clamp(-1, 1), x, coefficients[j], noise[j].float(), temperature,
                                    head.cfg.clip_x0)
    return x, mean, std
