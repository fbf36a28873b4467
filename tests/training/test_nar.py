"""NAR training loss: ln V on a fresh model (its heads start at zero), every head trained by the cells it
predicts, a loss that falls on a fixed toy batch, and a shapes-nar config of the shapes AR model's size."""

from __future__ import annotations

import math

import pytest
import torch

from vgen.models.llamagen import LlamaGenGPT
from vgen.models.nar import NARConfig, NARTransformer
from vgen.training.ar import SHAPES_GPT
from vgen.training.nar import SHAPES_NAR, nar_loss

TOY = dict(vocab_size=16, dim=32, n_layer=2, n_head=4, multiple_of=16, num_classes=4, class_dropout_prob=0.0,
           token_dropout_p=0.0, resid_dropout_p=0.0, ffn_dropout_p=0.0)


def toy_batch(model: NARTransformer, size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, model.num_classes, (size,), generator=g),
            torch.randint(0, model.vocab_size, (size, model.num_tokens), generator=g))


@pytest.mark.parametrize("grid", [(3, 3), (2, 2, 2)])
def test_a_fresh_model_scores_ln_v(grid: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    model = NARTransformer(NARConfig(grid=grid, **TOY))
    loss, _ = nar_loss(model, *toy_batch(model))
    assert loss.item() == pytest.approx(math.log(16), abs=1e-6)


@pytest.mark.parametrize("grid", [(3, 3), (2, 2, 2)])
def test_each_head_learns_only_from_cells_with_a_predecessor_on_its_axis(grid: tuple[int, ...]) -> None:
    """With the loss restricted to one cell, exactly the heads that predict that cell get a gradient."""
    torch.manual_seed(0)
    model = NARTransformer(NARConfig(grid=grid, **TOY))
    classes, tokens = toy_batch(model)
    last = model.num_tokens - 1  # every axis has a predecessor: all heads
    for cell, heads in [(0, set(range(len(grid)))), (1, {0}), (grid[-1], {1}), (last, set(range(len(grid))))]:
        model.zero_grad()
        logits = model(classes, tokens)
        torch.nn.functional.cross_entropy(logits[:, cell], tokens[:, cell]).backward()
        got = {a for a, head in enumerate(model.heads) if head.output.weight.grad.abs().sum() > 0}
        assert got == heads, cell
    model.zero_grad()
    nar_loss(model, classes, tokens)[0].backward()
    assert all(head.output.weight.grad.abs().sum() > 0 for head in model.heads)


@pytest.mark.parametrize("grid", [(3, 3), (2, 2, 2)])
def test_loss_falls_on_a_fixed_batch(grid: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    model = NARTransformer(NARConfig(grid=grid, **TOY)).train()
    classes, tokens = toy_batch(model)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(60):
        loss, figures = nar_loss(model, classes, tokens)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(16), abs=1e-5)
    assert losses[-1] < 0.15 * losses[0]
    assert figures["acc"] > 0.9


def test_shapes_nar_matches_the_shapes_ar_model() -> None:
    """Same grid, vocabulary, width, heads and classes; trunk + extra block = the AR model's 8 blocks."""
    with torch.device("meta"):
        nar, ar = NARTransformer(SHAPES_NAR), LlamaGenGPT(SHAPES_GPT)
    assert SHAPES_NAR.grid == ar.grid == (16, 16) and nar.num_steps == 31
    assert len(nar.layers) == len(ar.layers) == 8
    assert (nar.vocab_size, nar.num_classes, SHAPES_NAR.dim) == (ar.vocab_size, ar.num_classes, SHAPES_GPT.dim)
    extra = sum(p.numel() for p in nar.parameters()) - sum(p.numel() for p in ar.parameters())
    assert extra == SHAPES_GPT.dim * (SHAPES_GPT.vocab_size + 1)  # the second head: norm + output layer
