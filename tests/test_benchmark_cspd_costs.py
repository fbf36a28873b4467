"""benchmarks/cspd_costs.py: its timer sees every trunk and head-chain call a sampler makes, so a run's wall time
splits into the model's parts and the sampler's own work."""

import copy

import pytest
import torch

from vgen.models.mar import ContinuousAR, MARConfig
from vgen.samplers import ContinuousARSampler, CSpD, SamplingParams


@pytest.fixture(scope="module")
def costs(benchmark_module):
    return benchmark_module("cspd_costs")


@pytest.fixture
def models():
    torch.manual_seed(0)
    target = ContinuousAR(MARConfig(token_channels=2, grid_size=3, dim=32, n_layer=2, n_head=2, num_classes=3,
                                    head_width=32, head_depth=2, num_sampling_steps=8, dropout_p=0.0)).eval()
    return target, copy.deepcopy(target)


def sample(sampler, target, draft=None):
    return sampler.sample(target, torch.tensor([0, 2]), SamplingParams(cfg_scale=2.0),
                          generator=torch.Generator().manual_seed(0), draft_head=draft).stats


def test_the_timer_counts_one_trunk_call_and_one_head_chain_per_target_pass(costs, models):
    target, _ = models
    timer = costs.PartTimer({"target": target})
    stats = sample(ContinuousARSampler(), target)
    assert timer.calls == {"target trunk": 9, "target head": 9} == {k: stats.forward_passes for k in timer.calls}
    assert 0 < sum(timer.seconds.values()) <= stats.wall_time_s


def test_a_cspd_run_splits_into_target_and_draft_parts(costs, models):
    target, draft = models
    timer = costs.PartTimer({"target": target, "draft": draft})
    stats = sample(CSpD(draft_length=3, prefill_ratio=0.0), target, draft)
    assert timer.calls["target trunk"] == timer.calls["target head"] == stats.forward_passes
    assert timer.calls["draft trunk"] == stats.draft_forward_passes
    assert timer.calls["draft head"] == stats.details["draft_head_chains"]
    row = costs.run_row("cspd", [stats], timer, token_s=0.01)
    assert row["other_s"] == pytest.approx(stats.wall_time_s - sum(timer.seconds.values()))
    assert row["tokens_per_round"] == pytest.approx(sum(stats.accepted_lengths) / len(stats.accepted_lengths))
    # a copy of the target as draft is kept whole: after the first token, 2 rounds of 3 drafts + 1 bonus token
    assert stats.accepted_lengths == [4] * 4
    target_s = timer.seconds["target trunk"] + timer.seconds["target head"]
    assert row["free_draft_ratio"] == pytest.approx(0.01 * 18 / target_s)
    timer.reset()
    assert timer.calls == {} and timer.seconds == {}
