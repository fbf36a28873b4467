"""The EAGLE-style draft head: cached per-row decoding equals its full pass; it refuses a target it does not fit;
and its training loss teaches it the target's next-token distribution."""

from __future__ import annotations

import pytest
import torch

from vgen.models.draft_head import DraftHead, DraftHeadConfig
from vgen.models.llamagen import GPTConfig
from vgen.training.drafter import drafter_losses

CONFIG = GPTConfig(vocab_size=48, dim=64, n_layer=2, n_head=4, num_classes=5, block_size=16)


def make_head(config: GPTConfig = CONFIG, seed: int = 0) -> DraftHead:
    torch.manual_seed(seed)
    head = DraftHead(DraftHeadConfig.for_target(config))
    with torch.no_grad():
        for p in head.parameters():
            if p.ndim > 1:
                p.normal_(std=0.2)
    return head.eval()


@torch.no_grad()
def test_cached_rows_equal_the_full_pass(tiny_gpt_factory) -> None:
    target, head = tiny_gpt_factory(CONFIG), make_head()
    tokens = torch.randint(48, (2, 16), generator=torch.Generator().manual_seed(0))
    _, features = target(torch.tensor([1, 2]), tokens[:, :-1], return_hidden=True)
    full = head(features, tokens, target)
    cache = head.new_cache(2)
    first = head.decode_rows(features[:, :5], tokens[:, :5], torch.tensor([0, 0]), cache, target)
    torch.testing.assert_close(first, full[:, :5], atol=1e-5, rtol=0)
    # row 0 keeps 3 of those pairs, row 1 all 5: the next call starts each row at its own slot
    window = torch.stack([torch.arange(3, 9), torch.arange(5, 11)])
    rows = torch.arange(2)[:, None]
    got = head.decode_rows(features[rows, window], tokens[rows, window], torch.tensor([3, 5]), cache, target)
    torch.testing.assert_close(got, full[rows, window], atol=1e-5, rtol=0)


def test_a_head_refuses_a_target_of_another_shape(tiny_gpt_factory) -> None:
    other = tiny_gpt_factory(GPTConfig(vocab_size=48, dim=32, n_layer=1, n_head=4, num_classes=5, block_size=16))
    with pytest.raises(ValueError, match="does not fit a target with dim 32"):
        make_head().check_target(other)


def test_training_makes_the_head_agree_with_the_target(tiny_gpt_factory) -> None:
    target = tiny_gpt_factory(CONFIG).requires_grad_(False)
    head = DraftHead(DraftHeadConfig.for_target(CONFIG))
    g = torch.Generator().manual_seed(0)
    classes = torch.randint(5, (16,), generator=g)
    codes = torch.randint(48, (16, 16), generator=g)
    opt = torch.optim.Adam(head.parameters(), lr=3e-3)
    first = None
    for _ in range(60):
        loss, figures = drafter_losses(head, target, classes, codes)
        first = first or figures
        opt.zero_grad()
        loss.backward()
        opt.step()
    _, last = drafter_losses(head, target, classes, codes)
    assert last["ce"] < first["ce"] - 0.3
    assert last["agree"] > first["agree"] + 0.2
