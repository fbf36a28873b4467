"""Block-diffusion training: the diffusion-forcing loss ignores clean blocks and is the velocity error on the
others; augmentation and windows keep clips valid; a tiny run lowers the loss, resumes and exports a loadable
model; a latent run learns the KL tokenizer's latent frames, and its video model starts from its image model."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from vgen.data.clips import ClipsConfig, cached_clips
from vgen.data.shapes import CLASS_NAMES
from vgen.hub import CheckpointError, from_pretrained, save_pretrained
from vgen.models.blockdiff import BlockDiffConfig, BlockDiffusionTransformer
from vgen.samplers.streaming import BlockStreamer, StreamConfig
from vgen.tokenizers.kl import KLConfig, KLTokenizer
from vgen.training import blockdiff as blockdiff_module
from vgen.training.blockdiff import (
    BlockDiffRecipe,
    Rollouts,
    augment,
    check_latent_fit,
    clips_to_tensor,
    diffusion_forcing_loss,
    guidance_distillation_loss,
    guided_velocity,
    lone_blocks,
    noise_blocks,
    random_windows,
    start_from,
    train_blockdiff,
)
from vgen.training.trainer import TrainConfig, latest_checkpoint

TOY = BlockDiffConfig(frame_size=16, patch_size=4, frames_per_block=2, train_frames=4, dim=32, n_layer=1, n_head=2)


def test_clean_blocks_carry_no_loss_and_noisy_ones_the_velocity_error(monkeypatch) -> None:
    model = BlockDiffusionTransformer(TOY)  # adaLN-Zero init: the prediction is exactly 0
    frames = torch.rand(3, 4, 16, 16, 3) * 2 - 1
    torch.manual_seed(0)
    loss_all_clean, metrics = diffusion_forcing_loss(model, frames, torch.tensor([0, 1, 2]), clean_prob=1.0)
    assert loss_all_clean.item() == 0.0 and metrics["noisy_frac"] == 0.0
    torch.manual_seed(0)
    loss, metrics = diffusion_forcing_loss(model, frames, torch.tensor([0, 1, 2]), clean_prob=0.0)
    torch.manual_seed(0)
    torch.rand(3, 2), torch.rand(3, 2)  # the draws of sigma and of the clean mask
    noise = torch.randn_like(frames)
    assert metrics["noisy_frac"] == 1.0
    assert loss.item() == pytest.approx((noise - frames).pow(2).mean().item(), rel=1e-5)  # |v - 0|^2


def test_augment_flips_space_and_time_and_keeps_every_clip_intact() -> None:
    torch.manual_seed(0)
    clips = torch.rand(64, 4, 16, 16, 3)
    out = augment(clips)
    for a, b in zip(clips, out):
        assert any(torch.equal(b, c) for c in (a, a.flip(2), a.flip(0), a.flip(0).flip(2)))
    changed = sum(not torch.equal(a, b) for a, b in zip(clips, out))
    assert 32 < changed < 64  # about three quarters are flipped one way or the other


def test_a_lone_block_is_never_clean() -> None:
    """With one block per clip (the single-frame image recipe) a clean block would carry no loss and be context
    for nothing, so every block is noisy whatever clean_prob says."""
    model = BlockDiffusionTransformer(replace(TOY, frames_per_block=1, train_frames=1))
    loss, metrics = diffusion_forcing_loss(model, torch.rand(4, 1, 16, 16, 3), torch.tensor([0, 1, 2, 3]), 1.0)
    assert metrics["noisy_frac"] == 1.0 and loss.item() > 0


def test_the_noise_shift_moves_training_levels_up_as_the_sampler_schedule_does() -> None:
    """Shift 3 puts the median level at 0.75 (shift 1: 0.5, uniform); levels stay in [0, 1], clean blocks at 0."""
    torch.manual_seed(0)
    frames = torch.zeros(4000, 4, 4, 4, 3)
    uniform = noise_blocks(frames, 2, 0.0).sigma
    shifted = noise_blocks(frames, 2, 0.3, noise_shift=3.0)
    assert uniform.median().item() == pytest.approx(0.5, abs=0.02)
    noisy = shifted.sigma[shifted.weight[:, ::2] > 0]
    assert noisy.median().item() == pytest.approx(0.75, abs=0.02) and noisy.min() >= 0 and noisy.max() <= 1
    assert (shifted.sigma[shifted.weight[:, ::2] == 0] == 0).all()


def test_lone_blocks_are_each_block_of_a_window_with_its_clips_class() -> None:
    frames = torch.arange(3 * 8).reshape(3, 8).float()[:, :, None, None, None]  # frame values tell their place
    blocks, classes = lone_blocks(frames, torch.tensor([5, 6, 7]), 2)
    assert blocks.shape == (12, 2, 1, 1, 1) and classes.tolist() == [5] * 4 + [6] * 4 + [7] * 4
    assert blocks[:, :, 0, 0, 0].tolist() == [[2 * i, 2 * i + 1] for i in range(12)]


def test_latents_are_only_reversed_in_time_never_flipped() -> None:
    torch.manual_seed(0)
    clips = torch.rand(64, 4, 16, 16, 3)
    out = augment(clips, flip=False)
    assert all(torch.equal(b, a) or torch.equal(b, a.flip(0)) for a, b in zip(clips, out))
    assert 16 < sum(not torch.equal(a, b) for a, b in zip(clips, out)) < 48


def test_windows_are_consecutive_frames_from_every_start() -> None:
    torch.manual_seed(0)
    clips = torch.arange(200 * 8).reshape(200, 8).float()[:, :, None]  # frame values tell their index
    windows = random_windows(clips, 3)
    assert windows.shape == (200, 3, 1)
    starts = windows[:, 0, 0] - clips[:, 0, 0]
    assert torch.equal(windows[:, :, 0] - clips[:, :1, 0], starts[:, None] + torch.arange(3))
    assert set(starts.long().tolist()) == set(range(6))  # starts 0 .. 8 - 3
    assert torch.equal(random_windows(clips, 8), clips)


TINY_KL = KLConfig(block_out_channels=(8, 8), norm_num_groups=4, image_size=16, latent_channels=2)
LATENT = BlockDiffConfig(frame_size=8, channels=2, patch_size=2, frames_per_block=2, train_frames=4, dim=32,
                         n_layer=1, n_head=2)


def test_a_latent_run_learns_the_tokenizers_latent_frames_and_the_video_run_starts_from_the_image_run(
        tmp_path) -> None:
    torch.manual_seed(0)
    kl_dir = save_pretrained(KLTokenizer(TINY_KL), tmp_path / "kl")
    clips, data = ClipsConfig(num_frames=4, frame_size=16, supersample=1, min_scale=0.35, max_scale=0.5), tmp_path / "d"
    train = TrainConfig(steps=4, lr=1e-3, warmup_steps=1, log_every=2, bf16=False)
    recipe = BlockDiffRecipe(num_clips=8, batch_size=4)
    image = train_blockdiff(tmp_path / "image", data, train, recipe, replace(LATENT, frames_per_block=1,
                                                                             train_frames=1), clips,
                            tokenizer_dir=kl_dir)
    latents = np.load(tmp_path / "image" / "train_clip_latents_8.npy")
    videos = np.load(data / "train_clips.npy")[:8]
    kl = from_pretrained(kl_dir).eval()
    assert latents.shape == (8, 4, 8, 8, 2) and latents.dtype == np.float16
    np.testing.assert_allclose(latents[3], kl.encode_frames(clips_to_tensor(videos[3])).numpy(), atol=2e-3)

    started = BlockDiffusionTransformer(LATENT)
    start_from(started, tmp_path / "image" / "export")
    assert all(torch.equal(a, b) for a, b in zip(started.state_dict().values(), image.state_dict().values()))
    video = train_blockdiff(tmp_path / "video", data, replace(train, steps=2),
                            replace(recipe, noise_shift=3.0, lone_block_share=0.5), LATENT, clips,
                            tokenizer_dir=kl_dir, init_from=tmp_path / "image" / "export")
    assert video.config == LATENT
    assert json.loads((latest_checkpoint(tmp_path / "video") / "state.json").read_text())["step"] == 2
    first = json.loads((tmp_path / "video" / "log.jsonl").read_text().splitlines()[0])
    assert first == {"step": 0, "init_from": str(tmp_path / "image" / "export")}
    logged = [json.loads(line) for line in (tmp_path / "video" / "log.jsonl").read_text().splitlines()[1:]]
    assert len(logged) == 1 and logged[0]["lone_blocks"] in (0.0, 0.5, 1.0)  # the share of 2 steps on lone blocks
    with pytest.raises(CheckpointError, match="does not match"):
        start_from(BlockDiffusionTransformer(replace(LATENT, dim=48, n_head=4)), tmp_path / "image" / "export")
    with pytest.raises(CheckpointError, match="not a block-diffusion model"):
        start_from(started, kl_dir)


def test_a_latent_model_must_fit_the_tokenizer_and_the_clips() -> None:
    kl, clips = KLTokenizer(TINY_KL), ClipsConfig(num_frames=4, frame_size=16)
    check_latent_fit(LATENT, kl, clips)
    with pytest.raises(ValueError, match="takes 16-px frames, the clips have 32 px"):
        check_latent_fit(LATENT, kl, ClipsConfig(num_frames=4, frame_size=32))
    with pytest.raises(ValueError, match=r"latent frames \(8 x 8 x 2\) are not the model's \(8 x 8 x 4\)"):
        check_latent_fit(replace(LATENT, channels=4), kl, clips)
    with pytest.raises(ValueError, match="takes a KL tokenizer, got a BlockDiffusionTransformer"):
        check_latent_fit(LATENT, BlockDiffusionTransformer(LATENT), clips)


@pytest.mark.slow
def test_a_tiny_run_lowers_the_loss_resumes_and_exports(tmp_path) -> None:
    run, data = tmp_path / "run", tmp_path / "data"
    clips = ClipsConfig(num_frames=4, frame_size=16, supersample=1, min_scale=0.35, max_scale=0.5)
    recipe = BlockDiffRecipe(num_clips=16, batch_size=8)
    train = TrainConfig(steps=120, lr=3e-3, warmup_steps=5, log_every=10, bf16=False)
    train_blockdiff(run, data, train, recipe, TOY, clips, max_minutes=None)
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if "loss" in line]
    assert log[-1]["loss"] < 0.8 * log[0]["loss"]
    model = from_pretrained(run / "export")
    assert isinstance(model, BlockDiffusionTransformer) and model.config == TOY
    longer = replace(train, steps=125, override_config=True)  # extended by 5 steps
    train_blockdiff(run, data, longer, recipe, TOY, clips)
    assert json.loads((latest_checkpoint(run) / "state.json").read_text())["step"] == 125
    with pytest.raises(ValueError, match="do not fit"):
        train_blockdiff(tmp_path / "r2", data, train, recipe, TOY, ClipsConfig(num_frames=4, frame_size=32))


def test_class_repeats_show_the_named_classes_that_many_times_more_often(tmp_path, monkeypatch) -> None:
    seen = []

    def recording_loss(model, frames, class_ids, *args):
        seen.append(class_ids.clone())
        return diffusion_forcing_loss(model, frames, class_ids, *args)

    monkeypatch.setattr(blockdiff_module, "diffusion_forcing_loss", recording_loss)
    clips = ClipsConfig(num_frames=4, frame_size=16, supersample=1, min_scale=0.35, max_scale=0.5)
    recipe = BlockDiffRecipe(num_clips=48, batch_size=8, class_repeats={"square": 4})
    train = TrainConfig(steps=30, lr=1e-3, warmup_steps=2, log_every=10, bf16=False)
    train_blockdiff(tmp_path / "run", tmp_path / "data", train, recipe, TOY, clips)
    labels = np.asarray(cached_clips(tmp_path / "data", "train", 48, clips)[1])
    square = CLASS_NAMES.index("square")
    expected = 4 * (labels == square).sum() / (len(labels) + 3 * (labels == square).sum())
    shown = float((torch.cat(seen) == square).float().mean())
    assert (labels == square).sum() > 0 and abs(shown - expected) < 0.05, (shown, expected)
    state = json.loads((latest_checkpoint(tmp_path / "run") / "state.json").read_text())
    assert state["recipe"]["class_repeats"] == {"square": 4}


def test_class_repeats_must_name_known_classes() -> None:
    with pytest.raises(ValueError, match="class_repeats names an unknown class 'hexagon'; classes: circle, square"):
        BlockDiffRecipe(class_repeats={"hexagon": 2})


def test_the_distillation_target_is_the_teachers_guided_velocity() -> None:
    torch.manual_seed(0)
    teacher = BlockDiffusionTransformer(TOY)
    with torch.no_grad():
        for p in teacher.parameters():
            p.normal_(std=0.1)  # past adaLN-Zero's zero output, so that the class changes the velocity
    frames, classes = torch.rand(3, 4, 16, 16, 3) * 2 - 1, torch.tensor([0, 1, 2])
    torch.manual_seed(1)
    at_one, _ = guidance_distillation_loss(teacher, teacher, frames, classes, clean_prob=0.0, cfg_scale=1.0)
    assert at_one.item() < 1e-10  # CFG 1 is the conditional velocity: the teacher is its own student
    torch.manual_seed(1)
    loss, _ = guidance_distillation_loss(teacher, teacher, frames, classes, clean_prob=0.0, cfg_scale=3.0)
    torch.manual_seed(1)
    clip = noise_blocks(frames, 2, 0.0)
    v_c = teacher(clip.x_t, clip.sigma, classes)
    v_u = teacher(clip.x_t, clip.sigma, torch.full_like(classes, TOY.num_classes))
    guided = guided_velocity(teacher, clip.x_t, clip.sigma, classes, 3.0)
    torch.testing.assert_close(guided, v_u + 3.0 * (v_c - v_u), rtol=1e-5, atol=1e-6)
    assert loss.item() == pytest.approx((v_c - guided).pow(2).mean().item(), rel=1e-5) and loss.item() > 1e-4


def test_a_distilled_student_matches_the_guided_teacher_without_guidance(tmp_path) -> None:
    """A student distilled from a tiny trained teacher at CFG 4: on fresh noised clips its conditional velocity is
    closer to the teacher's guided one than the teacher's own conditional velocity is; it has no class dropout."""
    clips = ClipsConfig(num_frames=4, frame_size=16, supersample=1, min_scale=0.35, max_scale=0.5)
    recipe = BlockDiffRecipe(num_clips=16, batch_size=8)
    train = dict(lr=3e-3, warmup_steps=5, log_every=10, bf16=False, ema_decay=0.9)
    teacher = train_blockdiff(tmp_path / "teacher", tmp_path / "data", TrainConfig(steps=60, **train), recipe, TOY,
                              clips)
    student = train_blockdiff(tmp_path / "student", tmp_path / "data", TrainConfig(steps=80, **train), recipe,
                              clips=clips, teacher=tmp_path / "teacher" / "export", teacher_cfg=4.0)
    assert student.config == replace(TOY, class_dropout_prob=0.0)
    first = json.loads((tmp_path / "student" / "log.jsonl").read_text().splitlines()[0])
    assert first == {"step": 0, "init_from": str(tmp_path / "teacher" / "export"), "teacher_cfg": 4.0}
    torch.manual_seed(5)
    frames = clips_to_tensor(cached_clips(tmp_path / "data", "train", 16, clips)[0])
    classes = torch.arange(len(frames)) % 8
    clip = noise_blocks(frames, 2, 0.3)
    with torch.no_grad():
        guided = guided_velocity(teacher, clip.x_t, clip.sigma, classes, 4.0)
        gap_teacher = (teacher(clip.x_t, clip.sigma, classes) - guided).pow(2).mean()
        gap_student = (student(clip.x_t, clip.sigma, classes) - guided).pow(2).mean()
    assert gap_student < 0.5 * gap_teacher, (gap_student.item(), gap_teacher.item())
    with pytest.raises(ValueError, match="teacher CFG scale > 1"):
        train_blockdiff(tmp_path / "s2", tmp_path / "data", TrainConfig(steps=1, **train), recipe, clips=clips,
                        teacher=tmp_path / "teacher" / "export", teacher_cfg=1.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_tiny_run_trains_on_cuda_and_exports(tmp_path) -> None:
    run = tmp_path / "run"
    clips = ClipsConfig(num_frames=4, frame_size=16, supersample=1, min_scale=0.35, max_scale=0.5)
    train = TrainConfig(steps=120, lr=3e-3, warmup_steps=5, log_every=10, bf16=True, device="cuda")
    train_blockdiff(run, tmp_path / "data", train, BlockDiffRecipe(num_clips=16, batch_size=8), TOY, clips)
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if "loss" in line]
    assert log[-1]["loss"] < 0.8 * log[0]["loss"]
    model = from_pretrained(run / "export")
    assert next(model.parameters()).device.type == "cpu" and model.config == TOY


def test_context_blocks_stay_clean_and_carry_no_loss() -> None:
    torch.manual_seed(0)
    frames = torch.rand(64, 6, 4, 4, 3)
    clip = noise_blocks(frames, 2, 0.0, context_blocks=2)
    assert (clip.sigma[:, :2] == 0).all() and (clip.sigma[:, 2] > 0).all()
    assert torch.equal(clip.x_t[:, :4], frames[:, :4]) and clip.weight.tolist() == [[0, 0, 0, 0, 1, 1]] * 64


ROLLOUT = replace(TOY, train_frames=6)  # a sink block, a window block and the new block


def test_rollouts_are_the_models_own_streams_with_the_context_its_cache_holds() -> None:
    """Each call advances the same streams by one block: the clip is the blocks the stream's cache holds (the
    first block as the sink, then the newest block) and the block just drawn, exactly as ``stream`` draws it;
    after the drawn length a new batch of streams starts; the model stays in training mode."""
    torch.manual_seed(0)
    model = BlockDiffusionTransformer(ROLLOUT)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=0.05)  # past adaLN-Zero's zero output: blocks depend on their context
    config = StreamConfig(steps=2, first_steps=3, sink_frames=2, window_frames=2)
    rollouts = Rollouts(model.train(), config, batch_size=3, max_blocks=6, pixels=True)
    torch.manual_seed(4)  # the streams' draws: their classes, a length of 6 blocks (evictions from block 3 on)
    classes, length = torch.randint(0, 8, (3,)), int(torch.randint(1, 7, ()))
    seed = int(torch.randint(2**62, ()))
    assert length == 6
    torch.manual_seed(4)
    got = [rollouts.next() for _ in range(length)]
    assert model.training and all(torch.equal(c, classes) for _, c in got)
    streamer = BlockStreamer(BlockDiffusionTransformer(ROLLOUT).eval(), config, pixels=True)
    streamer.model.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(seed)
    drawn = [b.latents for b in streamer.stream(classes.tolist(), 2 * length, generator=generator)]
    for k, (clip, _) in enumerate(got):
        context = drawn[:k] if k < 2 else [drawn[0], drawn[k - 1]]
        torch.testing.assert_close(clip, torch.cat([*context, drawn[k]], dim=1))
    fresh, _ = rollouts.next()
    assert fresh.shape[1] == 2  # a new batch of streams: a lone first block


def test_a_student_distils_on_its_own_streams_only_against_a_teacher(tmp_path) -> None:
    clips = ClipsConfig(num_frames=6, frame_size=16, supersample=1, min_scale=0.35, max_scale=0.5)
    save_pretrained(BlockDiffusionTransformer(ROLLOUT), tmp_path / "teacher")
    recipe = BlockDiffRecipe(num_clips=8, batch_size=4, rollout_share=1.0, rollout_blocks=3)
    train = TrainConfig(steps=6, lr=1e-3, warmup_steps=1, log_every=1, bf16=False)
    train_blockdiff(tmp_path / "student", tmp_path / "data", train, recipe, clips=clips,
                    teacher=tmp_path / "teacher", teacher_cfg=3.0)
    logged = [json.loads(line) for line in (tmp_path / "student" / "log.jsonl").read_text().splitlines()[1:]]
    assert [r["rollout"] for r in logged] == [1.0] * 6
    # one drawn block after 0, 1 or 2 context blocks: a third, half or all of the frames noisy
    assert {r["noisy_frac"] for r in logged} <= {1 / 3, 0.5, 1.0} and logged[0]["noisy_frac"] == 1.0
    with pytest.raises(ValueError, match="rollout_share trains a student on its own streams against a teacher"):
        train_blockdiff(tmp_path / "r2", tmp_path / "data", train, recipe, ROLLOUT, clips)
