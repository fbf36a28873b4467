"""The streaming sampler: with the whole past in its window it equals denoising against a whole-clip pass; its
rolling cache keeps exactly what its policy says; it yields in order, without gaps, the same for the same seed;
it obeys its controls; and its memory does not grow with the length of the stream."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from vgen.models.blockdiff import BlockDiffConfig
from vgen.samplers.streaming import BlockStreamer, StreamConfig, StreamControl, flow_sigmas


def test_flow_sigmas_run_from_one_to_zero_and_shift_spends_steps_at_high_noise() -> None:
    plain, shifted = flow_sigmas(4, 1.0), flow_sigmas(4, 3.0)
    torch.testing.assert_close(plain, torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))
    assert shifted[0] == 1.0 and shifted[-1] == 0.0
    assert bool((shifted[1:] < shifted[:-1]).all()) and bool((shifted[1:-1] > plain[1:-1]).all())
    with pytest.raises(ValueError, match="steps"):
        flow_sigmas(0, 1.0)


def reference_stream(model, class_ids: list[int], num_blocks: int, config: StreamConfig, seed: int,
                     clamp: bool = True) -> torch.Tensor:
    """Denoise each block with the whole-clip pass over [clean past frames, the noisy block] (no cache), guided on
    the steps that start at or above ``cfg_min_sigma``, by Euler steps or by the predicted clean block noised
    afresh (``config.solver``); pixel blocks are clamped to [-1, 1] (``clamp``), latent blocks are not."""
    g = torch.Generator().manual_seed(seed)
    fpb, size, channels = model.frames_per_block, model.config.frame_size, model.config.channels
    labels = torch.tensor(class_ids)
    past = torch.zeros(len(labels), 0, size, size, channels)
    for k in range(num_blocks):
        x = torch.randn(len(labels), fpb, size, size, channels, generator=g)
        sigmas = flow_sigmas(config.first_steps if k == 0 else config.steps, config.shift).tolist()
        for s, s_next in zip(sigmas[:-1], sigmas[1:]):
            sigma = torch.cat([torch.zeros(len(labels), k), torch.full((len(labels), 1), s)], dim=1)
            clip = torch.cat([past, x], dim=1)
            v = model(clip, sigma, labels)[:, -fpb:]
            if config.cfg_scale > 1 and s >= config.cfg_min_sigma:
                v_u = model(clip, sigma, model.null_condition(labels))[:, -fpb:]
                v = v_u + config.cfg_scale * (v - v_u)
            if config.solver == "euler":
                x = x + (s_next - s) * v
            else:
                x0 = x - s * v
                x = x0 if s_next == 0 else (1 - s_next) * x0 + s_next * torch.randn(x.shape, generator=g)
        past = torch.cat([past, x.clamp(-1, 1) if clamp else x], dim=1)
    return past


@pytest.mark.parametrize("cfg_scale, cfg_min_sigma, solver", [
    (1.0, 0.0, "euler"), (2.5, 0.0, "euler"), (2.5, 0.7, "euler"), (2.5, 0.8, "euler"),
    (1.0, 0.0, "renoise"), (2.5, 0.7, "renoise")])
def test_stream_equals_denoising_against_the_whole_clip(tiny_blockdiff, cfg_scale, cfg_min_sigma, solver) -> None:
    """Guided on every step, on none, and inside a guidance interval (the first block's 3 steps start at noise
    levels 1, 0.86 and 0.6 under shift 3: two are guided; the later blocks' 2 steps start at 1 and 0.75: two are,
    so the interval is also checked at 0.8 where only one is); with either solver."""
    config = StreamConfig(steps=2, first_steps=3, cfg_scale=cfg_scale, cfg_min_sigma=cfg_min_sigma, solver=solver,
                          sink_frames=0, window_frames=6)
    streamer = BlockStreamer(tiny_blockdiff, config)
    frames = [b.frames for b in streamer.stream([0, 2], num_frames=8, seed=3)]
    got = torch.from_numpy(np.concatenate(frames, axis=1))
    want = reference_stream(tiny_blockdiff, [0, 2], 4, config, seed=3)
    want_u8 = (want * 127.5 + 128.0).clamp(0, 255).to(torch.uint8)
    assert (got.int() - want_u8.int()).abs().max() <= 1  # one uint8 level of float rounding at most


def test_a_latent_stream_is_the_unclamped_stream_decoded_block_by_block(tiny_blockdiff_factory) -> None:
    """A model of latent frames (2 channels here) keeps its blocks unclamped in the cache, and each block is decoded
    once, in order, before it is yielded: pixels of the decoder's size."""
    model = tiny_blockdiff_factory(BlockDiffConfig(frame_size=8, channels=2, patch_size=2, frames_per_block=2,
                                                   train_frames=8, dim=48, n_layer=2, n_head=4, num_classes=3))
    decoded = []

    def decode(latents: torch.Tensor) -> torch.Tensor:  # [B, F, 8, 8, 2] -> [B, F, 16, 16, 3] in [-1, 1]
        decoded.append(latents.shape[1])
        pixels = torch.cat([latents, latents[..., :1]], dim=-1).tanh()
        return pixels.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3)

    config = StreamConfig(steps=2, first_steps=3, cfg_scale=2.0, sink_frames=0, window_frames=6)
    blocks = list(BlockStreamer(model, config, decode).stream([0, 2], num_frames=7, seed=3))
    assert decoded == [2, 2, 2, 1] and [b.frames.shape for b in blocks] == [(2, 2, 16, 16, 3)] * 3 + [(2, 1, 16, 16, 3)]
    want = reference_stream(model, [0, 2], 4, config, seed=3, clamp=False)[:, :7]
    assert want.abs().max() > 1  # unclamped latents: a clamp anywhere would change the stream
    want_u8 = (decode(want) * 127.5 + 128.0).clamp(0, 255).to(torch.uint8)
    got = torch.from_numpy(np.concatenate([b.frames for b in blocks], axis=1))
    assert (got.int() - want_u8.int()).abs().max() <= 1


def _recording(cache):
    """Wrap ``cache.push`` to keep every block's keys/values as pushed."""
    pushed = []
    original = cache.push

    def push(kvs):
        pushed.append([(k.clone(), v.clone()) for k, v in kvs])
        return original(kvs)
    cache.push = push
    return pushed


def test_after_eviction_the_cache_holds_the_sinks_and_the_newest_blocks_as_written(tiny_blockdiff) -> None:
    streamer = BlockStreamer(tiny_blockdiff, StreamConfig(steps=1, first_steps=1, sink_frames=2, window_frames=4))
    cache = streamer.new_cache(1)
    pushed = _recording(cache)
    list(streamer.stream([1], num_frames=14, seed=0, cache=cache))
    assert cache.block_ids == [0, 5, 6]
    context, blocks, _ = cache.context()
    assert blocks == 3
    for layer, (k, v) in enumerate(context):
        torch.testing.assert_close(k, torch.cat([pushed[i][layer][0] for i in (0, 5, 6)], dim=2))
        torch.testing.assert_close(v, torch.cat([pushed[i][layer][1] for i in (0, 5, 6)], dim=2))


def _clean_blocks(model):
    """Wrap ``model.forward_block`` to keep the input of every cache-writing (noise level 0) pass."""
    clean = []
    original = model.forward_block

    def forward_block(frames, sigma, *args):
        if bool((sigma == 0).all()):
            clean.append(frames.clone())
        return original(frames, sigma, *args)
    model.forward_block = forward_block
    return clean


def test_recompute_refresh_makes_the_cache_a_fresh_encoding_of_the_kept_frames(tiny_blockdiff_factory) -> None:
    def run(refresh):
        model = tiny_blockdiff_factory()
        clean = _clean_blocks(model)
        streamer = BlockStreamer(model, StreamConfig(steps=1, first_steps=1, sink_frames=2, window_frames=4,
                                                     refresh=refresh))
        cache = streamer.new_cache(1)
        list(streamer.stream([2], num_frames=14, seed=0, cache=cache))
        assert cache.block_ids == [0, 5, 6]
        kept = torch.cat([clean[i] for i in cache.block_ids], dim=1)
        return cache.context()[0], model.clean_context(kept, torch.tensor([2]))

    context, fresh = run("recompute")
    for (k, v), (k2, v2) in zip(context, fresh):
        torch.testing.assert_close(k, k2, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v, v2, atol=1e-5, rtol=1e-5)
    stale, fresh = run("none")
    # without the refresh the window's deeper keys still carry the evicted context
    assert (stale[-1][0] - fresh[-1][0]).abs().max() > 1e-3


def test_blocks_come_in_order_without_gaps_and_the_last_one_is_cut(tiny_blockdiff) -> None:
    blocks = list(BlockStreamer(tiny_blockdiff, StreamConfig(steps=1, first_steps=1, sink_frames=0,
                                                             window_frames=2)).stream([0], 7, seed=0))
    assert [b.block_index for b in blocks] == [0, 1, 2, 3]
    assert [b.start_frame for b in blocks] == [0, 2, 4, 6]
    assert [b.frames.shape[1] for b in blocks] == [2, 2, 2, 1]
    assert blocks[0].frames.dtype.name == "uint8" and blocks[0].frames.shape[2:] == (16, 16, 3)


def test_the_same_seed_gives_the_same_stream(tiny_blockdiff) -> None:
    streamer = BlockStreamer(tiny_blockdiff, StreamConfig(steps=1, first_steps=2, sink_frames=2, window_frames=2))

    def run(seed):
        return [b.frames for b in streamer.stream([1], 12, seed=seed)]
    a, b, c = run(5), run(5), run(6)
    assert all((x == y).all() for x, y in zip(a, b))
    assert any((x != y).any() for x, y in zip(a, c))


def test_a_class_switch_takes_effect_at_the_next_block_and_stop_ends_the_stream(tiny_blockdiff) -> None:
    control = StreamControl()
    streamer = BlockStreamer(tiny_blockdiff, StreamConfig(steps=1, first_steps=1, sink_frames=0, window_frames=2))
    seen = []
    for block in streamer.stream([0], 40, seed=0, control=control):
        seen.append(block.class_ids[0])
        if block.block_index == 1:
            control.set_class(2)
        if block.block_index == 3:
            control.stop()
    assert seen == [0, 0, 2, 2]


def test_cancel_ends_the_stream_at_the_next_denoising_step_inside_a_block(tiny_blockdiff, monkeypatch) -> None:
    control = StreamControl()
    streamer = BlockStreamer(tiny_blockdiff, StreamConfig(steps=50, first_steps=1, sink_frames=0, window_frames=2))
    velocity, steps = streamer._velocity, []

    def cancel_after_the_first_step(*args):
        steps.append(args[1])
        if len(steps) == 2:  # the first denoising step of the second block
            control.cancel()
        return velocity(*args)

    monkeypatch.setattr(streamer, "_velocity", cancel_after_the_first_step)
    blocks = list(streamer.stream([0], 40, seed=0, control=control))
    assert [b.block_index for b in blocks] == [0] and len(steps) == 2  # 1 of the block's 50 steps ran
    assert control.stopped and control.cancelled


def test_pause_holds_the_stream_until_resume(tiny_blockdiff) -> None:
    control = StreamControl()
    streamer = BlockStreamer(tiny_blockdiff, StreamConfig(steps=1, first_steps=1, sink_frames=0, window_frames=2))
    stream = streamer.stream([0], 8, seed=0, control=control)
    next(stream)
    control.pause()
    got = []
    worker = threading.Thread(target=lambda: got.append(next(stream)))
    worker.start()
    worker.join(timeout=0.5)
    assert worker.is_alive() and not got  # paused before the next block
    control.resume()
    worker.join(timeout=10)
    assert got and got[0].block_index == 1


@pytest.mark.parametrize("kwargs, message", [
    ({"steps": 0}, "steps"),
    ({"context_noise": 1.0}, "context_noise"),
    ({"cfg_scale": -1.0}, "cfg_scale"),
    ({"cfg_min_sigma": 1.5}, "cfg_min_sigma"),
    ({"refresh": "sometimes"}, "refresh"),
    ({"solver": "heun"}, "solver"),
    ({"retrieved_blocks": 1}, "bank"),
])
def test_bad_stream_configs_are_rejected(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        StreamConfig(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    ({"window_frames": 1}, "whole number"),
    ({"window_frames": 0}, "smaller than a block"),
    ({"sink_frames": 2, "window_frames": 6}, "exceed the 8 frames"),
])
def test_windows_that_do_not_fit_the_model_are_rejected(tiny_blockdiff, kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        BlockStreamer(tiny_blockdiff, StreamConfig(**kwargs))


@pytest.mark.parametrize("class_ids, frames, message", [([0], 0, "frames must be > 0"), ([3], 4, "out of range"),
                                                        ([], 4, "no class ids")])
def test_bad_requests_are_rejected(tiny_blockdiff, class_ids, frames, message) -> None:
    streamer = BlockStreamer(tiny_blockdiff, StreamConfig(sink_frames=0, window_frames=2))
    with pytest.raises(ValueError, match=message):
        next(streamer.stream(class_ids, frames))


MEMORY_PROBE = """
import json, torch
from vgen.models.blockdiff import BlockDiffConfig, BlockDiffusionTransformer
from vgen.samplers.streaming import BlockStreamer, StreamConfig, StreamProfile
torch.manual_seed(0)
torch.set_num_threads(1)
model = BlockDiffusionTransformer(BlockDiffConfig(frame_size=16, train_frames=8, dim=48, n_layer=2, n_head=4)).eval()
profile = StreamProfile(2)
streamer = BlockStreamer(model, StreamConfig(steps=1, first_steps=1, sink_frames=2, window_frames=4))
for block in streamer.stream([0], 400):
    profile.add(block)
print(json.dumps(profile.memory_mb))
"""


@pytest.mark.slow
def test_resident_memory_stays_flat_over_a_long_stream() -> None:
    out = subprocess.run([sys.executable, "-c", MEMORY_PROBE], capture_output=True, text=True, check=True)
    memory = json.loads(out.stdout)
    assert len(memory) == 200  # 400 frames in 2-frame blocks, 50x the model's 8 trained frames
    warm = max(memory[:20])  # after the window has filled and every buffer exists
    assert max(memory[20:]) - warm < 4.0, (warm, max(memory[20:]))
