"""Token statistics score every generated token with the distribution its sampler drew it from, for next-token
(LlamaGen) and whole-grid (NAR) models alike."""

from __future__ import annotations

import math

import pytest
import torch

from vgen.eval.quality import token_statistics
from vgen.models.llamagen import GPTConfig, LlamaGenGPT
from vgen.models.nar import NARConfig, NARTransformer
from vgen.samplers import SamplingParams

SIZE = dict(vocab_size=16, dim=32, n_layer=2, n_head=4, multiple_of=16, num_classes=4, token_dropout_p=0.0,
            resid_dropout_p=0.0, ffn_dropout_p=0.0)


def models() -> list[torch.nn.Module]:
    """A fresh next-token and a fresh whole-grid model over 3 x 3 tokens."""
    torch.manual_seed(0)
    return [LlamaGenGPT(GPTConfig(block_size=9, **SIZE)).eval(), NARTransformer(NARConfig(grid=(3, 3), **SIZE)).eval()]


@pytest.mark.parametrize("model", models(), ids=["ar", "nar"])
def test_every_token_is_measured_and_greedy_decoding_has_zero_entropy(model) -> None:
    for name, weight in model.named_parameters():
        if "output" in name:  # the output layers start at zero (uniform logits): give them distinct logits
            torch.nn.init.normal_(weight.data)
    tokens, classes = torch.randint(0, 16, (5, 9)), torch.tensor([0, 1, 2, 3, 0])
    figures = token_statistics(model, tokens, classes, SamplingParams(cfg_scale=2.0, top_k=1))
    assert figures["tokens_measured"] == 5 * 9
    assert figures["mean_entropy_nats"] == pytest.approx(0.0, abs=1e-6) and figures["median_top1_prob"] == 1.0


def test_a_fresh_nar_model_is_uniform_over_the_vocabulary() -> None:
    """NAR's heads start at zero, so every cell's distribution is uniform: entropy ln V, top-1 1/V."""
    model = models()[1]
    figures = token_statistics(model, torch.randint(0, 16, (3, 9)), torch.tensor([0, 1, 2]), SamplingParams())
    assert figures["mean_entropy_nats"] == pytest.approx(math.log(16), abs=1e-5)
    assert figures["median_top1_prob"] == pytest.approx(1 / 16, abs=1e-6)
