"""Shared pytest fixtures. Each block belongs to one area; add new blocks rather than editing others."""

from __future__ import annotations

import pytest
import torch

# ---- samplers: a tiny LlamaGen GPT with informative (non-flat) logits --------------------------------------
from vgen.models.llamagen import GPTConfig, LlamaGenGPT

TINY_GPT = GPTConfig(vocab_size=64, dim=64, n_layer=2, n_head=4, num_classes=5, block_size=16)


def make_tiny_gpt(config: GPTConfig = TINY_GPT, seed: int = 0) -> LlamaGenGPT:
    """An fp32 eval-mode LlamaGen GPT whose weight matrices are N(0, 0.2) noise (the output layer is zero at
    init, which would make every distribution uniform)."""
    torch.manual_seed(seed)
    model = LlamaGenGPT(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim > 1:
                p.normal_(std=0.2)
    return model.eval()


@pytest.fixture
def tiny_gpt() -> LlamaGenGPT:
    return make_tiny_gpt()


@pytest.fixture
def tiny_gpt_factory():
    """``make_tiny_gpt`` for tests that need another config or seed."""
    return make_tiny_gpt
# ---- end samplers ------------------------------------------------------------------------------------------
