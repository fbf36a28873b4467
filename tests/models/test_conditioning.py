"""The conditioning contract. A prefix condition is left-padded with a mask that says so, and stacks with others of
its length into the CFG batch. Every class-conditional backbone answers the same questions the same way: its class
count, which class ids it takes (and that it takes no prompt), the null condition CFG pairs with each class (the
extra last row of its class table, which changes the output), and for token models the grid, token count and
vocabulary of its config. The token models start from LlamaGen's init."""

from __future__ import annotations

from functools import cache

import pytest
import torch
from torch import nn

from vgen.models.blockdiff import BlockDiffConfig, BlockDiffusionTransformer
from vgen.models.conditioning import ClassConditional, PrefixCondition, TokenGridModel, cat_conditions
from vgen.models.llamagen import GPTConfig, LlamaGenGPT
from vgen.models.mar import ContinuousAR, MARConfig
from vgen.models.nar import NARConfig, NARTransformer
from vgen.models.nbp import NBPConfig, NBPTransformer

SIZE = dict(vocab_size=16, dim=32, n_layer=1, n_head=4, multiple_of=16, num_classes=5)


@cache
def token_models() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    return {"llamagen": LlamaGenGPT(GPTConfig(block_size=9, **SIZE)),
            "llamagen-video": LlamaGenGPT(GPTConfig(block_size=18, frames=2, **SIZE)),
            "nar": NARTransformer(NARConfig(grid=(3, 3), **SIZE)),
            "nbp": NBPTransformer(NBPConfig(grid=(2, 3, 3), **SIZE))}


@cache
def all_models() -> dict[str, nn.Module]:
    return {**token_models(),
            "mar": ContinuousAR(MARConfig(token_channels=3, grid_size=3, dim=32, n_layer=1, n_head=2, num_classes=5,
                                          head_width=32, head_depth=1, num_sampling_steps=10)),
            "blockdiff": BlockDiffusionTransformer(BlockDiffConfig(frame_size=8, dim=48, n_layer=1, n_head=4,
                                                                   num_classes=5))}


@pytest.mark.parametrize("name", list(all_models()))
def test_the_null_condition_is_the_extra_last_row_of_the_class_table(name) -> None:
    model = all_models()[name]
    assert isinstance(model, ClassConditional) and model.num_classes == 5
    classes = torch.tensor([0, 4, 2])
    null = model.null_condition(classes)
    assert torch.equal(null, torch.full((3,), 5)) and null.dtype == classes.dtype
    tables = [m for m in model.modules() if isinstance(m, nn.Embedding) and m.num_embeddings == 6]
    assert len(tables) == 1 and tables[0].embedding_dim == model.config.dim


@pytest.mark.parametrize("name", list(token_models()))
def test_a_token_model_reports_the_grid_tokens_and_vocabulary_of_its_config(name) -> None:
    model = token_models()[name]
    assert isinstance(model, TokenGridModel)
    expected_grid = {"llamagen": (3, 3), "llamagen-video": (2, 3, 3), "nar": (3, 3), "nbp": (2, 3, 3)}[name]
    assert model.grid == expected_grid and model.num_tokens == torch.Size(expected_grid).numel()
    assert model.vocab_size == 16 == model.tok_embeddings.num_embeddings


@pytest.mark.parametrize("name", list(token_models()))
def test_token_models_start_from_llamagens_init(name) -> None:
    weights = token_models()[name].tok_embeddings.weight.detach()
    assert abs(float(weights.std()) - 0.02) < 0.004 and abs(float(weights.mean())) < 0.005


def prefix(lengths: list[int], total: int = 4, dim: int | None = 3) -> PrefixCondition:
    mask = torch.tensor([[i >= total - n for i in range(total)] for n in lengths])
    shape = (len(lengths), total) if dim is None else (len(lengths), total, dim)
    return PrefixCondition(torch.randn(shape) if dim else torch.randint(0, 9, shape), mask)


def test_a_prefix_condition_holds_left_padded_rows_of_embeddings_or_token_ids() -> None:
    embeds, ids = prefix([4, 2]), prefix([1, 3, 4], dim=None)
    assert (len(embeds), embeds.length, len(ids), ids.length) == (2, 4, 3, 4)
    moved = embeds.to("cpu", torch.float64)
    assert moved.values.dtype == torch.float64 and moved.mask.dtype == torch.bool
    assert ids.to(dtype=torch.float64).values.dtype == ids.values.dtype  # token ids keep their dtype


@pytest.mark.parametrize(("values", "mask", "message"), [
    (torch.zeros(2, 3), torch.tensor([[False, True, True], [True, True, False]]), "left-padded"),
    (torch.zeros(2, 3), torch.tensor([[False, False, False], [True, True, True]]), "at least one real position"),
    (torch.zeros(2, 3), torch.ones(2, 3), "bool tensor of shape"),
    (torch.zeros(2, 3), torch.ones(2, 2, dtype=torch.bool), "bool tensor of shape"),
    (torch.zeros(2), torch.ones(2, dtype=torch.bool), "token ids or"),
])
def test_a_malformed_prefix_condition_is_refused(values, mask, message) -> None:
    with pytest.raises(ValueError, match=message):
        PrefixCondition(values, mask)


def test_conditions_stack_row_by_row_into_the_cfg_batch() -> None:
    assert torch.equal(cat_conditions([torch.tensor([1, 2]), torch.tensor([5, 5])]), torch.tensor([1, 2, 5, 5]))
    a, b = prefix([4, 2]), prefix([1])
    both = cat_conditions([a, b])
    assert torch.equal(both.values, torch.cat([a.values, b.values])) and torch.equal(both.mask[2], b.mask[0])
    with pytest.raises(ValueError, match="different lengths"):
        cat_conditions([a, prefix([1], total=5)])
    with pytest.raises(TypeError, match="different kinds"):
        cat_conditions([a, torch.tensor([1, 2])])


@pytest.mark.parametrize("name", list(all_models()))
def test_a_class_conditional_model_takes_valid_class_ids_and_no_prompt(name) -> None:
    model = all_models()[name]
    model.check_condition(torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="class id 5 is out of range for a model with 5 classes"):
        model.check_condition(torch.tensor([1, 5]))
    with pytest.raises(ValueError, match="1-D integer tensor"):
        model.check_condition(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="is class-conditional: give class ids, not a text prompt"):
        model.check_condition(prefix([2]))


def test_padded_embeddings_become_left_padded_rows_of_the_model_length() -> None:
    embeddings = torch.arange(1.0, 9.0).reshape(2, 4, 1)  # rows [1, 2, 3, 4] and [5, 6, 7, 8]
    right_padded = torch.tensor([[True, True, False, False], [True, True, True, True]])
    cond = PrefixCondition.from_padded(embeddings, right_padded, 4)
    assert cond.values[..., 0].tolist() == [[0.0, 0.0, 1.0, 2.0], [5.0, 6.0, 7.0, 8.0]]
    assert cond.mask.tolist() == [[False, False, True, True], [True, True, True, True]]
    longer = PrefixCondition.from_padded(embeddings, right_padded, 6)  # padded further on the left
    assert longer.values[0, :, 0].tolist() == [0.0, 0.0, 0.0, 0.0, 1.0, 2.0]
    assert longer.mask[1].tolist() == [False, False, True, True, True, True]
    assert torch.equal(PrefixCondition.from_padded(cond.values, cond.mask, 4).values, cond.values)  # left stays left
    with pytest.raises(ValueError, match="longer than the model's 3 caption positions"):
        PrefixCondition.from_padded(embeddings, right_padded, 3)
    with pytest.raises(ValueError, match="at least one token"):
        PrefixCondition.from_padded(embeddings, torch.zeros(2, 4, dtype=torch.bool), 4)


def test_a_prefix_condition_is_indexed_by_rows_as_class_ids_are():
    values = torch.arange(24.0).reshape(3, 2, 4)
    mask = torch.tensor([[True, True], [False, True], [True, True]])
    cond = PrefixCondition(values, mask)
    part = cond[1:]
    assert len(part) == 2 and torch.equal(part.values, values[1:]) and torch.equal(part.mask, mask[1:])
    picked = cond[torch.tensor([2, 0])]
    assert torch.equal(picked.values, values[[2, 0]]) and torch.equal(picked.mask, mask[[2, 0]])
