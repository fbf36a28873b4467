"""The prompt-conditioned streaming recipe: the text encoder keeps shapes-t2i's words and adds the moving captions';
a teacher starts from a class model, trains its encoder with it, and resumes to the same state; a student distils
a text teacher on its own streams, prompt switches included, with the encoder frozen; the KL fine-tune and the
latent cache serve the moving scenes."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from vgen.data.moving_scenes import MovingScenesConfig, cached_moving_scenes
from vgen.data.moving_scenes import caption_vocabulary as moving_words
from vgen.data.scenes import caption_vocabulary as scene_words
from vgen.hub import from_pretrained, save_pretrained
from vgen.models.blockdiff import BlockDiffConfig, BlockDiffusionTransformer
from vgen.models.word_encoder import WordEncoderConfig, WordTextEncoder
from vgen.tokenizers.kl import KLConfig, KLTokenizer
from vgen.training import t2v_stream
from vgen.training.t2v_stream import (
    T2VRecipe,
    cached_moving_latents,
    export,
    extend_vocabulary,
    fit_caption_pool,
    start_text_stream,
    stream_vocabulary,
    train_stream_kl,
    train_t2v_stream,
)
from vgen.training.trainer import TrainConfig

SCENES = MovingScenesConfig(num_frames=6, frame_size=16, supersample=1)  # 16-px frames through a 4x KL: 4 x 4 x 2
CLASS = BlockDiffConfig(frame_size=4, channels=2, patch_size=2, frames_per_block=2, train_frames=6, dim=32,
                        n_layer=1, n_head=2, num_classes=8)
RECIPE = T2VRecipe(num_clips=8, batch_size=4, lone_block_share=0.0)
TRAIN = TrainConfig(steps=2, lr=1e-3, warmup_steps=1, log_every=1, bf16=False, checkpoint_every_minutes=0)


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    """A tiny KL tokenizer, class teacher and shapes-t2i-like encoder (weights N(0, 0.1)), and rendered scenes."""
    root = tmp_path_factory.mktemp("t2v")
    torch.manual_seed(0)
    kl = KLTokenizer(KLConfig(block_out_channels=(8, 8, 8), norm_num_groups=4, image_size=16, latent_channels=2))
    model = BlockDiffusionTransformer(CLASS)
    encoder = WordTextEncoder(WordEncoderConfig.for_words(scene_words(), dim=16, n_layer=1, n_head=2,
                                                          max_length=24))
    for module in (model, encoder):
        with torch.no_grad():
            for p in module.parameters():
                p.normal_(std=0.1)
    for module, name in ((kl, "kl"), (model, "class/blockdiff"), (encoder, "t2i_encoder")):
        save_pretrained(module, root / name)
    cached_moving_latents(root / "kl", root / "data", RECIPE.num_clips, root / "latents", scenes=SCENES)
    return root


def teacher_run(parts, run, train=TRAIN, max_minutes=None):
    return train_t2v_stream(run, parts / "data", train, RECIPE, parts / "kl", parts / "class",
                            scenes=SCENES, max_minutes=max_minutes, text_encoder_from=parts / "t2i_encoder")


def test_the_stream_encoder_reads_shapes_t2i_words_as_before_and_knows_the_motion_words(parts) -> None:
    source = from_pretrained(parts / "t2i_encoder").eval()
    words = stream_vocabulary(source.config)
    assert words[:len(source.config.vocabulary)] == source.config.vocabulary
    assert set(moving_words()) <= set(words) and len(set(words)) == len(words)
    extended = extend_vocabulary(source, words).eval()
    still = "a small red star in the top left corner on a striped background"
    assert torch.equal(extended.condition(still).values, source.condition(still).values)
    assert "bouncing" in extended.known and "bouncing" not in source.known


def test_a_teacher_starts_from_the_class_model_with_the_caption_in_place_of_the_class(parts) -> None:
    net = start_text_stream(parts / "class", parts / "t2i_encoder")
    source = from_pretrained(parts / "class/blockdiff")
    assert net.model.is_text and net.model.config == replace(CLASS, text_dim=16, text_tokens=24)
    own = net.model.state_dict()
    for name, tensor in source.state_dict().items():
        if name in own:
            assert torch.equal(own[name], tensor), name
    assert all(name.startswith(("text_pool", "null_caption")) or ".cross." in name
               for name in set(own) - set(source.state_dict()))


def test_a_fitted_caption_pool_makes_a_fresh_teacher_the_class_model_of_each_captions_shape(parts) -> None:
    """Fitted on the training captions, the pooled caption's projection gives every caption its shape's class row
    (so the text model's velocity is the class model's for that shape) and the null caption the null row."""
    net = start_text_stream(parts / "class", parts / "t2i_encoder").eval()
    source = from_pretrained(parts / "class/blockdiff").eval()
    _, captions, attributes = cached_moving_scenes(parts / "data", "train", RECIPE.num_clips, SCENES)
    shapes = torch.as_tensor(attributes[:, 0])
    # 8 captions and 16 features: a near-exact fit with a small ridge
    assert fit_caption_pool(net.model, source, net.text_encoder, captions, shapes, ridge=1e-6) == 1.0
    torch.manual_seed(1)
    frames, sigma = torch.randn(len(captions), 4, 4, 4, 2), torch.rand(len(captions), 2)
    cond = net.text_encoder.condition(captions)
    with torch.no_grad():
        torch.testing.assert_close(net.model(frames, sigma, cond), source(frames, sigma, shapes), atol=2e-3, rtol=0)
        torch.testing.assert_close(net.model(frames, sigma, net.model.null_condition(cond)),
                                   source(frames, sigma, torch.full_like(shapes, CLASS.num_classes)),
                                   atol=2e-3, rtol=0)


def test_a_caption_pool_fit_needs_one_class_per_caption_among_the_class_models(parts) -> None:
    net = start_text_stream(parts / "class", parts / "t2i_encoder")
    source = from_pretrained(parts / "class/blockdiff")
    with pytest.raises(ValueError, match="2 captions but 1 classes"):
        fit_caption_pool(net.model, source, net.text_encoder, ["a red star", "a blue ring"], [0])
    with pytest.raises(ValueError, match=r"classes must be ids in \[0, 8\)"):
        fit_caption_pool(net.model, source, net.text_encoder, ["a red star"], [8])


def test_two_teacher_steps_train_the_encoder_with_the_transformer_and_export_both(parts, tmp_path) -> None:
    start = start_text_stream(parts / "class", parts / "t2i_encoder")
    teacher_run(parts, tmp_path / "run")
    log = [json.loads(line) for line in (tmp_path / "run/log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == [1, 2] and log[0]["init_from"] == str(parts / "class")
    _, captions, attributes = cached_moving_scenes(parts / "data", "train", RECIPE.num_clips, SCENES)
    torch.manual_seed(TRAIN.seed)  # the run's own start
    fresh = start_text_stream(parts / "class", parts / "t2i_encoder")
    fitted = fit_caption_pool(fresh.model, from_pretrained(parts / "class/blockdiff"), fresh.text_encoder, captions,
                              attributes[:, 0])
    assert log[0]["caption_pool_fit"] == fitted  # a teacher from a class model starts from its shapes' rows
    encoder, model = (from_pretrained(tmp_path / "run/export" / name) for name in ("text_encoder", "blockdiff"))
    assert isinstance(encoder, WordTextEncoder) and model.is_text
    assert not torch.equal(encoder.embed.weight, start.text_encoder.embed.weight)
    assert not torch.equal(model.text_pool.weight, start.model.text_pool.weight)


def test_a_teacher_may_start_its_caption_pool_as_initialised(parts, tmp_path) -> None:
    recipe = replace(RECIPE, caption_pool="initialised")
    train_t2v_stream(tmp_path / "run", parts / "data", replace(TRAIN, steps=1), recipe, parts / "kl", parts / "class",
                     scenes=SCENES, text_encoder_from=parts / "t2i_encoder")
    log = [json.loads(line) for line in (tmp_path / "run/log.jsonl").read_text().splitlines()]
    assert "caption_pool_fit" not in log[0]
    with pytest.raises(ValueError, match="^caption_pool must be one of fitted, initialised, got 'random'$"):
        replace(RECIPE, caption_pool="random")


def test_a_resumed_teacher_reaches_the_state_of_one_that_never_stopped(parts, tmp_path) -> None:
    whole = teacher_run(parts, tmp_path / "whole")
    teacher_run(parts, tmp_path / "split", max_minutes=0)  # stops after its first step, checkpointed
    assert (tmp_path / "split/latest").read_text().strip() == "step-00000001"
    resumed = teacher_run(parts, tmp_path / "split")
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_student_distils_on_its_own_streams_through_a_prompt_switch_with_the_encoder_frozen(parts,
                                                                                               tmp_path) -> None:
    teacher = export(start_text_stream(parts / "class", parts / "t2i_encoder"), tmp_path / "teacher")
    recipe = replace(RECIPE, rollout_share=1.0, switch_share=1.0, rollout_blocks=2, rollout_steps=1)
    train_t2v_stream(tmp_path / "student", parts / "data", TRAIN, recipe, parts / "kl", teacher=teacher,
                     teacher_cfg=3.0, scenes=SCENES)
    log = [json.loads(line) for line in (tmp_path / "student/log.jsonl").read_text().splitlines()]
    steps = [r for r in log if "loss" in r]
    # a stream of 2 blocks switching at its second: the first step's block is drawn before the switch, the next after
    assert [(r["rollout"], r["switched"]) for r in steps] == [(1.0, 0.0), (1.0, 1.0)]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in steps)
    frozen, taught = (from_pretrained(folder / "text_encoder") for folder in (teacher, tmp_path / "student/export"))
    assert all(torch.equal(a, b) for a, b in zip(frozen.state_dict().values(), taught.state_dict().values()))
    assert from_pretrained(tmp_path / "student/export/blockdiff").config.class_dropout_prob == 0.0


def test_the_latents_are_encoded_once_into_the_cache(parts, monkeypatch) -> None:
    latents, captions = cached_moving_latents(parts / "kl", parts / "data", RECIPE.num_clips, parts / "latents",
                                              scenes=SCENES)
    assert latents.shape == (8, 6, 4, 4, 2) and latents.dtype == "float16" and len(captions) == 8
    monkeypatch.setattr(t2v_stream, "load_kl", lambda *a: pytest.fail("encoded again"))
    again, _ = cached_moving_latents(parts / "kl", parts / "data", 8, parts / "latents", scenes=SCENES)
    assert (again == latents).all()


def test_the_kl_fine_tune_starts_from_the_given_tokenizer_and_reports_how_scenes_survive_it(parts, tmp_path,
                                                                                               tiny_scene_judge):
    train = TrainConfig(steps=1, lr=1e-3, warmup_steps=1, bf16=False)
    figures = train_stream_kl(tmp_path / "kl", parts / "kl", parts / "data", train, num_clips=4, batch_size=4,
                              scenes=SCENES, judge=tiny_scene_judge, num_val=2)
    tuned = from_pretrained(tmp_path / "kl/export")
    assert tuned.config.latent_scale != from_pretrained(parts / "kl").config.latent_scale  # refitted
    log = [json.loads(line) for line in (tmp_path / "kl/log.jsonl").read_text().splitlines()]
    assert log[0]["init_from"] == str(parts / "kl") and log[-1] == json.loads(json.dumps(figures))
    assert figures["steps"] == 1
    for name in ("start", "tuned"):
        assert set(figures[name]) == {"psnr", "real", "reconstructed"} and 0 < figures[name]["psnr"] < 100
        assert set(figures[name]["reconstructed"]) == {"shape", "colour", "background"}
    assert figures["start"]["real"] == figures["tuned"]["real"]  # the real frames are judged alike
    assert figures["start"]["psnr"] != figures["tuned"]["psnr"]


@pytest.mark.parametrize("field, value", [("noise_shift", 0.0), ("switch_share", 1.5), ("batch_size", 0)])
def test_a_recipe_out_of_range_is_one_line_naming_the_field(field, value) -> None:
    with pytest.raises(ValueError, match=field):
        T2VRecipe(**{field: value})


def test_a_student_needs_guidance_to_distil(parts, tmp_path) -> None:
    teacher = export(start_text_stream(parts / "class", parts / "t2i_encoder"), tmp_path / "teacher")
    with pytest.raises(ValueError, match="CFG scale > 1"):
        train_t2v_stream(tmp_path / "s", parts / "data", TRAIN, RECIPE, parts / "kl", teacher=teacher,
                         teacher_cfg=1.0, scenes=SCENES)
