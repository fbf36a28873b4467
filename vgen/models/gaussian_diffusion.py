"""Gaussian diffusion for one continuous token at a time: MAR's cosine schedule with learned-range variance.

Training uses the full 1000-step cosine schedule (``alpha_bar`` from diffusers' ``squaredcos_cap_v2`` betas);
sampling respaces it to ``num_sampling_steps`` kept timesteps (diffusers' ``linspace`` spacing, which keeps 999
and 0; one step keeps 999 alone) and recomputes the betas between them, as improved-diffusion's respacing does.
The head predicts noise ``eps`` and a value ``v`` in [-1, 1] that interpolates the log-variance between the
posterior's and beta's.

Every reverse step is an explicit Gaussian ``x_prev = mean + exp(logvar / 2) * temperature * noise`` with the
noise passed in, including the last step, which MAR leaves noiseless. Keeping it gives every token, given the
noise of its trajectory, the density N(mean_0, std_0^2) that continuous speculative decoding compares between a
draft and a target; two models fed the same noise follow aligned trajectories.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch


def cosine_alpha_bar(num_train_steps: int = 1000) -> torch.Tensor:
    """Cumulative alpha products of the cosine schedule (betas clipped at 0.999), float64 [num_train_steps]."""
    from diffusers import DDPMScheduler

    scheduler = DDPMScheduler(num_train_timesteps=num_train_steps, beta_schedule="squaredcos_cap_v2")
    return torch.cumprod(1.0 - scheduler.betas.double(), dim=0)


def sampling_timesteps(num_train_steps: int, num_sampling_steps: int) -> list[int]:
    """The kept timesteps, in increasing order, of a schedule respaced to ``num_sampling_steps``: diffusers'
    ``linspace`` spacing, which keeps the first and the last. One step keeps the last alone: a chain starts from
    pure noise, which only the noisiest timestep describes (``linspace`` would keep timestep 0)."""
    from diffusers import DDPMScheduler

    if not 1 <= num_sampling_steps <= num_train_steps:
        raise ValueError(f"num_sampling_steps must be in [1, {num_train_steps}], got {num_sampling_steps}")
    if num_sampling_steps == 1:
        return [num_train_steps - 1]
    scheduler = DDPMScheduler(num_train_timesteps=num_train_steps, beta_schedule="squaredcos_cap_v2",
                              timestep_spacing="linspace")
    scheduler.set_timesteps(num_sampling_steps)
    return sorted({int(t) for t in scheduler.timesteps})


class DiffusionSchedule:
    """Per-step coefficients of a (possibly respaced) schedule given ``alpha_bar`` at its kept timesteps.

    Index ``i`` is the i-th kept step in increasing noise; ``timesteps[i]`` is the training timestep the model
    is told. All tables are float64 on the CPU and cast on use.
    """

    def __init__(self, alpha_bar: torch.Tensor, timesteps: Sequence[int]) -> None:
        self.timesteps = torch.tensor(list(timesteps), dtype=torch.long)
        ab = alpha_bar[self.timesteps].double()
        ab_prev = torch.cat([torch.ones(1, dtype=torch.float64), ab[:-1]])
        self.alpha_bar, self.alpha_bar_prev = ab, ab_prev
        self.betas = 1.0 - ab / ab_prev
        posterior_var = self.betas * (1.0 - ab_prev) / (1.0 - ab)
        # the posterior variance is 0 at the first step; improved-diffusion clips its log to the next step's. A
        # one-step schedule has no next step: it takes 1 - alpha_bar of timestep 0, the clip a two-step one comes to
        first = posterior_var[1:2] if len(ab) > 1 else 1.0 - alpha_bar[:1].double()
        self.posterior_log_var = torch.log(torch.cat([first, posterior_var[1:]]))
        self.log_betas = torch.log(self.betas)
        self.sqrt_alpha_bar, self.sqrt_one_minus_alpha_bar = ab.sqrt(), (1.0 - ab).sqrt()
        self.coef_x0 = self.betas * ab_prev.sqrt() / (1.0 - ab)
        self.coef_xt = (1.0 - ab_prev) * (1.0 - self.betas).sqrt() / (1.0 - ab)
        self._coefficients: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.timesteps)

    @staticmethod
    def _at(table: torch.Tensor, index: torch.Tensor | int, like: torch.Tensor) -> torch.Tensor | float:
        """``table`` at ``index``: per row [B, 1, ...] for a tensor of steps, or one Python float for a step shared
        by every row (sampling), which spares a reverse step the indexing and casting of small tensors."""
        if isinstance(index, int):
            return float(table[index])
        return table.to(like.device)[index].to(like.dtype).reshape(-1, *([1] * (like.ndim - 1)))

    def q_sample(self, x0: torch.Tensor, index: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Noise clean tokens x0 [B, C] to step ``index`` [B]."""
        return (self._at(self.sqrt_alpha_bar, index, x0) * x0
                + self._at(self.sqrt_one_minus_alpha_bar, index, x0) * noise)

    def posterior_mean(self, x0: torch.Tensor, xt: torch.Tensor, index: torch.Tensor | int) -> torch.Tensor:
        """Mean of q(x_prev | x_t, x0)."""
        return self._at(self.coef_x0, index, x0) * x0 + self._at(self.coef_xt, index, x0) * xt

    def posterior(self, x0: torch.Tensor, xt: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and log-variance of q(x_prev | x_t, x0)."""
        return self.posterior_mean(x0, xt, index), self._at(self.posterior_log_var, index, x0).expand_as(x0)

    def p_mean_logvar(self, eps: torch.Tensor, v: torch.Tensor, xt: torch.Tensor, index: torch.Tensor | int,
                      clip_x0: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`reverse_gaussian` at per-row steps ``index`` [B] or one step for every row."""
        return reverse_gaussian(eps, v, xt, [self._at(getattr(self, name), index, xt) for name in COEFFICIENTS],
                                clip_x0)

    def coefficients(self, device: torch.device | str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[steps, 6]: the :data:`COEFFICIENTS` of every kept step (row i: step i), what a sampling chain reads
        (:func:`reverse_step`); made once per device and dtype."""
        key = (torch.device(device), dtype)
        if key not in self._coefficients:
            table = torch.stack([getattr(self, name) for name in COEFFICIENTS], dim=1)
            self._coefficients[key] = table.to(device=key[0], dtype=dtype)
        return self._coefficients[key]


COEFFICIENTS = ("sqrt_one_minus_alpha_bar", "sqrt_alpha_bar", "log_betas", "posterior_log_var", "coef_x0", "coef_xt")
"""The schedule tables a reverse step reads, in the order :func:`reverse_gaussian` takes them."""


def reverse_gaussian(eps: torch.Tensor, v: torch.Tensor, xt: torch.Tensor,
                     coefficients: Sequence[torch.Tensor | float] | torch.Tensor,
                     clip_x0: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's reverse Gaussian (mean, log-variance) from its noise prediction and variance output ``v``
    (learned range) at a step whose :data:`COEFFICIENTS` are ``coefficients`` (numbers, per-row tensors or a row of
    :meth:`DiffusionSchedule.coefficients`).

    ``clip_x0`` > 0 clamps the implied clean token to [-clip_x0, clip_x0] (improved-diffusion's ``clip_denoised``
    for a known latent range): at the noisiest steps the clean estimate divides the noise prediction's error by
    sqrt(alpha_bar) ~ 5e-5, which a small, briefly trained head cannot afford.
    """
    sqrt_one_minus_ab, sqrt_ab, log_beta, posterior_log_var, coef_x0, coef_xt = coefficients
    x0 = (xt - sqrt_one_minus_ab * eps) / sqrt_ab
    if clip_x0 > 0:
        x0 = x0.clamp(-clip_x0, clip_x0)
    frac = (v + 1.0) / 2.0
    return coef_x0 * x0 + coef_xt * xt, frac * log_beta + (1.0 - frac) * posterior_log_var


def normal_kl(mean1: torch.Tensor, logvar1: torch.Tensor, mean2: torch.Tensor, logvar2: torch.Tensor) -> torch.Tensor:
    """KL(N(mean1, e^logvar1) || N(mean2, e^logvar2)) per element, in nats."""
    return 0.5 * (-1.0 + logvar2 - logvar1 + torch.exp(logvar1 - logvar2) + (mean1 - mean2) ** 2 * torch.exp(-logvar2))


def gaussian_nll(x: torch.Tensor, mean: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """-log N(x; mean, e^logvar) per element, in nats."""
    return 0.5 * (math.log(2 * math.pi) + logvar + (x - mean) ** 2 * torch.exp(-logvar))


HeadFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def training_loss(head: HeadFn, schedule: DiffusionSchedule, x0: torch.Tensor, cond: torch.Tensor,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """MAR's hybrid objective per token [B]: noise MSE plus the variational bound (bits per dim) for the variance.

    The bound's mean uses the detached noise prediction, so it trains only the variance (improved-diffusion).
    At the first step the bound is the Gaussian negative log-likelihood of x0 (continuous latents, no bins).
    """
    b, c = x0.shape
    index = torch.randint(0, len(schedule), (b,), device=x0.device, generator=generator)
    noise = torch.randn(x0.shape, device=x0.device, dtype=x0.dtype, generator=generator)
    xt = schedule.q_sample(x0, index, noise)
    out = head(xt, schedule.timesteps.to(x0.device)[index], cond).float()
    eps, v = out[:, :c], out[:, c:]
    mse = (eps - noise).pow(2).mean(-1)
    mean, logvar = schedule.p_mean_logvar(eps.detach(), v, xt, index)
    true_mean, true_logvar = schedule.posterior(x0, xt, index)
    kl = normal_kl(true_mean, true_logvar, mean, logvar).mean(-1)
    nll = gaussian_nll(x0, mean, logvar).mean(-1)
    vb = torch.where(index == 0, nll, kl) / math.log(2.0)
    return mse + vb


def reverse_step(eps: torch.Tensor, v: torch.Tensor, xt: torch.Tensor,
                 coefficients: Sequence[torch.Tensor | float] | torch.Tensor, noise: torch.Tensor, temperature: float,
                 clip_x0: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One reverse step at a step with ``coefficients`` (:func:`reverse_gaussian`): (x_prev, mean, std) with
    std = exp(logvar / 2) * temperature."""
    mean, logvar = reverse_gaussian(eps, v, xt, coefficients, clip_x0)
    std = torch.exp(0.5 * logvar) * temperature
    return mean + std * noise, mean, std
