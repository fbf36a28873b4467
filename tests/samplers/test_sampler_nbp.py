"""NBPSampler against a naive loop with no cache: step k reruns the full forward on the grid drawn so far (undrawn
blocks hold a placeholder, which the block-causal mask hides from block k), guides, processes and draws block k's
tokens in one multinomial call, as the sampler contract says (a hybrid model's block 0: one token per step). Tokens
must agree exactly, so the cache, the block bookkeeping, CFG batching, the interval and the linear schedule are all
checked; the stats must count the forward passes the model really ran (one per block, plus B - 1 when hybrid)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from vgen.samplers import NBPSampler, SamplingParams, available_samplers, get_sampler

CLASSES = torch.tensor([0, 4, 2])


def naive_generate(model, class_ids, params: SamplingParams, draw: Callable, schedule: str = "constant",
                   seed: int = 0, prefix: torch.Tensor | None = None) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    guided = params.cfg_scale > 1.0
    cond = torch.cat([class_ids, torch.full_like(class_ids, model.num_classes)]) if guided else class_ids
    b, k_total = model.block_size, model.num_tokens // model.block_size
    # (block, first token, last token + 1) drawn per step
    steps = [(k, k * b, (k + 1) * b) for k in range(k_total)]
    if model.hybrid:  # the first hybrid_blocks blocks one token a step
        m = model.config.hybrid_blocks
        steps = [(i // b, i, i + 1) for i in range(m * b)] + steps[m:]
    seq = torch.full((len(class_ids), model.num_tokens), 7)
    given = 0 if prefix is None else prefix.shape[1]
    if given:
        seq[:, :given] = prefix
    with torch.no_grad():
        for k, first, end in steps:
            if end <= given:  # a given token is fed, not drawn
                continue
            logits = model(cond, torch.cat([seq, seq]) if guided else seq)[:, first:end]
            if guided:
                c, u = logits.chunk(2)
                if schedule == "linear":
                    scale = 1 + (params.cfg_scale - 1) * (k + 1) / k_total
                else:  # guided while the step's first token index is <= cfg_interval + 1 (AR's token index)
                    on = params.cfg_interval < 0 or first <= params.cfg_interval + 1
                    scale = params.cfg_scale if on else 1.0
                logits = u + (c - u) * scale
            seq[:, first:end] = draw(logits, params, generator)
    return seq


@pytest.mark.parametrize("grid, block, hybrid, hybrid_blocks", [
    ((3, 4), "row", False, 1), ((4, 2, 2), "frame", False, 1), ((2, 2, 3), "row", False, 1),
    ((3, 4), "row", True, 1), ((4, 2, 2), "frame", True, 1), ((3, 2, 3), "row", True, 2)])
def test_tokens_equal_the_uncached_full_forward_loop(tiny_nbp_factory, run_sampler, reference_draw, sampling_params,
                                                     grid, block, hybrid, hybrid_blocks) -> None:
    model = tiny_nbp_factory(grid, block, hybrid=hybrid, hybrid_blocks=hybrid_blocks)
    out = run_sampler("nbp", model, CLASSES, sampling_params, seed=11)
    assert torch.equal(out.tokens, naive_generate(model, CLASSES, sampling_params, reference_draw, seed=11))


@pytest.mark.parametrize("hybrid", [False, True])
@pytest.mark.parametrize("name", ["greedy-cfg", "sampled-cfg"])
def test_the_linear_schedule_equals_the_naive_ramp_and_differs_from_constant(tiny_nbp_factory, run_sampler,
                                                                             reference_draw, sampling_table, name,
                                                                             hybrid) -> None:
    model, params = tiny_nbp_factory((4, 2, 2), "frame", hybrid=hybrid), sampling_table[name]
    out = run_sampler(NBPSampler(cfg_schedule="linear"), model, CLASSES, params, seed=5)
    assert torch.equal(out.tokens, naive_generate(model, CLASSES, params, reference_draw, "linear", seed=5))
    const = run_sampler("nbp", model, CLASSES, params, seed=5)
    assert not torch.equal(out.tokens, const.tokens)
    assert out.stats.details["cfg_schedule"] == "linear"


@pytest.mark.parametrize("grid, block, steps", [((3, 4), "row", 3), ((4, 2, 2), "frame", 4), ((4, 2, 2), "row", 8)])
def test_one_forward_pass_per_block_counted_and_run(run_sampler, tiny_nbp_factory, grid, block, steps) -> None:
    model = tiny_nbp_factory(grid, block)
    calls = []
    model.layers[0].register_forward_hook(lambda *_: calls.append(1))
    out = run_sampler("nbp", model, CLASSES, SamplingParams(cfg_scale=2.0))
    assert out.stats.forward_passes == len(calls) == steps == model.num_steps
    assert out.stats.tokens == 3 * model.num_tokens and out.stats.tokens_per_forward == model.block_size
    b = model.block_size
    assert torch.equal(out.stats.accept_step[0], torch.arange(model.num_tokens) // b + 1)


def test_a_hybrid_model_draws_block_0_one_token_per_pass(run_sampler, tiny_nbp_factory) -> None:
    model = tiny_nbp_factory((4, 2, 2), "frame", hybrid=True)  # blocks of 4: 4 passes for block 0, then 3
    calls = []
    model.layers[0].register_forward_hook(lambda *_: calls.append(1))
    out = run_sampler("nbp", model, CLASSES, SamplingParams(cfg_scale=2.0))
    assert out.stats.forward_passes == len(calls) == model.num_steps == 7
    assert out.stats.details["hybrid"] is True
    assert out.stats.accept_step[0].tolist() == [1, 2, 3, 4] + [5] * 4 + [6] * 4 + [7] * 4


def test_a_whole_first_frame_drawn_token_by_token_then_rows(run_sampler, tiny_nbp_factory) -> None:
    """hybrid_blocks = H in row blocks: frame 0 one token per pass (an image model's order), then one pass per
    row: 6 + 4 = 10 passes for 3 frames of 2 x 3, counted and run, and each token's pass recorded."""
    model = tiny_nbp_factory((3, 2, 3), "row", hybrid=True, hybrid_blocks=2)
    calls = []
    model.layers[0].register_forward_hook(lambda *_: calls.append(1))
    out = run_sampler("nbp", model, CLASSES, SamplingParams(cfg_scale=2.0))
    assert out.stats.forward_passes == len(calls) == model.num_steps == 10
    assert out.stats.details["first_tokens"] == 6
    assert out.stats.accept_step[0].tolist() == [1, 2, 3, 4, 5, 6] + [7] * 3 + [8] * 3 + [9] * 3 + [10] * 3


@pytest.mark.parametrize(("grid", "block", "hybrid_blocks", "blocks", "passes"), [
    ((4, 2, 2), "frame", 0, 1, 3), ((4, 2, 2), "frame", 0, 3, 1), ((4, 2, 2), "frame", 1, 1, 3),
    ((4, 2, 2), "frame", 1, 3, 1), ((3, 2, 3), "row", 2, 2, 4), ((3, 2, 3), "row", 2, 1, 10)])
def test_a_prefix_of_whole_blocks_is_kept_and_continued(tiny_nbp_factory, run_sampler, reference_draw, sampling_table,
                                                        grid, block, hybrid_blocks, blocks, passes) -> None:
    """Given leading blocks (NBP's frame prediction): kept as given, and the rest drawn as the uncached loop draws
    it from the same prefix. Given blocks that cover the token-by-token start run in one pass with the class (K - k
    passes for k of K blocks); a shorter prefix is fed at the passes that would draw it. Only drawn tokens count."""
    model = tiny_nbp_factory(grid, block, hybrid=hybrid_blocks > 0, hybrid_blocks=max(1, hybrid_blocks))
    params = sampling_table["sampled-cfg"]
    prefix = torch.randint(40, (3, blocks * model.block_size), generator=torch.Generator().manual_seed(2))
    calls = []
    model.layers[0].register_forward_hook(lambda *_: calls.append(1))
    out = run_sampler("nbp", model, CLASSES, params, seed=9, prefix=prefix)
    given = prefix.shape[1]
    assert torch.equal(out.tokens[:, :given], prefix)
    assert out.stats.forward_passes == len(calls) == passes and out.stats.details["given_tokens"] == given
    assert out.stats.tokens == 3 * (model.num_tokens - given)
    assert int(out.stats.accept_step.amax()) == passes
    assert torch.equal(out.tokens, naive_generate(model, CLASSES, params, reference_draw, seed=9, prefix=prefix))
    free = run_sampler("nbp", model, CLASSES, params, seed=9)
    assert not torch.equal(out.tokens[:, given:], free.tokens[:, given:])


def test_same_seed_same_tokens_other_seed_other_tokens(tiny_nbp_factory, run_sampler) -> None:
    model = tiny_nbp_factory((3, 4))
    a, b, c = (run_sampler("nbp", model, CLASSES, SamplingParams(), seed=seed).tokens for seed in (3, 3, 4))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_registered_for_next_block_models_only(tiny_nar_factory) -> None:
    assert available_samplers("next-block") == ["nbp"]
    assert isinstance(get_sampler("nbp"), NBPSampler)
    assert get_sampler({"name": "nbp", "cfg_schedule": "linear"}) == NBPSampler("linear")
    with pytest.raises(ValueError, match="sampler 'nbp' does not fit NARTransformer \\(next-neighbour tokens\\); "
                                         "samplers that do: nar$"):
        NBPSampler().sample(tiny_nar_factory((3, 3)), CLASSES, SamplingParams())


def test_bad_input_raises(tiny_nbp_factory) -> None:
    model = tiny_nbp_factory((3, 4))
    with pytest.raises(ValueError, match="cfg_schedule must be one of"):
        NBPSampler(cfg_schedule="cosine")
    with pytest.raises(ValueError, match=r"class id 5 is out of range for a model with 5 classes \(valid: 0..4\)"):
        NBPSampler().sample(model, torch.tensor([5]), SamplingParams())
    for prefix, message in [(torch.zeros(2, 4, dtype=torch.long), r"prefix must be \[batch=3, tokens\]"),
                            (torch.zeros(3, 3, dtype=torch.long), "whole blocks of 4 tokens and fewer than all 12"),
                            (torch.zeros(3, 12, dtype=torch.long), "whole blocks of 4 tokens and fewer than all 12"),
                            (torch.full((3, 4), 40), r"integer token ids in \[0, 40\)"),
                            (torch.zeros(3, 4), r"integer token ids in \[0, 40\), got torch.float32")]:
        with pytest.raises(ValueError, match=message):
            NBPSampler().sample(model, CLASSES, SamplingParams(), prefix=prefix)
    with pytest.raises(ValueError, match="training mode"):
        NBPSampler().sample(model.train(), CLASSES, SamplingParams())
