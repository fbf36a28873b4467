"""The block-diffusion transformer: block-causal attention, cached block-by-block passes equal to the whole-clip
pass, and keys that do not depend on where a block sits (so a rolling cache can re-position them)."""

from __future__ import annotations

import pytest
import torch

from vgen.hub import from_pretrained, save_pretrained
from vgen.models.blockdiff import (
    BlockDiffConfig,
    BlockDiffusionTransformer,
    block_causal_frame_mask,
    timestep_embedding,
)


def test_block_causal_mask_is_full_inside_a_block_and_causal_across() -> None:
    mask = block_causal_frame_mask(num_frames=4, frames_per_block=2, tokens_per_frame=1)
    expected = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(mask, expected)
    big = block_causal_frame_mask(num_frames=6, frames_per_block=2, tokens_per_frame=3)
    block = torch.arange(18) // 6
    for i in range(18):
        for j in range(18):
            assert bool(big[i, j]) == bool(block[j] <= block[i])


def _blocks(model, frames, sigma, class_ids):
    """The clip block by block with the keys/values of earlier blocks as context (no cache object)."""
    fpb, context, outs = model.frames_per_block, None, []
    for k in range(frames.shape[1] // fpb):
        v, kvs = model.forward_block(frames[:, k * fpb:(k + 1) * fpb], sigma[:, k], class_ids,
                                     model.prepare_context(context, k * fpb))
        outs.append(v)
        context = kvs if context is None else [(torch.cat([a, k_], 2), torch.cat([b, v_], 2))
                                               for (a, b), (k_, v_) in zip(context, kvs)]
    return torch.cat(outs, dim=1), context


def test_block_by_block_equals_the_whole_clip_pass(tiny_blockdiff) -> None:
    torch.manual_seed(1)
    frames = torch.randn(2, 8, 16, 16, 3)
    sigma = torch.tensor([[0.0, 0.0, 0.4, 0.9], [0.2, 0.0, 0.7, 1.0]])
    class_ids = torch.tensor([0, 2])
    full = tiny_blockdiff(frames, sigma, class_ids)
    cached, _ = _blocks(tiny_blockdiff, frames, sigma, class_ids)
    assert full.abs().mean() > 0.1
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-5)


def test_clean_context_equals_the_keys_written_block_by_block(tiny_blockdiff) -> None:
    frames = torch.randn(1, 6, 16, 16, 3)
    class_ids = torch.tensor([1])
    _, written = _blocks(tiny_blockdiff, frames, torch.zeros(1, 3), class_ids)
    fresh = tiny_blockdiff.clean_context(frames, class_ids)
    for (k1, v1), (k2, v2) in zip(written, fresh):
        torch.testing.assert_close(k2, k1, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v2, v1, atol=1e-5, rtol=1e-5)


def test_the_output_depends_on_the_context_but_first_layer_keys_do_not_depend_on_position(tiny_blockdiff) -> None:
    block = torch.randn(1, 2, 16, 16, 3)
    other = torch.randn(1, 2, 16, 16, 3)
    s, c = torch.tensor([0.5]), torch.tensor([0])
    alone, kv_alone = tiny_blockdiff.forward_block(block, s, c, None)
    _, ctx = tiny_blockdiff.forward_block(other, torch.zeros(1), c, None)
    after, kv_after = tiny_blockdiff.forward_block(block, s, c, tiny_blockdiff.prepare_context(ctx, 2))
    assert (after - alone).abs().max() > 1e-3
    # keys are cached before rotation: the first layer's depend on the block alone, not on its position
    torch.testing.assert_close(kv_after[0][0], kv_alone[0][0])


def test_a_class_per_block_matches_one_class_per_clip(tiny_blockdiff) -> None:
    frames, sigma = torch.randn(1, 4, 16, 16, 3), torch.rand(1, 2)
    one = tiny_blockdiff(frames, sigma, torch.tensor([2]))
    per_block = tiny_blockdiff(frames, sigma, torch.tensor([[2, 2]]))
    torch.testing.assert_close(per_block, one)


def test_the_class_starts_as_loud_as_the_noise_level_in_the_conditioning() -> None:
    """The class embedding is added to the noise-level embedding; at DiT's N(0, 0.02) it was about 3% of it and a
    4,000-step run learned to ignore the class, so it starts at unit scale, comparable to the noise level."""
    torch.manual_seed(0)
    model = BlockDiffusionTransformer(BlockDiffConfig())
    with torch.no_grad():
        cls = model.class_embedding.weight.norm(dim=1)
        t_emb = model.time_mlp(timestep_embedding(torch.tensor([0.1, 0.5, 0.9]), model.config.dim)).norm(dim=1)
    assert 0.5 < float(cls.mean() / t_emb.mean()) < 4.0, (cls.mean(), t_emb.mean())


def test_config_round_trips_and_weights_load(tmp_path, tiny_blockdiff) -> None:
    save_pretrained(tiny_blockdiff, tmp_path / "m")
    loaded = from_pretrained(tmp_path / "m")
    assert loaded.config == tiny_blockdiff.config
    x, s, c = torch.randn(1, 2, 16, 16, 3), torch.rand(1, 1), torch.tensor([1])
    torch.testing.assert_close(loaded(x, s, c), tiny_blockdiff(x, s, c))


@pytest.mark.parametrize("kwargs, message", [
    ({"frame_size": 30, "patch_size": 4}, "multiple of patch_size"),
    ({"train_frames": 15, "frames_per_block": 2}, "multiple of frames_per_block"),
    ({"dim": 40, "n_head": 8}, "head_dim"),
])
def test_bad_configs_are_rejected(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        BlockDiffConfig(**kwargs)


def test_bad_inputs_are_rejected(tiny_blockdiff) -> None:
    c = torch.tensor([0])
    with pytest.raises(ValueError, match="frames must be"):
        tiny_blockdiff(torch.randn(1, 2, 8, 8, 3), torch.rand(1, 1), c)
    with pytest.raises(ValueError, match="sigma must be"):
        tiny_blockdiff(torch.randn(1, 4, 16, 16, 3), torch.rand(1, 3), c)
    with pytest.raises(ValueError, match="class ids"):
        tiny_blockdiff(torch.randn(1, 2, 16, 16, 3), torch.rand(1, 1), torch.tensor([7]))
    with pytest.raises(ValueError, match="exceed"):
        tiny_blockdiff.prepare_context([(torch.zeros(1, 4, 1, 12),) * 2] * 2, 8)
    with pytest.raises(ValueError, match="together"):
        tiny_blockdiff.prepare_context(None, 2)
