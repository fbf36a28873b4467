"""The continuous-token AR backbone: cached passes equal the full causal pass, it learns, it round-trips."""

import pytest
import torch

from vgen.hub import from_pretrained, save_pretrained
from vgen.models.mar import ContinuousAR, MARConfig

TINY = dict(token_channels=3, grid_size=3, dim=32, n_layer=2, n_head=2, num_classes=4, head_width=32,
            head_depth=2, num_sampling_steps=10, dropout_p=0.0)


@pytest.fixture(params=[0, 16], ids=["linear-tokens", "mlp-tokens"])
def model(request):
    torch.manual_seed(0)
    return ContinuousAR(MARConfig(**TINY, token_hidden=request.param)).eval()


def test_prefill_and_decode_equal_the_full_causal_pass(model):
    cls, x = torch.tensor([0, 3]), torch.randn(2, 9, 3)
    full = model(cls, x)
    assert full.shape == (2, 10, 32)
    cache = model.new_cache(2)
    z0 = model.prefill(cls, cache)
    z_a = model.decode(x[:, :4], cache)
    z_b = model.decode(x[:, 4:8], cache)
    assert torch.allclose(z0, full[:, 0], atol=1e-5)
    assert torch.allclose(torch.cat([z_a, z_b], 1), full[:, 1:9], atol=1e-5)


def test_decode_rows_lets_rows_advance_independently(model):
    cls, x = torch.tensor([1, 2]), torch.randn(2, 9, 3)
    full = model(cls, x)
    cache = model.new_cache(2, extra=3)
    model.prefill(cls, cache)
    model.decode_rows(x[:, :3], torch.tensor([1, 1]), cache)
    # row 0 continues after 3 tokens; row 1 rewinds to after 1 token (its later slots are overwritten)
    starts = torch.tensor([4, 2])
    window = torch.stack([x[0, 3:6], x[1, 1:4]])
    z = model.decode_rows(window, starts, cache)
    assert torch.allclose(z[0], full[0, 4:7], atol=1e-5)
    assert torch.allclose(z[1], full[1, 2:5], atol=1e-5)


def test_the_loss_falls_when_training_on_class_dependent_tokens():
    torch.manual_seed(0)
    model = ContinuousAR(MARConfig(**TINY))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(40):
        cls = torch.randint(0, 4, (32,), generator=gen)
        x = cls[:, None, None].float() - 1.5 + 0.1 * torch.randn(32, 9, 3, generator=gen)
        loss = model.loss(cls, x, gen)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5


def test_context_noise_perturbs_the_prefix_the_trunk_reads_and_not_the_tokens_the_head_learns(model, monkeypatch):
    import vgen.models.mar as mar

    cls, x = torch.tensor([0, 1, 2, 3]), torch.randn(4, 9, 3)
    read, learnt = [], []
    forward, loss = ContinuousAR.forward, mar.training_loss
    monkeypatch.setattr(ContinuousAR, "forward", lambda self, c, t=None: read.append(t) or forward(self, c, t))
    monkeypatch.setattr(mar, "training_loss",
                        lambda head, schedule, x0, *a: learnt.append(x0) or loss(head, schedule, x0, *a))
    clean = model.loss(cls, x, torch.Generator().manual_seed(0))
    same = model.loss(cls, x, torch.Generator().manual_seed(0), context_noise=0.0)
    noisy = model.loss(cls, x, torch.Generator().manual_seed(0), context_noise=0.3)
    assert torch.equal(clean, same) and not torch.equal(clean, noisy)
    assert torch.equal(read[0], x[:, :-1]) and torch.equal(read[1], x[:, :-1])
    offsets = read[2] - x[:, :-1]
    per_image = offsets.flatten(1).std(1)
    assert (per_image > 0).all() and (per_image < 0.3 * 1.3).all() and per_image.std() > 0.01, per_image
    assert all(torch.equal(t, learnt[0]) for t in learnt), "the head learns the clean tokens in every case"


def test_save_and_load_round_trip(model, tmp_path):
    save_pretrained(model, tmp_path / "m")
    loaded = from_pretrained(tmp_path / "m")
    assert isinstance(loaded, ContinuousAR) and loaded.config == model.config
    cls, x = torch.tensor([2]), torch.randn(1, 4, 3)
    assert torch.equal(loaded(cls, x), model(cls, x))


def test_token_hidden_picks_a_linear_projection_or_a_two_layer_mlp():
    linear = ContinuousAR(MARConfig(**TINY)).token_proj
    mlp = ContinuousAR(MARConfig(**TINY, token_hidden=16)).token_proj
    assert isinstance(linear, torch.nn.Linear) and (linear.in_features, linear.out_features) == (3, 32)
    assert [type(m).__name__ for m in mlp] == ["Linear", "SiLU", "Linear"]
    assert (mlp[0].in_features, mlp[0].out_features, mlp[2].out_features) == (3, 16, 32)


def test_bad_configs_and_inputs_are_refused(model):
    with pytest.raises(ValueError, match="token_channels"):
        MARConfig(token_channels=0)
    with pytest.raises(ValueError, match="token_hidden"):
        MARConfig(token_hidden=-1)
    with pytest.raises(ValueError, match="diffusion_batch_mul"):
        MARConfig(diffusion_batch_mul=0)
    with pytest.raises(ValueError, match="divisible"):
        MARConfig(dim=30, n_head=4)
    with pytest.raises(ValueError, match="exceeds"):
        model(torch.tensor([0]), torch.randn(1, 10, 3))
    cache = model.new_cache(1)
    model.prefill(torch.tensor([0]), cache)
    with pytest.raises(ValueError, match="empty cache"):
        model.prefill(torch.tensor([0]), cache)
