"""The target_probs kernel (CFG merge, temperature, top-k, top-p, softmax of a window) equals its torch reference:
the same kept tokens, probabilities within float32 rounding, the same one-hot under greedy decoding."""

import pytest
import torch

pytest.importorskip("triton", reason="the kernel tests need triton (pip install -e '.[triton]')")

from vgen.kernels import SamplingSpec, probs  # noqa: E402
from vgen.samplers.base import SamplingParams  # noqa: E402
from vgen.samplers.logits import target_probs  # noqa: E402


def assert_same_distribution(reference: torch.Tensor, kernel: torch.Tensor) -> None:
    assert kernel.shape == reference.shape and kernel.dtype == reference.dtype
    assert torch.equal(kernel > 0, reference > 0)  # the same tokens survive the filters
    torch.testing.assert_close(kernel, reference, rtol=1e-5, atol=1e-7)


SETTINGS = {
    "plain": SamplingParams(),
    "temperature": SamplingParams(temperature=0.6),
    "top-k": SamplingParams(top_k=5),
    "top-p": SamplingParams(top_p=0.7),
    "cfg-all": SamplingParams(temperature=1.3, top_k=9, top_p=0.9, cfg_scale=3.0),
    "cfg-interval": SamplingParams(top_p=0.8, cfg_scale=2.5, cfg_interval=1),  # guidance stops inside the window
    "top-k>=V": SamplingParams(top_k=1000, top_p=0.95),
    "top-k=1": SamplingParams(top_k=1, cfg_scale=2.0),
    "top-p tiny": SamplingParams(top_p=1e-6),  # only the first-ranked token survives
    "greedy-cfg": SamplingParams(temperature=0.0, top_k=3, cfg_scale=4.0),
}


@pytest.mark.parametrize("params", SETTINGS.values(), ids=SETTINGS.keys())
@pytest.mark.parametrize(("batch", "vocab"), [(1, 37), (3, 64), (2, 100)])
def test_window_matches_the_reference(params: SamplingParams, batch: int, vocab: int, both) -> None:
    g = torch.Generator().manual_seed(vocab + batch)
    rows = 2 * batch if params.guided else batch
    logits = torch.randn(rows, 3, vocab, generator=g) * 3
    index = torch.arange(2, 5)  # the window predicts tokens 2..4 (cfg_interval 1 guides only token 2)
    before = logits.clone()
    reference, kernel = both(target_probs, logits, params, index)
    assert_same_distribution(reference, kernel)
    assert torch.equal(logits, before)
    if params.greedy:
        assert torch.equal(kernel, reference)


def test_single_positions_and_per_row_token_indices(both) -> None:
    """AR's [2B, V] with an int index, and the draft head's [2B, V] with one index per sample."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 50, generator=g) * 2
    params = SamplingParams(top_k=20, top_p=0.9, cfg_scale=2.0, cfg_interval=3)
    for index in (0, 10, torch.tensor([2, 4, 5])):
        assert_same_distribution(*both(target_probs, logits, params, index))


def test_top_k_keeps_every_tie_of_the_kth_value(both) -> None:
    logits = torch.tensor([[5.0, 4.0, 4.0, 1.0, 4.0, 0.0, 4.0]])
    reference, kernel = both(target_probs, logits, SamplingParams(top_k=2), 0)
    assert (kernel > 0).tolist() == [[True, True, True, False, True, False, True]]
    assert_same_distribution(reference, kernel)


def test_top_p_cuts_a_tie_group_in_vocabulary_order(both) -> None:
    """Logits on a coarse grid tie often; top_p is placed midway inside a tie group's run of masses, so the
    group is split and only a stable, index-ordered ranking keeps the right members."""
    g = torch.Generator().manual_seed(2)
    logits = torch.randint(0, 4, (4, 30), generator=g).float()
    split = 0
    for row in logits:
        probs, order = row.softmax(-1).sort(descending=True, stable=True)
        mass = probs.cumsum(-1)
        tied = (probs[1:] == probs[:-1]).nonzero().flatten()
        j = int(tied[len(tied) // 2])  # tokens j and j + 1 of the ranking tie
        top_p = float((mass[j - 1] + mass[j]) / 2) if j > 0 else float(mass[0] / 2)
        reference, kernel = both(target_probs, row[None], SamplingParams(top_p=top_p), 0)
        assert_same_distribution(reference, kernel)
        kept = kernel[0] > 0
        split += bool(kept[order[j]] and not kept[order[j + 1]])
    assert split == len(logits)  # every row's tie group was cut between two equal logits


def test_top_p_1_and_top_k_at_the_vocabulary_filter_nothing(both) -> None:
    logits = torch.randn(2, 33, generator=torch.Generator().manual_seed(3))
    for params in (SamplingParams(top_p=1.0), SamplingParams(top_k=33)):
        reference, kernel = both(target_probs, logits, params, 0)
        assert bool((kernel > 0).all())
        assert_same_distribution(reference, kernel)


def test_a_tiny_top_p_keeps_only_the_first_of_tied_maxima(both) -> None:
    logits = torch.tensor([[1.0, 3.0, 0.0, 3.0, 3.0]])
    reference, kernel = both(target_probs, logits, SamplingParams(top_p=1e-6), 0)
    assert (kernel > 0).tolist() == [[False, True, False, False, False]]
    assert_same_distribution(reference, kernel)


def test_greedy_picks_the_first_of_tied_maxima(both) -> None:
    logits = torch.tensor([[1.0, 3.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0]])
    reference, kernel = both(target_probs, logits, SamplingParams(temperature=0.0), 0)
    assert torch.equal(kernel, reference)
    assert kernel.argmax(-1).tolist() == [1, 0]


def test_the_kernel_takes_a_spec_of_plain_values() -> None:
    """The kernel called with settings and a guidance mask written out by hand (no sampler types) gives the
    distribution of the sampling settings they describe: guidance on the first position of the window only."""
    logits = torch.randn(4, 3, 40, generator=torch.Generator().manual_seed(2)) * 2
    settings = SamplingSpec(temperature=0.8, top_k=12, top_p=0.9, cfg_scale=3.0, guided=True)
    kernel = probs.target_probs(logits, settings, torch.tensor([True, False, False]))
    params = SamplingParams(temperature=0.8, top_k=12, top_p=0.9, cfg_scale=3.0, cfg_interval=0)
    assert_same_distribution(target_probs.reference(logits, params, torch.tensor([1, 2, 3])), kernel)
