"""Switching a stream's target mid-stream: LongLive's KV re-cache makes the cache a fresh encoding of the resident
frames under the new condition (the sinks kept with ``recache-keep-sink``), ``plain`` keeps the old cache and
``reset`` starts over; nothing before a switch depends on how it is made; a switch applies at the block holding its
frame; a stream without switches is the stream it always was; and memory stays flat however often it switches."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from vgen.models.conditioning import cat_conditions
from vgen.samplers.streaming import SWITCH_MODES, BlockStreamer, StreamConfig, StreamControl

SWITCHED = dict(steps=1, first_steps=2, cfg_scale=2.0, sink_frames=2, window_frames=4)  # guided: [cond; null] rows


def run_recorded(model, mode: str | None, targets=(0, 1), switches=((9, 2),), encode=None):
    """Stream 2 videos (classes 0 and 1) of 12 frames, switching to class 2 at frame 9 (block 4, after two
    evictions) unless ``mode`` is None. Returns the blocks, the context each block attended to (the cache at its
    start) and the noise levels of each block's denoising steps."""
    contexts, sigmas = [], []
    prepare = model.prepare_context

    def record(kvs, frames):
        contexts.append(None if kvs is None else [(k.clone(), v.clone()) for k, v in kvs])
        sigmas.append([])
        return prepare(kvs, frames)

    model.prepare_context = record
    streamer = BlockStreamer(model, StreamConfig(**SWITCHED, switch=mode or "recache"), encode=encode)
    velocity = streamer._velocity

    def steps(x, s, *args):
        sigmas[-1].append(s)
        return velocity(x, s, *args)

    streamer._velocity = steps
    blocks = list(streamer.stream(list(targets), 12, seed=4, switches=switches if mode else ()))
    del model.prepare_context
    return blocks, contexts, sigmas


def assert_kv_close(got, want) -> None:
    for (k, v), (k2, v2) in zip(got, want, strict=True):
        torch.testing.assert_close(k, k2, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v, v2, atol=1e-5, rtol=1e-5)


def test_each_switch_mode_leaves_the_cache_its_definition_says_and_nothing_before_the_switch_changes(
        tiny_blockdiff) -> None:
    model, tokens = tiny_blockdiff, tiny_blockdiff.config.tokens_per_block
    base, base_contexts, _ = run_recorded(model, None)
    runs = {mode: run_recorded(model, mode) for mode in SWITCH_MODES}
    resident = torch.cat([base[i].latents for i in (0, 2, 3)], dim=1)  # the sink and the window before block 4
    fresh = model.clean_context(torch.cat([resident, resident]), torch.tensor([2, 2, 3, 3]))  # [cond; null] rows
    for mode, (blocks, contexts, sigmas) in runs.items():
        for b, a in zip(blocks[:4], base[:4]):  # frames 0..7: bit-equal, whatever the mode
            assert np.array_equal(b.frames, a.frames), mode
        assert [b.switched for b in blocks] == [False] * 4 + [True, False], mode
        assert [b.class_ids for b in blocks] == [[0, 1]] * 4 + [[2, 2]] * 2, mode
        assert (blocks[4].recache_s > 0) == mode.startswith("recache") and blocks[3].recache_s == 0
        switched = contexts[4]
        if mode == "recache":
            assert_kv_close(switched, fresh)
        elif mode == "recache-keep-sink":
            assert_kv_close([(k[:, :, :tokens], v[:, :, :tokens]) for k, v in switched],
                            [(k[:, :, :tokens], v[:, :, :tokens]) for k, v in base_contexts[4]])
            assert_kv_close([(k[:, :, tokens:], v[:, :, tokens:]) for k, v in switched],
                            [(k[:, :, tokens:], v[:, :, tokens:]) for k, v in fresh])
        elif mode == "plain":
            assert all(torch.equal(k, k2) and torch.equal(v, v2)
                       for (k, v), (k2, v2) in zip(switched, base_contexts[4], strict=True))
        else:  # reset: an empty cache, and the block after it denoised like a first block
            assert switched is None and contexts[5] is not None
            assert len(sigmas[4]) == SWITCHED["first_steps"] and len(sigmas[5]) == SWITCHED["steps"]
    after = {mode: np.concatenate([b.frames for b in blocks[4:]], axis=1) for mode, (blocks, _, _) in runs.items()}
    assert len({a.tobytes() for a in after.values()}) == 4  # four ways to switch, four different continuations



def test_a_text_stream_switches_prompt_and_each_block_names_the_prompt_it_was_drawn_under(
        tiny_text_blockdiff) -> None:
    """LongLive's case: the cache re-encoded under the new caption, its null rows under the null caption."""
    model, words = tiny_text_blockdiff
    first, second = "a red star on a white background", "a blue ring moving right"
    blocks, contexts, _ = run_recorded(model, "recache", [first, first], [(9, second)], words.condition)
    assert [b.prompts for b in blocks] == [[first, first]] * 4 + [[second, second]] * 2
    assert all(b.class_ids == [] for b in blocks) and [b.switched for b in blocks] == [False] * 4 + [True, False]
    resident = torch.cat([blocks[i].latents for i in (0, 2, 3)], dim=1)
    caption = words.condition([second, second])
    assert_kv_close(contexts[4], model.clean_context(torch.cat([resident, resident]),
                                                     cat_conditions([caption, model.null_condition(caption)])))
    unswitched, _, _ = run_recorded(model, None, [first, first], encode=words.condition)
    assert all(np.array_equal(a.frames, b.frames) for a, b in zip(blocks[:4], unswitched[:4]))
    assert not np.array_equal(blocks[5].frames, unswitched[5].frames)


@pytest.mark.parametrize("mode", ["recache", "plain"])
def test_each_stream_may_switch_to_its_own_target_and_draws_what_it_would_under_a_shared_switch(tiny_blockdiff,
                                                                                                   mode) -> None:
    """Rows are independent: a batch switching to (2, 0) draws row 0 as a batch switching both to 2 does, and row
    1 as a batch switching both to 0 does."""
    tiny_blockdiff.eval()
    each, _, _ = run_recorded(tiny_blockdiff, mode, switches=[(9, [2, 0])])
    for row, target in ((0, 2), (1, 0)):
        shared, _, _ = run_recorded(tiny_blockdiff, mode, switches=[(9, target)])
        for a, b in zip(each, shared, strict=True):
            assert np.abs(a.frames[row].astype(int) - b.frames[row].astype(int)).max() <= 1
    assert [b.class_ids for b in each] == [[0, 1]] * 4 + [[2, 0]] * 2 and each[4].switched


def test_a_text_stream_switches_each_stream_to_its_own_prompt(tiny_text_blockdiff) -> None:
    model, words = tiny_text_blockdiff
    first, second, third = "a red star on a white background", "a blue ring moving right", "a green heart"
    blocks, _, _ = run_recorded(model, "recache", [first, first], [(9, [second, third])], words.condition)
    assert [b.prompts for b in blocks] == [[first, first]] * 4 + [[second, third]] * 2


@pytest.mark.parametrize("targets, switches, message", [
    ([1], (), r"^the model is prompt-conditioned: give a prompt, not the class id 1$"),
    (["a red star"], [(4, 2)], r"^the model is prompt-conditioned: give a prompt, not the class id 2$"),
    (["a red star"], [(4, "  ")], r"^a prompt is empty: give the text of what to draw$"),
])
def test_a_text_stream_refuses_class_ids_and_empty_prompts_before_any_block(tiny_text_blockdiff, targets, switches,
                                                                             message) -> None:
    model, words = tiny_text_blockdiff
    streamer = BlockStreamer(model, StreamConfig(sink_frames=0, window_frames=2), encode=words.condition)
    with pytest.raises(ValueError, match=message):
        next(streamer.stream(targets, 8, switches=switches))
    with pytest.raises(ValueError, match="^a text model streams prompts: give BlockStreamer its text encoder"):
        BlockStreamer(model, StreamConfig(sink_frames=0, window_frames=2))

# Per-block pixel sums of 2 class streams (classes 0 and 2, seed 7, 12 frames), recorded before switches existed:
# without a switch, and with set_class(1) after block 2 (the switch then was a plain one). A float reordering may
# move a pixel by one level; any change in what the stream computes moves these sums by hundreds.
GOLDEN = {
    "plain": (dict(steps=2, first_steps=3, sink_frames=2, window_frames=4),
              [396279, 396829, 394429, 394216, 389753, 390947],
              [396279, 396829, 394429, 392801, 388209, 389416]),
    "guided": (dict(steps=2, first_steps=3, cfg_scale=2.5, cfg_min_sigma=0.7, sink_frames=2, window_frames=4),
               [396232, 397433, 395489, 395421, 391470, 392189],
               [396232, 397433, 395489, 391473, 387409, 388395]),
    "recompute": (dict(steps=1, first_steps=2, sink_frames=2, window_frames=4, refresh="recompute", cfg_scale=2.0),
                  [394917, 399584, 395644, 394521, 393334, 393743],
                  [394917, 399584, 395644, 391180, 389879, 390316]),
    "retrieval": (dict(steps=1, first_steps=2, sink_frames=2, window_frames=2, retrieved_blocks=1, bank_blocks=2),
                  [394535, 398627, 394565, 393475, 391791, 392450],
                  [394535, 398627, 394565, 391907, 390104, 390717]),
    "renoise": (dict(steps=2, first_steps=2, solver="renoise", context_noise=0.1, sink_frames=0, window_frames=4),
                [394287, 392614, 376836, 389481, 391412, 382780],
                [394287, 392614, 376836, 387175, 389520, 380808]),
}


@pytest.mark.parametrize("name", GOLDEN)
def test_class_streams_draw_the_frames_they_drew_before_switches_existed(tiny_blockdiff, name) -> None:
    settings, unswitched, plain_switch = GOLDEN[name]

    def sums(switch: bool) -> list[int]:
        control = StreamControl()
        out = []
        for block in BlockStreamer(tiny_blockdiff, StreamConfig(**settings, switch="plain")).stream(
                [0, 2], 12, seed=7, control=control):
            out.append(int(block.frames.astype(np.int64).sum()))
            if switch and block.block_index == 2:
                control.set_class(1)
        return out

    for got, want in ((sums(False), unswitched), (sums(True), plain_switch)):
        assert np.abs(np.subtract(got, want)).max() <= 8, (got, want)


def test_switch_to_applies_at_the_next_block_and_is_then_forgotten(tiny_blockdiff) -> None:
    control = StreamControl()
    streamer = BlockStreamer(tiny_blockdiff, StreamConfig(steps=1, first_steps=1, sink_frames=2, window_frames=4))
    seen = []
    for block in streamer.stream([0], 12, seed=0, control=control):
        seen.append((block.class_ids[0], block.switched, block.recache_s > 0))
        if block.block_index == 1:
            control.switch_to(2)
    assert seen == [(0, False, False)] * 2 + [(2, True, True)] + [(2, False, False)] * 3
    assert control.pending_switch() is None
    control.set_class(1)
    assert control.pending_switch() == 1 and control.pending_switch() is None


def test_a_cancel_during_the_recache_yields_nothing_more(tiny_blockdiff, monkeypatch) -> None:
    control = StreamControl()
    clean_context = tiny_blockdiff.clean_context

    def cancel_while_recaching(*args):
        control.cancel()
        return clean_context(*args)

    monkeypatch.setattr(tiny_blockdiff, "clean_context", cancel_while_recaching)
    streamer = BlockStreamer(tiny_blockdiff, StreamConfig(steps=1, first_steps=1, sink_frames=2, window_frames=4))
    blocks = list(streamer.stream([0], 12, seed=0, control=control, switches=[(4, 1)]))
    assert [b.block_index for b in blocks] == [0, 1] and control.cancelled


@pytest.mark.parametrize("switches, message", [
    ([(0, 1)], r"^switch at frame 0: a switch frame must lie in 1\.\.7 \(the stream has 8 frames\)$"),
    ([(8, 1)], "switch at frame 8: a switch frame must lie in 1..7"),
    ([(4, 1), (4, 2)], "^switch at frame 4 comes after the switch at frame 4: switch frames must increase"),
    ([(6, 1), (2, 2)], "^switch at frame 2 comes after the switch at frame 6"),
    ([(2, "a red star")], "^the model is class-conditional: give a class id, not the prompt 'a red star'$"),
    ([(2, 5)], "^class id 5 is out of range for a model with 3 classes"),
    ([(2, [1, 2])], r"^switch at frame 2: 2 targets for 1 videos; give one target for all or one per video$"),
    ([(2, [5])], "^class id 5 is out of range for a model with 3 classes"),
])
def test_bad_switches_are_refused_before_any_block(tiny_blockdiff, monkeypatch, switches, message) -> None:
    def never(*args):
        raise AssertionError("a block was drawn")

    streamer = BlockStreamer(tiny_blockdiff, StreamConfig(sink_frames=0, window_frames=2))
    monkeypatch.setattr(streamer, "_velocity", never)
    with pytest.raises(ValueError, match=message):
        next(streamer.stream([0], 8, switches=switches))


SWITCH_MEMORY_PROBE = """
import json, torch
from vgen.models.blockdiff import BlockDiffConfig, BlockDiffusionTransformer
from vgen.samplers.streaming import BlockStreamer, StreamConfig, StreamProfile
torch.manual_seed(0)
torch.set_num_threads(1)
model = BlockDiffusionTransformer(BlockDiffConfig(frame_size=64, patch_size=8, train_frames=8, dim=24, n_layer=1,
                                                  n_head=2)).eval()
profile = StreamProfile(2)
streamer = BlockStreamer(model, StreamConfig(steps=1, first_steps=1, sink_frames=2, window_frames=4, cfg_scale=2.0))
for block in streamer.stream([0], 300, switches=[(f, (f // 8) % 8) for f in range(8, 300, 8)]):
    profile.add(block)
print(json.dumps(profile.memory_mb))
"""


def test_resident_memory_stays_flat_over_many_switches() -> None:
    """64-px frames make a block's clean frames 96 KiB: keeping every block's (not just the resident ones') would
    grow the process by 14 MiB over the stream."""
    out = subprocess.run([sys.executable, "-c", SWITCH_MEMORY_PROBE], capture_output=True, text=True, check=True)
    memory = json.loads(out.stdout)
    assert len(memory) == 150  # 300 frames in 2-frame blocks, a re-cache every 4 blocks
    warm = max(memory[:30])  # after the window has filled, the first re-caches ran and every buffer exists
    assert max(memory[30:]) - warm < 2.0, (warm, max(memory[30:]))
