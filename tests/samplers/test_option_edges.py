"""The edge values of every integer option (the lower bound, 1 and the upper bound) run on every registered sampler:
each draws a full sample on a tiny model of its token order, or is refused with a one-line ValueError that names
the option where the model cannot take the value. A crash at an edge (an empty schedule, a zero-length window, an
index past a codebook) fails here."""

from __future__ import annotations

import pytest
import torch

import vgen
from vgen.samplers import SamplingParams, available_samplers, get_sampler
from vgen.samplers.options import DeclaredOption, declared_options

SAMPLING = [o for o in declared_options([SamplingParams]) if o.kind is int]
# upper bounds too slow to draw here: 1000 head steps per token take ~20 s on the tiny continuous model
EXPENSIVE_UPPER = {"head_steps", "draft_steps"}
# edges a sampler refuses by design, by (sampler order, option): continuous tokens have no vocabulary to filter
REFUSED = {("continuous", "top_k"): "top-k"}
# values above 1 a preset refuses when it is configured, by (sampler, option): a draft tree takes the exact rule
REFUSED_ABOVE_ONE = {("lantern", "candidates"): "exact rule", ("gsd", "candidates"): "exact rule"}


def edges(o: DeclaredOption) -> list[int]:
    """The lower bound, 1 and, unless it is too slow to draw, the upper bound of the integer option ``o``."""
    spec = o.spec
    lower = spec.at_least if spec.at_least is not None else spec.above + 1
    upper = spec.at_most if spec.at_most is not None else spec.below - 1
    values = {lower, 1} | (set() if o.name in EXPENSIVE_UPPER else {upper})
    return sorted(v for v in values if spec.in_range(v))


def cases() -> list[tuple[str, str, int]]:
    """(sampler, option, value) for each integer option of each sampler and of the sampling settings."""
    out = []
    for name in available_samplers():
        options = [o for o in declared_options([type(get_sampler(name))]) if o.kind is int] + SAMPLING
        out += [(name, o.name, v) for o in options for v in edges(o)]
    return out


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny models run several times faster on one thread than on a machine's worth of them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pipelines(tiny_pipeline_dir, tiny_continuous_pipeline_dir):
    return vgen.load(tiny_pipeline_dir), vgen.load(tiny_continuous_pipeline_dir)


@pytest.fixture
def models(pipelines, tiny_nar_factory, tiny_nbp_factory):
    """A tiny model per token order with what its samplers read: the tokenizer (LANTERN's codebook), the draft
    (CSpD)."""
    raster, continuous = pipelines
    return {"raster": (raster.model, {"tokenizer": raster.tokenizer}),
            "continuous": (continuous.model, {"draft_head": continuous.draft_head}),
            "next-neighbour": (tiny_nar_factory((3, 3)), {}),
            "next-block": (tiny_nbp_factory((3, 3)), {})}


@pytest.mark.parametrize("name, option, value", cases(), ids=[f"{n}-{o}={v}" for n, o, v in cases()])
def test_an_integer_option_at_its_edge_samples_or_is_refused_by_name(models, name, option, value) -> None:
    sampler_options = {option: value} if option not in {o.name for o in SAMPLING} else {}
    sampling = {"cfg_scale": 2.0, **({option: value} if not sampler_options else {})}
    if (name, option) in REFUSED_ABOVE_ONE and value > 1:
        with pytest.raises(ValueError, match=REFUSED_ABOVE_ONE[name, option]):
            get_sampler(name, **sampler_options)
        return
    sampler = get_sampler(name, **sampler_options)
    model, inputs = models[sampler.token_order]
    classes = torch.tensor([0, 2])
    expected = REFUSED.get((sampler.token_order, option)) if value else None
    if expected:
        with pytest.raises(ValueError, match=expected):
            sampler.sample(model, classes, SamplingParams(**sampling), generator=torch.Generator().manual_seed(0),
                           **inputs)
        return
    out = sampler.sample(model, classes, SamplingParams(**sampling), generator=torch.Generator().manual_seed(0),
                         **inputs)
    assert out.tokens.shape[0] == 2 and out.stats.tokens == 2 * model.num_tokens
    if out.tokens.is_floating_point():
        assert bool(out.tokens.isfinite().all())
    else:
        assert out.tokens.min() >= 0
