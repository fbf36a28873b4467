"""benchmarks/context_noise.py: a continuous target's loss on real tokens as the prefix its trunk reads is perturbed,
every model on the same tokens, noise draws and diffusion steps."""

import torch

from vgen.models.mar import ContinuousAR, MARConfig

TINY = dict(token_channels=2, grid_size=3, dim=32, n_layer=2, n_head=2, num_classes=3, head_width=32, head_depth=2,
            num_sampling_steps=6, dropout_p=0.0)


def test_the_clean_prefix_gives_the_training_loss_and_noise_raises_it_on_a_model_that_copies(benchmark_module):
    bench = benchmark_module("context_noise")
    torch.manual_seed(0)
    model = ContinuousAR(MARConfig(**TINY))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(150):  # every token repeats the first one: the exact prefix tells the model each token
        first = torch.randn(32, 1, 2, generator=gen)
        loss = model.loss(torch.zeros(32, dtype=torch.long), first.expand(32, 9, 2).contiguous(), gen)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    first = torch.randn(48, 1, 2, generator=torch.Generator().manual_seed(1))
    tokens, classes = first.expand(48, 9, 2).contiguous(), torch.zeros(48, dtype=torch.long)
    losses = bench.prefix_noise_losses(model, tokens, classes, [0.0, 0.5], batch_size=16)
    again = bench.prefix_noise_losses(model, tokens, classes, [0.0, 0.5], batch_size=16)
    assert losses == again
    with torch.no_grad():
        expected = [float(model.prefix_loss(classes[i:i + 16], tokens[i:i + 16], tokens[i:i + 16, :-1],
                                            torch.Generator().manual_seed(1 + i))) for i in range(0, 48, 16)]
    assert abs(losses[0] - sum(expected) / 3) < 1e-6
    assert losses[1] > 1.5 * losses[0], losses


def test_the_table_gives_each_loss_as_a_multiple_of_the_clean_one(benchmark_module):
    bench = benchmark_module("context_noise")
    text = bench.table([{"model": "m", "sigmas": [0.0, 0.1], "losses": [0.02, 0.1]}])
    assert text.splitlines()[2] == "| m | 0.0200 | 0.1000 (5.0x) |"
