"""A language model writing image codes between fixed tokens (:class:`~vgen.models.mllm.LayoutLM`) computes, on every
decode path, what one plain forward pass over the whole sequence (prompt, codes, row ends) computes at the positions
that predict codes: teacher-forced, token by token, in per-row windows across row ends (eager and static), and in
the static one-step form; a left-padded row equals its unpadded run."""

from __future__ import annotations

import pytest
import torch

from vgen.models.conditioning import PrefixCondition, cat_conditions
from vgen.models.mllm import MLLMConfig
from vgen.samplers.speculative.tree import TreeShape

GRID = (2, 3)  # W = 3 codes a row, E = 1 row end, a head of 2


@pytest.fixture(scope="module", params=[False, True], ids=["llama", "qk-norm"])
def case(request, tiny_layout_lm, layout_prompts, layout_reference):
    """A model, prompts of 3 lengths (left-padded), codes, and the reference logits of each row (unpadded)."""
    model = tiny_layout_lm(GRID, qk_norm=request.param)
    cond = layout_prompts(model, (3, 1, 5))
    codes = torch.randint(model.vocab_size, (3, model.num_tokens), generator=torch.Generator().manual_seed(1))
    expected = torch.cat([layout_reference(model, cond.values[b][cond.mask[b]], codes[b:b + 1])
                          for b in range(len(codes))])
    return model, cond, codes, expected


def test_teacher_forced_decode_equals_the_full_sequence_forward(case) -> None:
    model, cond, codes, expected = case
    cache = model.new_cache(len(codes))
    first = model.prefill(cond, cache)[:, None]
    logits = torch.cat([first, model.decode(codes[:, :-1], cache)], dim=1)
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    assert logits.std() > 0.5  # informative logits: a wrong position would show


def test_token_by_token_decode_writes_the_row_ends(case) -> None:
    model, cond, codes, expected = case
    cache = model.new_cache(len(codes))
    steps = [model.prefill(cond, cache)]
    steps += [model.decode(codes[:, t:t + 1], cache)[:, -1] for t in range(model.num_tokens - 1)]
    torch.testing.assert_close(torch.stack(steps, 1), expected, rtol=1e-4, atol=1e-4)
    assert cache.length == cond.length + model.token_layout.offset(model.num_tokens - 1)


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_per_row_windows_across_row_ends_equal_the_full_forward(case, static) -> None:
    """Each row runs its own windows of 3 codes (window[0] = code start - 1), advancing 2, 1 or 3 codes a pass, so
    the rows' windows start at different slots, on both sides of a row end; every window's logits equal the
    reference's."""
    model, cond, codes, expected = case
    n, k = model.num_tokens, 3
    cache = model.new_cache(len(codes), extra=k)
    model.prefill(cond, cache)
    padded = torch.cat([codes, codes[:, :k]], dim=1)  # codes past the end: anything
    pos = torch.ones(3, dtype=torch.long)
    while bool((pos < n).any()):
        window = padded.gather(1, (pos - 1)[:, None] + torch.arange(k))
        end = int(pos.max()) + k if static else None
        logits = model.decode_rows(window, pos, cache, static=static, image_end=end)
        for b in range(len(codes)):
            real = min(k, n - int(pos[b]))
            if real > 0:
                torch.testing.assert_close(logits[b, :real], expected[b, pos[b]:pos[b] + real], rtol=1e-4, atol=1e-4)
        pos = (pos + torch.tensor([2, 1, 3])).clamp(max=n)


def test_the_static_step_equals_the_full_forward_at_every_step(case) -> None:
    model, cond, codes, expected = case
    cache = model.new_cache(len(codes))
    steps, slot = [model.prefill(cond, cache)], torch.ones(1, dtype=torch.long)
    for t in range(model.num_tokens - 1):
        steps.append(model.decode_step(codes[:, t:t + 1], slot, cache))
        cache.advance(1)
        slot += 1
    torch.testing.assert_close(torch.stack(steps, 1), expected, rtol=1e-4, atol=1e-4)


def test_a_left_padded_row_equals_its_unpadded_run(case, layout_prompts) -> None:
    model, cond, codes, _ = case
    alone = cond[1:2]
    alone = PrefixCondition(alone.values[:, ~(~alone.mask).all(0)], alone.mask[:, ~(~alone.mask).all(0)])
    assert alone.length < cond.length and alone.mask.all()
    runs = []
    for c, rows in ((cond, codes), (alone, codes[1:2])):
        cache = model.new_cache(len(rows))
        runs.append(torch.cat([model.prefill(c, cache)[:, None], model.decode(rows[:, :-1], cache)], dim=1))
    torch.testing.assert_close(runs[0][1:2], runs[1], rtol=1e-5, atol=1e-5)


def test_the_null_prompt_travels_with_its_rows_and_guides_the_cfg_batch(tiny_layout_lm, layout_prompts) -> None:
    model = tiny_layout_lm(GRID)
    cond = layout_prompts(model, (3, 1))
    negative = layout_prompts(model, (6, 2), seed=5)
    with_null = PrefixCondition(cond.values, cond.mask, negative)
    assert model.null_condition(with_null) is negative
    assert torch.equal(with_null[1:].null.values, negative.values[1:]) and with_null.to("cpu").null is not None
    batch = cat_conditions([with_null, model.null_condition(with_null)])  # lengths 5 and 8: left-padded to 8
    assert batch.length == 8 and torch.equal(batch.values[2:], negative.values)
    assert torch.equal(batch.values[:2, -cond.length:], cond.values) and not batch.mask[:2, :3].any()
    head = model.null_condition(cond)  # no negative prompt: the head alone (Lumina-mGPT's unconditional context)
    assert head.values.tolist() == [[28, 29], [28, 29]] and head.mask.all()
    model.check_condition(batch)


@pytest.mark.parametrize(("values", "message"), [
    (torch.tensor([[1, 2, 3]]), "must end in the image head ids"),
    (torch.tensor([[1.0, 28, 29]]), "token ids"),
    (torch.tensor([[40, 28, 29]]), r"must lie in \[0, 32\)"),
    (torch.ones(1, 9, dtype=torch.long), "longer than this model's limit of 8"),
])
def test_a_bad_prompt_is_refused_in_one_line(tiny_layout_lm, values, message) -> None:
    with pytest.raises(ValueError, match=message):
        tiny_layout_lm(GRID).check_condition(PrefixCondition(values, torch.ones(values.shape, dtype=torch.bool)))


def test_a_null_is_needed_without_a_head(tiny_layout_lm) -> None:
    model = tiny_layout_lm(GRID, head=())
    with pytest.raises(ValueError, match="negative prompt"):
        model.null_condition(PrefixCondition(torch.tensor([[1, 2]]), torch.ones(1, 2, dtype=torch.bool)))


def test_an_image_larger_than_the_context_is_refused_before_any_weight() -> None:
    with pytest.raises(ValueError, match="takes 4162 positions, more than the model's max_positions 4096"):
        MLLMConfig(vocab_size=16, text_vocab_size=64, dim=32, n_head=4, n_layer=1, image_rows=62, image_cols=62,
                   row_end=(1,), max_prompt_tokens=256, max_positions=4096)


def test_code_embeddings_are_the_text_rows_of_the_codes(tiny_layout_lm) -> None:
    model = tiny_layout_lm(GRID)
    assert torch.equal(model.code_embeddings(), model.text_embeddings.weight[model.code_ids])


def test_a_draft_tree_is_refused_as_its_branches_would_need_their_own_row_ends(tiny_layout_lm) -> None:
    model = tiny_layout_lm(GRID)
    with pytest.raises(NotImplementedError, match="tree verify passes are supported on LlamaGen and Janus"):
        model.decode_rows(torch.zeros(1, 3, dtype=torch.long), torch.ones(1, dtype=torch.long), model.new_cache(1),
                          tree=TreeShape.chain(3))
