"""Token statistics score every generated token with the distribution its sampler drew it from, for next-token
(LlamaGen, class or text-conditioned) and whole-grid (NAR) models alike. Clip quality: real moving-shapes clips
pass the per-frame class check and the motion check, relabelled, morphing, frozen and flickering clips fail the
part they break."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vgen.data.clips import SPLIT_SEEDS, render_clips
from vgen.data.scenes import COLOUR_NAMES, SIZES
from vgen.data.shapes import CLASS_NAMES, render_batch, to_tensor
from vgen.eval.classifier import load_shapes_classifier
from vgen.eval.quality import (
    accuracy_by_request,
    attribute_accuracy,
    class_accuracy,
    clip_class_accuracy,
    frame_change,
    motion_check,
    token_statistics,
)
from vgen.models.classifier import AttributeClassifier
from vgen.models.conditioning import PrefixCondition
from vgen.models.llamagen import GPTConfig, LlamaGenGPT
from vgen.models.nar import NARConfig, NARTransformer
from vgen.samplers import SamplingParams
from vgen.training.scene_judge import SCENE_JUDGE

SIZE = dict(vocab_size=16, dim=32, n_layer=2, n_head=4, multiple_of=16, num_classes=4, token_dropout_p=0.0,
            resid_dropout_p=0.0, ffn_dropout_p=0.0)


def models() -> list[torch.nn.Module]:
    """A fresh next-token and a fresh whole-grid model over 3 x 3 tokens."""
    torch.manual_seed(0)
    return [LlamaGenGPT(GPTConfig(block_size=9, **SIZE)).eval(), NARTransformer(NARConfig(grid=(3, 3), **SIZE)).eval()]


@pytest.mark.parametrize("model", models(), ids=["ar", "nar"])
def test_every_token_is_measured_and_greedy_decoding_has_zero_entropy(model) -> None:
    for name, weight in model.named_parameters():
        if "output" in name:  # the output layers start at zero (uniform logits): give them distinct logits
            torch.nn.init.normal_(weight.data)
    tokens, classes = torch.randint(0, 16, (5, 9)), torch.tensor([0, 1, 2, 3, 0])
    figures = token_statistics(model, tokens, classes, SamplingParams(cfg_scale=2.0, top_k=1))
    assert figures["tokens_measured"] == 5 * 9
    assert figures["mean_entropy_nats"] == pytest.approx(0.0, abs=1e-6) and figures["median_top1_prob"] == 1.0


def test_a_fresh_nar_model_is_uniform_over_the_vocabulary() -> None:
    """NAR's heads start at zero, so every cell's distribution is uniform: entropy ln V, top-1 1/V."""
    model = models()[1]
    figures = token_statistics(model, torch.randint(0, 16, (3, 9)), torch.tensor([0, 1, 2]), SamplingParams())
    assert figures["mean_entropy_nats"] == pytest.approx(math.log(16), abs=1e-5)
    assert figures["median_top1_prob"] == pytest.approx(1 / 16, abs=1e-6)


@pytest.mark.parametrize("model", models(), ids=["ar", "nar"])
def test_scoring_in_small_chunks_gives_the_same_figures(model) -> None:
    """A logit budget of one guided sequence scores the 5 sequences one by one, with the same result."""
    for name, weight in model.named_parameters():
        if "output" in name:
            torch.nn.init.normal_(weight.data)
    tokens, classes = torch.randint(0, 16, (5, 9)), torch.tensor([0, 1, 2, 3, 0])
    params = SamplingParams(cfg_scale=2.0, temperature=0.8)
    whole = token_statistics(model, tokens, classes, params)
    one_by_one = token_statistics(model, tokens, classes, params, max_logits=2 * 9 * 16)
    assert one_by_one == pytest.approx(whole, rel=1e-5) and one_by_one["tokens_measured"] == 45


def test_a_text_to_image_model_is_scored_under_each_rows_prompt_in_any_chunks() -> None:
    torch.manual_seed(0)
    model = LlamaGenGPT(GPTConfig(block_size=9, model_type="t2i", caption_dim=8, cls_token_num=4, **SIZE)).eval()
    torch.nn.init.normal_(model.output.weight.data)
    mask = torch.arange(3) >= torch.tensor([[0], [1], [2], [0], [2]])  # prompts of 3, 2, 1, 3 and 1 positions
    prompts = PrefixCondition.from_padded(torch.randn(5, 3, 8), mask, 4)
    tokens, params = torch.randint(0, 16, (5, 9)), SamplingParams(cfg_scale=2.0, temperature=0.8)
    whole = token_statistics(model, tokens, prompts, params)
    one_by_one = token_statistics(model, tokens, prompts, params, max_logits=2 * 9 * 16)
    assert one_by_one == pytest.approx(whole, rel=1e-5) and whole["tokens_measured"] == 45
    others = PrefixCondition.from_padded(torch.randn(5, 3, 8), mask, 4)
    assert token_statistics(model, tokens, others, params)["mean_entropy_nats"] != whole["mean_entropy_nats"]
    greedy = token_statistics(model, tokens, prompts, SamplingParams(cfg_scale=2.0, top_k=1))
    assert greedy["mean_entropy_nats"] == pytest.approx(0.0, abs=1e-6)


def test_a_janus_model_is_scored_with_the_guided_distributions_its_sampler_draws_from(tiny_janus_dir) -> None:
    """Janus has no whole-sequence forward: its figures come through the KV cache, equal to the guided, processed
    distributions built here from the pipeline's own per-step logits."""
    from vgen.pipelines import load
    from vgen.samplers import apply_cfg, build_processors

    pipe = load(tiny_janus_dir)
    prompts = ["a red cat", "a blue dog on the moon"]
    tokens, params = pipe(prompt=prompts, seed=0).tokens, SamplingParams(cfg_scale=3.0, temperature=0.9, top_k=20)
    both = pipe.logits(prompt=prompts, tokens=tokens, unconditional=True)
    guided = apply_cfg(both, params, torch.arange(tokens.shape[1]))
    probs = build_processors(params)(guided).softmax(-1)
    entropy = -(probs * probs.clamp_min(1e-30).log()).sum(-1)
    figures = token_statistics(pipe.model, tokens, pipe.prompt_encoder(prompts), params)
    assert figures["tokens_measured"] == tokens.numel() == 2 * 16
    assert figures["mean_entropy_nats"] == pytest.approx(float(entropy.mean()), rel=1e-5)
    assert figures["median_top1_prob"] == pytest.approx(float(probs.max(-1).values.median()), rel=1e-5)


@pytest.fixture(scope="module")
def real_clips() -> tuple[np.ndarray, np.ndarray]:
    """16 validation clips (2 per class) of the recipes' 16 frames of 32 px."""
    return render_clips(SPLIT_SEEDS["val"], 0, 16)


def test_the_confusion_counts_say_what_each_requested_class_was_seen_as() -> None:
    images, labels = render_batch(SPLIT_SEEDS["val"], 0, 32)
    classifier, pixels = load_shapes_classifier(), to_tensor(images)
    right = class_accuracy(classifier, pixels, labels.tolist())
    confusion = np.array(right["confusion"])
    assert confusion.shape == (8, 8) and confusion.sum() == 32 and (confusion.sum(1) == 4).all()
    assert np.trace(confusion) / 32 == right["class_accuracy"] >= 31 / 32  # the classifier is >= 99% on real images
    relabelled = np.array(class_accuracy(classifier, pixels, ((labels + 3) % 8).tolist())["confusion"])
    assert (relabelled == np.roll(confusion, 3, axis=0)).all()  # requested c + 3, still seen as c


def test_real_clips_show_their_class_in_every_frame_and_a_wrong_label_scores_near_zero(real_clips) -> None:
    clips, labels = real_clips
    right = clip_class_accuracy(clips, labels)
    assert right["class_accuracy"] >= 15 / 16 and right["frame_accuracy"] > 0.9 and right["identity_kept"] > 0.9
    assert right["num_clips"] == 16 and set(right["per_class"]) == set(range(8))
    assert clip_class_accuracy(clips, (labels + 3) % 8)["class_accuracy"] <= 1 / 16


def test_clip_confusion_counts_say_what_each_requested_class_was_seen_as(real_clips) -> None:
    clips, labels = real_clips
    right = clip_class_accuracy(clips, labels)
    confusion = np.array(right["confusion"])
    assert confusion.shape == (8, 8) and confusion.sum() == 16 and (confusion.sum(1) == 2).all()
    assert np.trace(confusion) / 16 == right["class_accuracy"]
    relabelled = np.array(clip_class_accuracy(clips, (labels + 3) % 8)["confusion"])
    assert (relabelled == np.roll(confusion, 3, axis=0)).all()  # requested c + 3, still seen as c


def test_a_clip_that_turns_into_another_shape_halfway_loses_identity(real_clips) -> None:
    clips, labels = real_clips
    morphing = np.concatenate([clips[:8, :8], clips[8:, :8][[3, 4, 5, 6, 7, 0, 1, 2]]], axis=1)  # 8 + 8 frames
    figures = clip_class_accuracy(morphing, labels[:8])
    assert figures["identity_kept"] <= 0.6
    assert clip_class_accuracy(clips[:8], labels[:8])["identity_kept"] > 0.9
    by_chunk = figures["class_accuracy_by_chunk"]  # each 8-frame chunk judged as a clip of its own
    assert list(by_chunk) == ["frames 0-7", "frames 8-15"]
    assert by_chunk["frames 0-7"] >= 7 / 8 and by_chunk["frames 8-15"] <= 1 / 8
    assert "class_accuracy_by_chunk" not in clip_class_accuracy(clips[:, :8], labels)  # one chunk: the clip


def test_frame_change_is_the_mean_absolute_difference_of_consecutive_frames() -> None:
    clip = np.zeros((1, 3, 2, 2, 3), np.uint8)
    clip[0, 1] = 30  # 0 -> 30 -> 0: a change of 30 grey levels each step
    assert frame_change(clip).tolist() == [30.0]


def test_the_motion_check_passes_real_clips_and_fails_frozen_and_flickering_ones(real_clips) -> None:
    clips, _ = real_clips
    real = motion_check(clips, clips)
    assert real["share_moving"] >= 0.9 and real["share_above_real_p95"] <= 0.1
    frozen = np.repeat(clips[:, :1], clips.shape[1], axis=1)
    assert motion_check(frozen, clips)["share_moving"] == 0.0
    noise = np.random.default_rng(0).integers(0, 256, clips.shape, dtype=np.uint8)
    flicker = motion_check(noise, clips)
    assert flicker["share_above_real_p95"] == 1.0 and flicker["frame_change"] > 5 * real["real_frame_change"]


def test_attribute_accuracy_reports_each_attribute_and_the_joint_share():
    judge = AttributeClassifier(SCENE_JUDGE)
    images = np.zeros((4, 64, 64, 3), np.uint8)
    preds = judge.predict(to_tensor(images)).numpy()
    wanted = preds.copy()
    wanted[0, 1] = (wanted[0, 1] + 1) % 8  # one colour wrong
    figures = attribute_accuracy(judge, images, wanted)
    assert figures["colour"] == 0.75 and figures["shape"] == 1.0 and figures["joint"] == 0.75
    assert figures["position_row"] == figures["position_column"] == 1.0


def test_accuracy_by_request_names_the_values_that_fail_and_splits_every_attribute_by_size():
    judge = AttributeClassifier(SCENE_JUDGE)
    images = np.zeros((4, 64, 64, 3), np.uint8)  # four identical images: the judge reads them alike
    wanted = judge.predict(to_tensor(images)).numpy()
    shape, size = wanted[0, 0], wanted[0, 2]
    wanted[2:, 0] = (shape + 1) % 8  # the last two ask for another shape
    wanted[[1, 3], 2] = 1 - size  # the second and fourth for the other size
    figures = accuracy_by_request(judge, images, wanted)
    assert figures["per_value"]["shape"] == {CLASS_NAMES[shape]: 1.0, CLASS_NAMES[(shape + 1) % 8]: 0.0}
    assert figures["per_value"]["colour"] == {COLOUR_NAMES[wanted[0, 1]]: 1.0}
    seen, other = figures["by_size"][SIZES[size]], figures["by_size"][SIZES[1 - size]]
    assert seen["size"] == 1.0 and other["size"] == 0.0
    assert seen["shape"] == other["shape"] == 0.5  # images 0 / 2 and 1 / 3: one right shape each


def test_a_place_in_the_right_row_but_the_wrong_column_counts_for_the_row_only():
    judge = AttributeClassifier(SCENE_JUDGE)
    images = np.zeros((3, 64, 64, 3), np.uint8)
    wanted = judge.predict(to_tensor(images)).numpy()
    seen = wanted[:, 3].copy()  # the 3 x 3 places in raster order: place = 3 * row + column
    wanted[0, 3] = 3 * (seen[0] // 3) + (seen[0] % 3 + 1) % 3  # same row, another column
    wanted[1, 3] = 3 * ((seen[1] // 3 + 1) % 3) + seen[1] % 3  # same column, another row
    figures = attribute_accuracy(judge, images, wanted)
    assert figures["position"] == pytest.approx(1 / 3)
    assert figures["position_row"] == figures["position_column"] == pytest.approx(2 / 3)
