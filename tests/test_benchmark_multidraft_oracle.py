"""benchmarks/multidraft_oracle.py: the catch rate of alternatives at a pass's first rejection and the passes a
depth-1 tree would save, over recorded ``mcsjd`` runs."""

import dataclasses

import pytest
import torch

from tests.conftest import TINY_GPT
from vgen.samplers import SamplingParams
from vgen.samplers.speculative.drafters import JacobiDrafter


@pytest.fixture(scope="module")
def oracle(benchmark_module):
    return benchmark_module("multidraft_oracle")


def record(oracle, model, images: int = 2):
    """``mcsjd`` at window 4 over ``images`` classes of ``model``, every run's drafter an oracle."""
    def wrap(inner: JacobiDrafter):
        return oracle.Oracle(inner, tuple(model.grid), model.num_tokens)

    return oracle.draft_sources.recorded(oracle.draft_sources.parse_spec("mcsjd:window=4"), model,
                                         (torch.tensor([i]) for i in range(images)), SamplingParams(cfg_scale=2.0),
                                         wrap)


def test_one_candidate_saves_nothing_and_the_passes_add_up(oracle, tiny_gpt) -> None:
    oracles, passes = record(oracle, tiny_gpt)
    assert passes == sum(len(o.passes) + 1 for o in oracles)  # each run's prefill, then the recorded passes
    # every token after the prefill's first is committed by one recorded pass
    assert all(sum(o.produced()) == tiny_gpt.num_tokens - 1 and len(o.ends) == len(o.passes) for o in oracles)
    assert sum(e is not None for o in oracles for e in o.ends) > 0
    for source in oracle.SOURCES:
        assert sum(oracle.merges(o, source, 1, 16) for o in oracles) == 0
        assert sum(oracle.merges(o, source, 4, 16) for o in oracles) >= sum(oracle.merges(o, source, 2, 4)
                                                                            for o in oracles)


def test_the_residuals_own_top_catches_every_end_once_it_holds_the_vocabulary(oracle, tiny_gpt_factory) -> None:
    """With V = 4 the three alternatives besides the rejected draft cover every token the residual can give."""
    model = tiny_gpt_factory(dataclasses.replace(TINY_GPT, vocab_size=4))
    oracles, _ = record(oracle, model)
    ends = [e for o in oracles for e in o.ends if e is not None]
    assert ends and all(e.caught("r-oracle", 4) and e.catch["r-oracle"][3] == pytest.approx(1) for e in ends)
    assert not all(e.caught("r-oracle", 2) for e in ends)


def test_several_independent_draws_are_caught_stage_by_stage(oracle) -> None:
    r = torch.tensor([0.5, 0.5, 0.0])
    assert oracle.stochastic_catch(r, r, 2) == pytest.approx([0, 1, 1])
    # stage 1 catches min(r, law) = 0.5; the residual [0, 1, 0] then shares nothing with the law
    assert oracle.stochastic_catch(r, torch.tensor([1.0, 0, 0]), 2) == pytest.approx([0, 0.5, 0.5])
    # 0.25 + 0.75 * (stage 2: residual [0, 1, 0] against the law [0.75, 0.25, 0] catches 0.25)
    assert oracle.stochastic_catch(r, torch.tensor([0.75, 0.25, 0]), 2) == pytest.approx([0, 0.75, 0.8125])


def test_a_caught_end_merges_the_next_pass_if_it_fits_and_merged_passes_merge_nothing(oracle) -> None:
    """Four passes of 2, 1, 3 and 6 tokens; the first three end at a rejection whose recovered token is the carried
    law's top alternative, so k = 2 catches each. Pass 1 merges into 0; pass 1, merged, merges nothing, and pass 2
    starts a tree again, which takes pass 3 where its 6 tokens fit the branch."""
    recording = oracle.Oracle(JacobiDrafter(4, 2), (4, 4), 16)
    p, q = torch.tensor([0.1, 0.1, 0.8, 0.0]), torch.tensor([0.5, 0.1, 0.4, 0.0])  # r = [0, 0, 1, 0]

    def end(at: int = 0):
        return oracle.pass_end(p, q, 0, 2, at, True, None, 0.5)

    recording.passes = [(torch.tensor([pos]), torch.tensor([6]), torch.tensor([kept]), 6)
                        for pos, kept in [(1, 1), (3, 0), (4, 2), (7, 5)]]
    recording.drafts = [[t] * 6 for t in range(4)]
    recording.ends = [end(), end(), end(), None]
    assert recording.produced() == [2, 1, 3, 6] and recording.ends[0].rank["carried"] == 0
    assert oracle.merges(recording, "carried", 2, 8) == 2  # 1 into 0, 3 into 2
    assert oracle.merges(recording, "carried", 2, 4) == 1  # 6 tokens do not fit depth 4
    assert oracle.merges(recording, "neighbour", 4, 8) == 0  # no neighbour law: nothing to branch with
    # the branch judges pass 3's kept drafts only where pass 2 held them after its end (pass 1 kept none)
    assert oracle.merges(recording, "carried", 2, 8, same_drafts=True) == 1
    recording.drafts[2] = [2] + [3] * 5
    assert oracle.merges(recording, "carried", 2, 8, same_drafts=True) == 2
    recording.ends = [end(at=oracle.BRANCHED), end(), end(), None]
    assert oracle.merges(recording, "carried", 2, 8) == 1  # the first end lies past the branched places: 2 into 1
    assert oracle.merges(recording, "carried", 2, 8, levels=2) == 2  # a second level takes pass 3 as well


def test_both_sources_take_turns_each_token_once(oracle) -> None:
    assert oracle.interleaved([1, 2, 3], [2, 4], 3) == [1, 2, 4]
    assert oracle.interleaved([7, 8], [7, 9], 3) == [7, 8, 9]
    assert oracle.interleaved([], [5, 6], 3) == [5, 6]
