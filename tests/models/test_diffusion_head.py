"""The diffusion head's reverse chain: what ``sample`` computes ahead (timestep, condition and AdaLN modulations)
gives the chain that calls the head's plain forward at every step."""

import pytest
import torch

from vgen.models import diffusion_head
from vgen.models.diffusion_head import DiffusionHead, HeadConfig
from vgen.models.gaussian_diffusion import COEFFICIENTS, reverse_step


@pytest.fixture(scope="module")
def head():
    torch.manual_seed(0)
    head = DiffusionHead(HeadConfig(token_channels=3, cond_dim=8, width=16, depth=2, num_sampling_steps=12,
                                    clip_x0=4.0)).eval()
    with torch.no_grad():
        for p in head.parameters():  # away from the zero init, so that every layer matters
            p.add_(0.3 * torch.randn_like(p))
    return head


def plain_chain(head, z, noise, temperature, cfg_scale):
    """The reverse chain written with ``forward(x, t, z)`` at every step."""
    schedule, c = head.sampling_schedule(), head.cfg.token_channels
    x = noise[0]
    for k, i in enumerate(reversed(range(len(schedule)))):
        t = schedule.timesteps[i].expand(z.shape[0])
        out = head(torch.cat([x, x]) if cfg_scale > 1 else x, t, z)
        if cfg_scale > 1:
            cond, uncond = out.chunk(2)
            eps, v = uncond[:, :c] + cfg_scale * (cond[:, :c] - uncond[:, :c]), cond[:, c:]
        else:
            eps, v = out[:, :c], out[:, c:]
        coefficients = [float(getattr(schedule, name)[i]) for name in COEFFICIENTS]
        x, mean, std = reverse_step(eps, v.clamp(-1, 1), x, coefficients, noise[k + 1], temperature,
                                    head.cfg.clip_x0)
    return x, mean, std


@pytest.mark.parametrize("cfg_scale", [1.0, 2.5])
@pytest.mark.parametrize("budget", [diffusion_head.MODULATION_BYTES, 1])
def test_sample_equals_the_step_by_step_chain(head, monkeypatch, cfg_scale, budget):
    """``budget`` 1 byte computes one call's modulations (``STEPS_PER_CALL`` steps) at a time; the default computes
    all 12 at once."""
    monkeypatch.setattr(diffusion_head, "MODULATION_BYTES", budget)
    g = torch.Generator().manual_seed(1)
    rows = 5
    z = torch.randn(2 * rows if cfg_scale > 1 else rows, 8, generator=g)
    noise = torch.randn(13, rows, 3, generator=g)
    with torch.no_grad():
        got = head.sample(z, noise, 0.9, cfg_scale)
        want = plain_chain(head, z, noise, 0.9, cfg_scale)
    for a, b in zip(got, want):
        assert a.shape == (rows, 3)
        assert torch.allclose(a, b, atol=1e-5)


def test_the_chain_needs_one_draw_per_step_and_the_initial_token(head):
    with pytest.raises(ValueError, match="noise must hold 13 draws"):
        head.sample(torch.zeros(2, 8), torch.zeros(12, 2, 3))
