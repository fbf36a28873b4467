"""Draft trees (``candidates`` > 1): alternatives at chosen window columns, verified in one pass by recursive
rejection sampling, are lossless. Greedy output equals greedy AR's on image, text-to-image and video models; the
sampled law of whole sequences is the model's (chi-square), and the same test rejects alternatives that misstate
their law; a tree without branches is the single-draft pass, draw for draw."""

import pytest
import torch

from vgen.models.conditioning import PrefixCondition
from vgen.samplers import SamplingParams, get_sampler
from vgen.samplers.speculative import planner as planner_module
from vgen.samplers.speculative import sampler as sampler_module
from vgen.samplers.speculative import tree_pass
from vgen.samplers.speculative.tree_pass import Branch, tree_layout

from .test_neighbour import CLASSES, GREEDY, IMAGE, T2I, VIDEO, ar
from .test_speculative_sampler import SEQ_GPT, exact_joint, sequence_counts

FREE_NODES = 1e-6  # a node's cost: the planner then branches wherever a branch is expected to add anything


def every_column(max_alternatives: int, line_depth: int):
    """A planner's ``plan`` that branches at every column with all its alternatives."""
    def plan(self, buckets, live):
        return tuple(Branch(j, self.max_alternatives, self.line_depth) for j in range(buckets.shape[1]))
    return plan


def force_plan(monkeypatch, plan) -> None:
    """Every pass planned by ``plan`` (in place of ``BranchPlanner.plan``), whatever the pass cost."""
    monkeypatch.setattr(planner_module.BranchPlanner, "pays", lambda self, columns: True)
    monkeypatch.setattr(planner_module.BranchPlanner, "plan", plan)


def test_a_tree_lays_out_the_chain_then_each_alternatives_line() -> None:
    """A window of 5 (4 drafts); two alternatives at column 1, lines 2 deep: each alternative at depth 2 under the
    chain's node 1, followed by the chain's draft of column 2."""
    layout = tree_layout(5, (Branch(1, 2, 2),))
    assert layout.shape.parent.tolist() == [-1, 0, 1, 2, 3, 1, 5, 1, 7]
    assert layout.shape.depth.tolist() == [0, 1, 2, 3, 4, 2, 3, 2, 3]
    assert layout.column.tolist() == [-1, 0, 1, 2, 3, 1, 2, 1, 2]
    assert layout.rank.tolist() == [0, 0, 0, 0, 0, 1, 0, 2, 0]
    with pytest.raises(ValueError, match="outside a window of 4 drafts"):
        tree_layout(5, (Branch(4, 1, 2),))


def oracle_alternatives(monkeypatch, reference: torch.Tensor) -> None:
    """Alternatives whose first is greedy AR's own token wherever the draft is not (a deterministic candidate fixed
    before the pass, as every alternative must be), so the walk does take alternatives."""
    honest = planner_module.draft_alternatives

    def with_oracle(q, drafts, tokens, pos, stride, count):
        alts, valid = honest(q, drafts, tokens, pos, stride, count)
        index = (pos[:, None] + torch.arange(drafts.shape[1])).clamp(max=reference.shape[1] - 1)
        right = reference.gather(1, index)
        alts[..., 0] = right
        valid[..., 0] = right != drafts
        return alts, valid

    monkeypatch.setattr(planner_module, "draft_alternatives", with_oracle)


@pytest.mark.parametrize(("config", "window", "params"),
                         [(IMAGE, 4, GREEDY["greedy"]), (IMAGE, 16, GREEDY["greedy-cfg"]),
                          (VIDEO, 6, GREEDY["greedy-cfg"])], ids=["image-w4", "image-w16-cfg", "video-w6-cfg"])
@pytest.mark.parametrize("candidates", [2, 3])
def test_greedy_output_equals_greedy_ar(run_sampler, tiny_gpt_factory, monkeypatch, config, window, params,
                                        candidates) -> None:
    """Branches at every column, rows advancing apart (two classes); with the real alternatives, then with ones
    that hold AR's token, which the walk takes."""
    force_plan(monkeypatch, every_column(candidates - 1, 3))
    model = tiny_gpt_factory(config)
    reference = ar(model, CLASSES, params)
    sampler = get_sampler("mcsjd", window=window, candidates=candidates, branch_depth=3)
    out = run_sampler(sampler, model, CLASSES, params)
    assert torch.equal(out.tokens, reference)
    assert out.stats.details["tree_nodes_per_pass"] > window
    oracle_alternatives(monkeypatch, reference)
    caught = run_sampler(sampler, model, CLASSES, params)
    assert torch.equal(caught.tokens, reference)
    assert caught.stats.details["caught_share"] > 0
    assert caught.stats.forward_passes <= out.stats.forward_passes


def test_greedy_output_equals_greedy_ar_on_a_text_to_image_model(run_sampler, tiny_gpt_factory,
                                                                   monkeypatch) -> None:
    force_plan(monkeypatch, every_column(2, 4))
    model = tiny_gpt_factory(T2I)
    g = torch.Generator().manual_seed(0)
    mask = torch.arange(T2I.cls_token_num)[None] >= T2I.cls_token_num - torch.tensor([[4], [2]])
    prompts = PrefixCondition(torch.randn(2, T2I.cls_token_num, T2I.caption_dim, generator=g) * mask[..., None], mask)
    params = GREEDY["greedy-cfg"]
    reference = ar(model, prompts, params)
    oracle_alternatives(monkeypatch, reference)
    out = run_sampler(get_sampler("mcsjd", window=6, candidates=3, branch_depth=4), model, prompts, params)
    assert torch.equal(out.tokens, reference) and out.stats.details["caught_share"] > 0


@pytest.mark.parametrize("params", [SamplingParams(), GREEDY["greedy-cfg"]], ids=["sampled", "greedy-cfg"])
def test_a_tree_without_branches_is_the_single_draft_pass(run_sampler, tiny_gpt_factory, monkeypatch,
                                                          params) -> None:
    force_plan(monkeypatch, lambda self, buckets, live: ())
    model = tiny_gpt_factory(IMAGE)
    single = run_sampler(get_sampler("mcsjd", window=8), model, CLASSES, params, seed=3)
    tree = run_sampler(get_sampler("mcsjd", window=8, candidates=3), model, CLASSES, params, seed=3)
    assert torch.equal(tree.tokens, single.tokens)
    assert tree.stats.forward_passes == single.stats.forward_passes


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(cfg_scale=2.0, top_k=3, temperature=0.7)],
                         ids=["plain", "cfg-topk-temp"])
def test_the_sampled_law_is_the_models(chi_square_p, run_sampler, tiny_gpt_factory, monkeypatch, params) -> None:
    force_plan(monkeypatch, every_column(2, 2))
    model = tiny_gpt_factory(SEQ_GPT)
    counts = sequence_counts(run_sampler, model, get_sampler("mcsjd", window=4, candidates=3, branch_depth=2), params)
    assert chi_square_p(counts, exact_joint(model, params)) > 1e-3


def test_the_planned_tree_keeps_the_law(chi_square_p, run_sampler, tiny_gpt_factory) -> None:
    """The planner's own trees (every node nearly free, so it branches wherever it expects a catch)."""
    model = tiny_gpt_factory(SEQ_GPT)
    params = SamplingParams()
    sampler = get_sampler("mcsjd", window=4, candidates=3, branch_depth=2, node_cost=FREE_NODES)
    assert chi_square_p(sequence_counts(run_sampler, model, sampler, params), exact_joint(model, params)) > 1e-3
    planned = run_sampler(sampler, model, torch.tensor([1] * 64), params).stats.details
    assert planned["tree_nodes_per_pass"] > 4 and planned["caught_share"] > 0


def test_the_distribution_test_catches_alternatives_that_misstate_their_law(chi_square_p, run_sampler,
                                                                           tiny_gpt_factory, monkeypatch) -> None:
    """Power check: alternatives (the carried law's top tokens, fixed given the draft) declared as draws from the
    carried law are accepted too often and fail the test the one-hot declaration passes."""
    force_plan(monkeypatch, every_column(2, 2))
    honest = tree_pass.node_inputs

    def misstated(layout, root, drafts, q, alternatives, alternative_valid, draft_valid):
        tokens, laws, valid = honest(layout, root, drafts, q, alternatives, alternative_valid, draft_valid)
        carried = q[:, layout.column.clamp(min=0)]
        return tokens, torch.where((layout.rank > 0)[None, :, None], carried, laws), valid

    monkeypatch.setattr(tree_pass, "node_inputs", misstated)
    model = tiny_gpt_factory(SEQ_GPT)
    params = SamplingParams()
    counts = sequence_counts(run_sampler, model, get_sampler("mcsjd", window=4, candidates=3, branch_depth=2), params,
                             batches=2)
    assert chi_square_p(counts, exact_joint(model, params)) < 1e-6


@pytest.mark.parametrize("params", [SamplingParams(), GREEDY["greedy-cfg"]], ids=["sampled", "greedy-cfg"])
def test_a_compiled_run_compiles_the_passes_without_branches_and_draws_the_eager_runs_tokens(
        run_sampler, tiny_gpt_factory, monkeypatch, params) -> None:
    """compile=True: passes without branches take the compiled static form (the Jacobi drafter's step inside),
    tree passes run eagerly; here without compiling, the same tokens and passes as the eager run for the seed."""
    compiled = []

    def compile_step(step, mode, config=None):
        return lambda *args: compiled.append(step.__name__) or step(*args)

    monkeypatch.setattr(sampler_module, "compile_step", compile_step)
    model = tiny_gpt_factory(IMAGE)
    sampler = get_sampler("mcsjd", window=8, candidates=3, branch_depth=3, node_cost=0.028, free_nodes=10)
    eager = run_sampler(sampler, model, CLASSES, params)
    assert compiled == []
    static = run_sampler(get_sampler({**sampler.to_dict(), "compile": True}), model, CLASSES, params)
    assert torch.equal(static.tokens, eager.tokens)
    assert static.stats.accepted_lengths == eager.stats.accepted_lengths
    trees = static.stats.details["tree_nodes_per_pass"] > 8 + 1 / static.stats.forward_passes
    assert trees and 0 < compiled.count("verify_and_draft") < static.stats.forward_passes - 1


@pytest.mark.parametrize("params", [SamplingParams(), GREEDY["greedy-cfg"]], ids=["sampled", "greedy-cfg"])
def test_at_a_cpus_pass_cost_the_tree_preset_is_mcsjd_at_the_devices_window(run_sampler, tiny_gpt_factory,
                                                                             params) -> None:
    """No branch pays where every node costs a twentieth of a step, so no pass is planned: mcsjd's draws."""
    model = tiny_gpt_factory(IMAGE)
    tree = run_sampler(get_sampler("mcsjd-tree"), model, CLASSES, params, seed=2)
    single = run_sampler(get_sampler("mcsjd", window=16), model, CLASSES, params, seed=2)
    assert torch.equal(tree.tokens, single.tokens) and tree.stats.forward_passes == single.stats.forward_passes
    assert tree.stats.details["planned_share"] == 0.0


@pytest.mark.parametrize("drafter", ["jacobi", "neighbour"])
def test_the_tree_preset_takes_the_devices_window(run_sampler, tiny_gpt_factory, drafter) -> None:
    """``window=0``: 16 on a CPU (mcsjd's fastest window on this project's CPU), the drafter told the same."""
    model = tiny_gpt_factory(IMAGE)
    params = GREEDY["greedy-cfg"]
    sampler = get_sampler("mcsjd-tree", drafter=drafter)
    assert sampler.window == 0
    out = run_sampler(sampler, model, CLASSES, params)
    assert out.stats.details["window"] == 16 and torch.equal(out.tokens, ar(model, CLASSES, params))
    assert max(out.stats.accepted_lengths) <= 16


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(accept="lantern"), "exact rule"),
    (dict(drafter="head"), "Jacobi or neighbour drafts"),
    (dict(compile="reduce-overhead"), "CUDA graph"),
    (dict(candidates=0), "candidates must be"),
    (dict(candidates=9), "candidates must be"),
])
def test_bad_tree_options_fail_with_a_clear_message(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        get_sampler("mcsjd", **{"candidates": 3, **kwargs})
