"""Speculative acceptance for continuous tokens drawn from diagonal Gaussians (CSpD's verification step).

Given the noise of a token's denoising trajectory (shared by draft and target), its last reverse step is a
Gaussian under each model: q = N(mean_q, std_q^2) for the draft, p = N(mean_p, std_p^2) for the target. The draft
token x ~ q is kept with probability min(1, p(x) / q(x)); otherwise a token is drawn from the residual
max(0, p - q) / Z by rejection sampling with proposal p, keeping a proposal y with probability
max(0, 1 - q(y) / p(y)) <= 1. The kept token is then distributed as p, given the trajectory noise, and hence
(the noise having the same law under both models) as the target's own sample.

CSpD's reference also multiplies the ratio by the exponentiated difference of the two trajectories' summed
log-stds. That factor compares densities at two different points (each model's own trajectory), so it is not a
density ratio of one variable; with it the output is not the target's distribution unless the factor is 1. It is
left out here, and ``inner_temperature`` (the reference's 42) is offered as an explicit, lossy relaxation.

The residual sampler stops after ``max_tries`` proposals; a token still without a residual sample takes the
target's own aligned sample. Rejection happens with probability TV(p, q) and exhausting the tries, given a
rejection, with probability (1 - TV)^max_tries, so the output's total-variation distance to p is at most
TV * (1 - TV)^max_tries <= 1 / (e * max_tries) per token (9e-5 at the default 4096). The number of such
fallbacks is reported.
"""

from __future__ import annotations

import math

import torch


def gaussian_log_density(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """log N(x; mean, diag(std^2)) summed over the last dimension."""
    z = (x - mean) / std
    return (-0.5 * z.pow(2) - std.log() - 0.5 * math.log(2 * math.pi)).sum(-1)


def acceptance_log_ratio(x: torch.Tensor, mean_q: torch.Tensor, std_q: torch.Tensor, mean_p: torch.Tensor,
                         std_p: torch.Tensor, inner_temperature: float = 1.0) -> torch.Tensor:
    """log p(x) - log q(x) for draft tokens x [..., C]; ``inner_temperature`` > 1 widens both Gaussians (lossy)."""
    t = inner_temperature
    return gaussian_log_density(x, mean_p, std_p * t) - gaussian_log_density(x, mean_q, std_q * t)


def sample_residual(mean_p: torch.Tensor, std_p: torch.Tensor, mean_q: torch.Tensor, std_q: torch.Tensor,
                    fallback: torch.Tensor, generator: torch.Generator | None = None, max_tries: int = 4096,
                    chunk: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """One sample per row [R, C] from max(0, p - q) / Z, and a bool [R] marking rows that took ``fallback``.

    Proposals are drawn ``chunk`` per row at a time, only for rows still without a sample, up to ``max_tries``.
    """
    if max_tries < 1 or chunk < 1:
        raise ValueError(f"max_tries and chunk must be >= 1, got {max_tries}, {chunk}")
    out = fallback.to(mean_p.dtype).clone()
    pending = torch.ones(mean_p.shape[0], dtype=torch.bool, device=mean_p.device)
    tried = 0
    while tried < max_tries and bool(pending.any()):
        idx = pending.nonzero().squeeze(1)
        n = min(chunk, max_tries - tried)
        mp, sp, mq, sq = (t[idx, None] for t in (mean_p, std_p, mean_q, std_q))
        noise = torch.randn((len(idx), n, mean_p.shape[1]), generator=generator, device=mean_p.device,
                            dtype=mean_p.dtype)
        y = mp + sp * noise
        log_q_over_p = gaussian_log_density(y, mq, sq) - gaussian_log_density(y, mp, sp)
        keep_prob = -torch.expm1(log_q_over_p.clamp(max=0.0))  # max(0, 1 - q / p)
        u = torch.rand(keep_prob.shape, generator=generator, device=mean_p.device, dtype=keep_prob.dtype)
        hit = u < keep_prob
        found = hit.any(1)
        first = hit.float().argmax(1)
        rows = idx[found]
        out[rows] = y[found, first[found]]
        pending[rows] = False
        tried += n
    return out, pending
