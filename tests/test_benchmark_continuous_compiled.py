"""benchmarks/continuous_compiled.py: eager and compiled runs of each sampler on the same seeds, the compiled
tokens beside the eager ones, and the head chain alone at each number of steps a graph call."""

import types

import pytest
import torch

from vgen.eval.bench import parse_sampler_list
from vgen.models import diffusion_head
from vgen.models.mar import ContinuousAR, MARConfig
from vgen.samplers import SamplingParams


@pytest.fixture(scope="module")
def bench(benchmark_module):
    return benchmark_module("continuous_compiled")


@pytest.fixture
def pipe():
    torch.manual_seed(0)
    model = ContinuousAR(MARConfig(token_channels=2, grid_size=2, dim=32, n_layer=2, n_head=2, num_classes=3,
                                   head_width=32, head_depth=2, num_sampling_steps=6, dropout_p=0.0)).eval()
    return types.SimpleNamespace(model=model, draft_head=None, num_classes=3)


@pytest.mark.slow
def test_each_sampler_runs_eager_then_compiled_on_the_same_seeds(bench, pipe):
    rows = bench.bench_batch(pipe, 2, SamplingParams(cfg_scale=2.0), parse_sampler_list(["continuous-ar"]), 1)
    assert [(r["sampler"], r["compiled"]) for r in rows] == [("continuous-ar", False), ("continuous-ar", True)]
    eager, compiled = rows
    assert eager["speedup"] == 1.0 and eager["max_token_gap_to_eager"] == 0.0
    assert eager["share_within_1e-3_of_eager"] == 1.0
    assert compiled["max_token_gap_to_eager"] < 1e-3  # the same tokens up to the compiled graph's rounding
    assert compiled["forward_passes"] == eager["forward_passes"] == 4
    assert compiled["speedup"] == pytest.approx(eager["median_s"] / compiled["median_s"])


@pytest.mark.slow
def test_the_head_chain_is_timed_eagerly_and_at_each_call_length(bench, pipe):
    rows = bench.chain_timings(pipe, SamplingParams(cfg_scale=2.0), [2, 4], repeats=2)
    assert [r["steps_per_call"] for r in rows] == [None, 2, 4]
    assert all(r["median_ms"] > 0 for r in rows)
    assert diffusion_head.STEPS_PER_CALL == 5  # put back
