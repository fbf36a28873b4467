"""The block-diffusion transformer under a caption (``text_dim > 0``): cached passes equal to the whole clip, inert
padding, a caption that steers the velocity through both of its routes (the pooled adaLN row and cross-attention),
the CFG batch and caption dropout, the start from a class model, refusals, and class models left as they were."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vgen.hub import from_pretrained, save_pretrained
from vgen.models.blockdiff import BlockDiffusionTransformer, start_from_class
from vgen.models.conditioning import PrefixCondition, cat_conditions

PROMPTS = ["a red star moving right", "a large blue ring on a dotted background bouncing"]


def _blocks(model, frames, sigma, cond):
    """The clip block by block with the keys/values of earlier blocks as context: the velocity and every layer's
    keys/values."""
    fpb, context, outs = model.frames_per_block, None, []
    for k in range(frames.shape[1] // fpb):
        v, kvs = model.forward_block(frames[:, k * fpb:(k + 1) * fpb], sigma[:, k], cond,
                                     model.prepare_context(context, k * fpb))
        outs.append(v)
        context = kvs if context is None else [(torch.cat([a, k_], 2), torch.cat([b, v_], 2))
                                               for (a, b), (k_, v_) in zip(context, kvs)]
    return torch.cat(outs, dim=1), context


def _clip(seed: int = 0, batch: int = 2, frames: int = 8) -> torch.Tensor:
    return torch.randn(batch, frames, 16, 16, 3, generator=torch.Generator().manual_seed(seed))


def test_block_by_block_equals_the_whole_clip_pass_under_a_caption(tiny_text_blockdiff) -> None:
    model, words = tiny_text_blockdiff
    cond = words.condition(PROMPTS)
    frames, sigma = _clip(frames=6), torch.tensor([[0.0, 0.4, 0.9], [0.2, 0.0, 1.0]])
    full = model(frames, sigma, cond)
    cached, _ = _blocks(model, frames, sigma, cond)
    assert full.abs().mean() > 0.1
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-5)
    # clean_context (the re-cache at a prompt switch) writes what generating the clean clip wrote
    frames = frames[:, :4]
    _, written = _blocks(model, frames, torch.zeros(2, 2), cond)
    for (k1, v1), (k2, v2) in zip(written, model.clean_context(frames, cond)):
        torch.testing.assert_close(k2, k1, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v2, v1, atol=1e-5, rtol=1e-5)


def test_a_captions_padding_is_inert_in_value_and_in_length(tiny_text_blockdiff) -> None:
    model, words = tiny_text_blockdiff
    cond = words.condition(PROMPTS)
    assert not cond.mask.all()
    frames, sigma = _clip(batch=2, frames=2), torch.tensor([[0.3], [0.8]])
    reference = model(frames, sigma, cond)
    noisy = torch.where(cond.mask[..., None], cond.values, 100 * torch.randn_like(cond.values))
    assert torch.equal(model(frames, sigma, PrefixCondition(noisy, cond.mask)), reference)
    longest = int(cond.mask.sum(1).max())  # the same captions with fewer padding positions
    shorter = PrefixCondition(cond.values[:, -longest:], cond.mask[:, -longest:])
    torch.testing.assert_close(model(frames, sigma, shorter), reference, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("closed", ["text_pool", "cross"])
def test_the_caption_changes_the_velocity_through_each_route(tiny_text_blockdiff, closed) -> None:
    model, words = tiny_text_blockdiff
    with torch.no_grad():  # close one route: the other alone carries the caption
        if closed == "text_pool":
            model.text_pool.weight.zero_()
            model.text_pool.bias.zero_()
        else:
            for layer in model.layers:
                layer.cross.wo.weight.zero_()
    frames, sigma = _clip(batch=1, frames=2).expand(2, -1, -1, -1, -1), torch.full((2, 1), 0.5)
    v = model(frames, sigma, words.condition(PROMPTS))
    assert (v[0] - v[1]).abs().mean() > 1e-3


def test_a_text_model_started_from_a_class_model_is_that_model_with_the_pooled_caption_as_its_class_row(
        tiny_blockdiff, tiny_text_blockdiff) -> None:
    """Fresh from ``start_from_class`` only the text tensors are new, cross-attention is closed (``wo`` zero), and
    the output equals the class model's once the class row holds the projected masked mean of the caption."""
    _, words = tiny_text_blockdiff
    torch.manual_seed(0)
    text = BlockDiffusionTransformer(dataclasses.replace(tiny_blockdiff.config, text_dim=16, text_tokens=24)).eval()
    new = start_from_class(text, tiny_blockdiff)
    assert new == sorted(["text_pool.weight", "text_pool.bias", "null_caption",
                          *(f"layers.{i}.cross.{name}" for i in range(2)
                            for name in ("norm.weight", "norm.bias", "wq.weight", "wkv.weight", "wo.weight",
                                         "q_norm.weight", "k_norm.weight"))])
    cond = words.condition(PROMPTS[1])
    with torch.no_grad():
        pooled = (cond.values * cond.mask[..., None]).sum(1) / cond.mask.sum(1, keepdim=True)
        tiny_blockdiff.class_embedding.weight[1] = text.text_pool(pooled)[0]
    frames, sigma = _clip(batch=1, frames=4), torch.tensor([[0.2, 0.7]])
    torch.testing.assert_close(text(frames, sigma, cond), tiny_blockdiff(frames, sigma, torch.tensor([1])),
                               atol=1e-6, rtol=0)


def test_the_cfg_batch_stacks_the_caption_and_the_null_caption(tiny_text_blockdiff) -> None:
    model, words = tiny_text_blockdiff
    cond = words.condition(PROMPTS)
    null = model.null_condition(cond)
    assert null.mask.all() and torch.equal(null.values[1], model.null_caption.detach())
    frames, sigma = _clip(frames=2), torch.tensor([[0.5], [0.9]])
    both = model(torch.cat([frames, frames]), torch.cat([sigma, sigma]), cat_conditions([cond, null]))
    torch.testing.assert_close(both[:2], model(frames, sigma, cond), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(both[2:], model(frames, sigma, null), atol=1e-5, rtol=1e-5)
    assert (both[:2] - both[2:]).abs().mean() > 1e-3


def test_caption_dropout_replaces_whole_rows_with_the_null_caption(tiny_blockdiff_factory, tiny_text_blockdiff) -> None:
    _, words = tiny_text_blockdiff
    model = tiny_blockdiff_factory(dataclasses.replace(tiny_text_blockdiff[0].config, class_dropout_prob=0.5))
    cond = words.condition([PROMPTS[0]] * 8)
    frames, sigma = _clip(batch=1, frames=2).expand(8, -1, -1, -1, -1), torch.full((8, 1), 0.5)
    kept, dropped = model(frames[:1], sigma[:1], cond[:1]), model(frames[:1], sigma[:1], model.null_condition(cond[:1]))
    torch.manual_seed(0)
    trained = model.train()(frames, sigma, cond)
    is_kept = [torch.allclose(row, kept[0], atol=1e-5) for row in trained]
    is_dropped = [torch.allclose(row, dropped[0], atol=1e-5) for row in trained]
    assert all(a != b for a, b in zip(is_kept, is_dropped))
    assert any(is_kept) and any(is_dropped)


def test_a_text_model_round_trips_through_save_and_load(tmp_path, tiny_text_blockdiff) -> None:
    model, words = tiny_text_blockdiff
    save_pretrained(model, tmp_path / "m")
    loaded = from_pretrained(tmp_path / "m")
    assert loaded.config == model.config and loaded.is_text and loaded.num_classes == 0
    frames, sigma, cond = _clip(batch=1, frames=2), torch.rand(1, 1), words.condition(PROMPTS[0])
    torch.testing.assert_close(loaded(frames, sigma, cond), model(frames, sigma, cond))


def test_the_wrong_kind_of_condition_is_refused_in_one_line(tiny_blockdiff, tiny_text_blockdiff) -> None:
    model, words = tiny_text_blockdiff
    cond = words.condition(PROMPTS[0])
    frames, sigma = _clip(batch=1, frames=2), torch.rand(1, 1)
    wrong = [
        (tiny_blockdiff, cond, "is class-conditional: give class ids, not a text prompt"),
        (model, torch.tensor([0]), "text-conditional: give a prompt"),
        (model, PrefixCondition(torch.zeros(1, 25, 16), torch.ones(1, 25, dtype=torch.bool)),
         "25 positions is longer than this model's text_tokens 24"),
        (model, PrefixCondition(torch.zeros(1, 24, 8), torch.ones(1, 24, dtype=torch.bool)),
         "dimension 8 do not fit this model's text_dim 16"),
    ]
    for target, c, message in wrong:
        calls = ((target.check_condition, (c,)), (target, (frames, sigma, c)),
                 (target.forward_block, (frames, sigma[:, 0], c, None)))
        for call, args in calls:
            with pytest.raises(ValueError, match=message) as error:
                call(*args)
            assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="2 captions for a batch of 1"):
        model(frames, sigma, words.condition(PROMPTS))
    with pytest.raises(ValueError, match="copies a class model into a text model, got a class model and a text"):
        start_from_class(tiny_blockdiff, model)


def test_class_models_keep_their_outputs(tiny_blockdiff) -> None:
    """Golden values of the tiny class model, recorded before text models existed: a class model computes what it
    did (its tensors, initialisation order and operations are untouched)."""
    assert not tiny_blockdiff.is_text and tiny_blockdiff.num_classes == 3
    frames = torch.randn(2, 4, 16, 16, 3, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = tiny_blockdiff(frames, torch.tensor([[0.0, 0.6], [0.3, 1.0]]), torch.tensor([1, 3]))
    golden = torch.tensor([0.21566811, 1.31983304, -0.36425447, 0.55708957, -0.23491898, -0.37251106])
    torch.testing.assert_close(torch.cat([out[0, 1, 5, 7], out[1, 3, 0, 0]]), golden, atol=2e-6, rtol=0)
    assert abs(float(out.abs().mean()) - 0.55839366) < 1e-6
