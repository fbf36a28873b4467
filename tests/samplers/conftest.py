"""What the sampler tests share: one table of sampling settings, a seeded run of any sampler, and the draw that the
naive reference loops make."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from scipy.stats import chisquare

from vgen.samplers import SampleOutput, SamplingParams, build_processors, get_sampler

# greedy and sampled, with and without guidance, filtered, and guidance switched off after the first tokens
SAMPLING = {
    "greedy": SamplingParams(temperature=0.0),
    "greedy-cfg": SamplingParams(temperature=0.0, cfg_scale=4.0),
    "sampled": SamplingParams(),
    "sampled-cfg": SamplingParams(cfg_scale=4.0),
    "filtered-cfg": SamplingParams(temperature=0.8, top_k=20, top_p=0.9, cfg_scale=2.5),
    "interval": SamplingParams(temperature=1.2, cfg_scale=3.0, cfg_interval=4),
}


@pytest.fixture(params=list(SAMPLING.values()), ids=list(SAMPLING))
def sampling_params(request: pytest.FixtureRequest) -> SamplingParams:
    """Every entry of the shared table in turn."""
    return request.param


@pytest.fixture
def sampling_table() -> dict[str, SamplingParams]:
    """The shared table, for tests that take a few of its entries by name."""
    return SAMPLING


@pytest.fixture
def run_sampler() -> Callable[..., SampleOutput]:
    """``run_sampler(sampler, model, classes, params, seed=0, **inputs)``: one ``sample`` call of a sampler (a name,
    a config dict or a Sampler) with a CPU generator seeded with ``seed``; ``inputs`` (``draft_head``, ``prefix``,
    ``progress``) go to ``sample``."""

    def run(sampler, model, classes: torch.Tensor, params: SamplingParams, seed: int = 0, **inputs) -> SampleOutput:
        return get_sampler(sampler).sample(model, classes, params, generator=torch.Generator().manual_seed(seed),
                                           **inputs)

    return run


def draw(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> torch.Tensor:
    """Guided logits [B, ..., V] -> tokens [B, ...], as the sampler contract says: processed, then the argmax at
    temperature 0, else one multinomial call over every position of every row, in order."""
    logits = build_processors(params)(logits)
    if params.temperature == 0:
        return logits.argmax(-1)
    probs = logits.softmax(-1)
    return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator).view(probs.shape[:-1])


@pytest.fixture
def reference_draw() -> Callable[[torch.Tensor, SamplingParams, torch.Generator], torch.Tensor]:
    """:func:`draw`, for the naive reference loops of the sampler tests."""
    return draw


@pytest.fixture
def chi_square_p() -> Callable[[torch.Tensor, torch.Tensor], float]:
    """Pearson's test of observed counts against a law, cells with an expected count below 5 pooled into one:
    the p-value."""

    def p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
        expected = probs * counts.sum()
        small = expected < 5
        obs = torch.cat([counts[~small], counts[small].sum()[None]]).double()
        exp = torch.cat([expected[~small], expected[small].sum()[None]]).double()
        return float(chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue)

    return p_value
