"""NBP training: ln V on a fresh model, a loss that falls over a few steps on tiny tokenised clips, a resumable run
that exports a loadable model on the tokenizer's grid, and the shapes-video-nbp size (1024 tokens, 128 rows)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vgen.data.clips import ClipsConfig
from vgen.hub import CheckpointError, from_pretrained, save_pretrained
from vgen.models.llamagen import GPTConfig, LlamaGenGPT
from vgen.models.nbp import NBPConfig, NBPTransformer
from vgen.tokenizers.vq import VQModel
from vgen.training.clip_codes import (
    ClipRecipe,
    cached_clip_codes,
    clip_probe,
    video_config,
    with_first_frames,
    with_time_reversed,
)
from vgen.training.nbp import SHAPES_VIDEO_NBP, train_nbp, warm_start
from vgen.training.tokenizer import SHAPES_FRAME_VQ
from vgen.training.trainer import TrainConfig, latest_checkpoint, token_grid_loss

TOY = dict(dim=32, n_layer=2, n_head=2, multiple_of=16, num_classes=8, class_dropout_prob=0.1, token_dropout_p=0.0,
           resid_dropout_p=0.0, ffn_dropout_p=0.0)
CLIPS = ClipsConfig(num_frames=4, frame_size=16, supersample=1)


def test_a_fresh_model_scores_ln_v() -> None:
    torch.manual_seed(0)
    model = NBPTransformer(NBPConfig(grid=(3, 2, 2), block="frame", vocab_size=16, **TOY))
    tokens = torch.randint(0, 16, (4, 12))
    loss, _ = token_grid_loss(model, torch.tensor([0, 1, 2, 3]), tokens)
    assert loss.item() == pytest.approx(math.log(16), abs=1e-6)


def test_the_shapes_video_layout_is_1024_tokens_in_128_row_blocks_with_a_hybrid_start() -> None:
    tokenizer = VQModel(SHAPES_FRAME_VQ)
    config = video_config(tokenizer, ClipsConfig(), SHAPES_VIDEO_NBP)
    assert config.grid == (16, 8, 8) and config.num_tokens == 1024 and config.block == "row"
    assert config.block_size == 8 and config.num_blocks == 16 * 8  # NBP's own layout: one latent row a step
    assert config.hybrid and config.num_steps == 8 + 127  # row 0 token by token, then 127 rows
    assert SHAPES_FRAME_VQ.downsample_factor == 4 and config.vocab_size == SHAPES_FRAME_VQ.codebook_size
    with pytest.raises(ValueError, match="frame size 18 is not a multiple of the tokenizer's downsample factor 4"):
        video_config(tokenizer, ClipsConfig(frame_size=18), SHAPES_VIDEO_NBP)


def test_a_few_steps_reduce_the_loss_and_the_run_resumes_and_exports(tiny_vq_dir, tmp_path) -> None:
    run, data = tmp_path / "run", tmp_path / "data"
    cfg = NBPConfig(grid=(2, 2, 2), block="frame", vocab_size=2, **TOY)  # grid and vocabulary follow the tokenizer
    train = dict(lr=3e-3, warmup_steps=5, log_every=5, bf16=False, ema_decay=0.9)
    train_nbp(run, tiny_vq_dir, data, TrainConfig(steps=40, **train), ClipRecipe(num_clips=16, batch_size=8), cfg,
              CLIPS)
    logs = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in logs if "loss" in r]
    assert losses[0] > 2.5 and losses[-1] < losses[0] - 0.5, losses  # from about ln 32 = 3.47
    model = from_pretrained(run / "export")
    assert isinstance(model, NBPTransformer) and model.grid == (4, 4, 4) and model.vocab_size == 32
    train_nbp(run, tiny_vq_dir, data, TrainConfig(steps=45, override_config=True, **train),  # extended by 5 steps
              ClipRecipe(num_clips=16, batch_size=8), cfg, CLIPS)
    assert json.loads((latest_checkpoint(run) / "state.json").read_text())["step"] == 45
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == list(range(5, 50, 5))  # resumed at 40, not restarted
    assert {"step": 40, "settings_changed": ["steps 40 -> 45"]} in records


def test_once_the_codes_are_cached_a_run_needs_no_clips(tiny_vq_dir, tmp_path) -> None:
    """A run folder (or a copy of its codes on another machine) trains without the rendered clips."""
    codes = np.arange(16 * 64, dtype=np.int16).reshape(16, 64) % 32
    np.save(tmp_path / "train_clip_codes_16.npy", codes)
    got, labels = cached_clip_codes(tiny_vq_dir, tmp_path / "no-clips", 16, tmp_path, CLIPS)
    assert np.array_equal(got, codes) and labels.tolist() == [c % 8 for c in range(16)]
    assert not (tmp_path / "no-clips").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_run_trains_on_cuda_with_its_probe_and_exports(tiny_vq_dir, tmp_path) -> None:
    run = tmp_path / "run"
    cfg = NBPConfig(grid=(2, 2, 2), block="frame", vocab_size=2, **TOY)
    train = TrainConfig(steps=40, lr=3e-3, warmup_steps=5, log_every=5, bf16=True, ema_decay=0.9, device="cuda")
    train_nbp(run, tiny_vq_dir, tmp_path / "data", train, ClipRecipe(num_clips=16, batch_size=8, eval_every=20),
              cfg, CLIPS, evaluate=clip_probe(tiny_vq_dir, CLIPS, per_class=1))
    logs = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in logs if "loss" in r]
    assert losses[-1] < losses[0] - 0.5, losses
    assert sum("probe_class_accuracy" in r for r in logs) == 2
    model = from_pretrained(run / "export")
    assert next(model.parameters()).device.type == "cpu" and model.grid == (4, 4, 4)


def test_time_reversal_appends_every_clip_with_its_frames_in_reverse_order() -> None:
    codes = np.arange(2 * 3 * 4).reshape(2, 12)  # 2 clips of 3 frames of 4 codes
    out, labels = with_time_reversed(codes, np.array([5, 7]), num_frames=3)
    assert np.array_equal(out[:2], codes) and labels.tolist() == [5, 7, 5, 7]
    assert out[2].tolist() == [8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3]  # frames 2, 1, 0; each frame's codes in order
    assert np.array_equal(out[3].reshape(3, 4), codes[1].reshape(3, 4)[::-1])
    with pytest.raises(ValueError, match="12 codes per clip do not split into 5 frames"):
        with_time_reversed(codes, np.array([5, 7]), num_frames=5)


@pytest.mark.parametrize("block, hybrid", [("frame", True), ("row", True), ("frame", False)])
def test_the_first_frame_term_scores_frame_0_alone_on_other_frames_of_the_same_clip(block, hybrid) -> None:
    """Clips whose frames all equal their frame 0: whichever frames are drawn, the extra term is the cross-entropy
    of the full forward's frame 0, with each clip's own class, in every layout."""
    torch.manual_seed(0)
    model = NBPTransformer(NBPConfig(grid=(4, 2, 2), block=block, hybrid=hybrid, vocab_size=16, **TOY)).eval()
    with torch.no_grad():
        model.output.weight.normal_(std=0.5)  # zero-initialised, it would score ln V everywhere
    frame0 = torch.randint(0, 16, (3, 4))
    tokens, cls = frame0.repeat(1, 4), torch.tensor([0, 5, 7])
    loss, figures = with_first_frames(5)(model, cls, tokens)
    clip_loss, _ = token_grid_loss(model, cls, tokens)
    first = F.cross_entropy(model(cls, tokens)[:, :4].reshape(-1, 16), frame0.reshape(-1))
    assert figures["first_loss"] == pytest.approx(first.item(), abs=1e-5)
    assert loss.item() == pytest.approx(clip_loss.item() + first.item(), abs=1e-5)


def test_without_first_frames_or_frames_the_loss_is_nbps() -> None:
    torch.manual_seed(0)
    for grid, count in (((4, 2, 2), 0), ((4, 4), 8)):
        model = NBPTransformer(NBPConfig(grid=grid, block="row", hybrid=True, vocab_size=16, **TOY)).eval()
        tokens, cls = torch.randint(0, 16, (2, model.num_tokens)), torch.tensor([1, 2])
        loss, figures = with_first_frames(count)(model, cls, tokens)
        assert loss.item() == token_grid_loss(model, cls, tokens)[0].item() and "first_loss" not in figures
    with pytest.raises(ValueError, match="first_frames must be >= 0, got -1"):
        with_first_frames(-1)


def test_the_clip_probe_reports_class_accuracy_of_clips_frames_and_frame_0_and_keeps_the_training_mode(
        tiny_vq_dir) -> None:
    torch.manual_seed(0)
    model = NBPTransformer(NBPConfig(grid=(4, 4, 4), block="frame", hybrid=True, vocab_size=32, **TOY)).train()
    figures = clip_probe(tiny_vq_dir, CLIPS, per_class=1)(model)
    assert set(figures) == {"probe_class_accuracy", "probe_frame_accuracy", "probe_first_frame_accuracy"}
    assert all(0 <= v <= 1 for v in figures.values()) and model.training
    # 8 clips of 4 frames: every figure is a count of eighths (frames: of 32nds)
    assert figures["probe_class_accuracy"] * 8 == round(figures["probe_class_accuracy"] * 8)
    assert figures["probe_first_frame_accuracy"] * 8 == round(figures["probe_first_frame_accuracy"] * 8)


def test_a_new_run_starts_from_a_frame_block_export_in_row_blocks(tiny_vq_dir, tmp_path) -> None:
    """Warm start across block kinds: every weight carries over, and the begin-of-video rows the row model has (W
    of the frame model's H x W); a model of another kind is refused."""
    data, train = tmp_path / "data", dict(lr=3e-3, warmup_steps=1, log_every=1, bf16=False, ema_decay=0.0)
    frame_cfg = NBPConfig(grid=(2, 2, 2), block="frame", hybrid=True, vocab_size=2, **TOY)
    source = train_nbp(tmp_path / "frames", tiny_vq_dir, data, TrainConfig(steps=2, **train),
                       ClipRecipe(num_clips=8, batch_size=4), frame_cfg, CLIPS, first_frames=0)
    row_cfg = NBPConfig(grid=(2, 2, 2), block="row", hybrid=True, vocab_size=2, **TOY)
    exported = from_pretrained(tmp_path / "frames" / "export").state_dict()
    fresh = train_nbp(tmp_path / "rows", tiny_vq_dir, data, TrainConfig(steps=0, **train),
                      ClipRecipe(num_clips=8, batch_size=4), row_cfg, CLIPS, first_frames=0,
                      init_from=tmp_path / "frames" / "export")
    state = fresh.state_dict()
    assert source.block_size == 16 and fresh.block_size == 4
    assert torch.equal(state["bov"], exported["bov"][:4])
    assert all(torch.equal(state[k], v) for k, v in exported.items() if k != "bov")
    with pytest.raises(CheckpointError, match="holds a VQModel, not an NBP model or a next-token image model"):
        train_nbp(tmp_path / "other", tiny_vq_dir, data, TrainConfig(steps=0, **train),
                  ClipRecipe(num_clips=8, batch_size=4), row_cfg, CLIPS, init_from=tiny_vq_dir)


def test_a_new_run_starts_from_a_next_token_image_model_of_the_frame_grid(tiny_vq_dir, tmp_path) -> None:
    """Warm start from LlamaGen's GPT over one frame's 4 x 4 grid (rope="spatial", hybrid frame blocks): its blocks,
    embeddings, final norm and output layer carry over by name; the begin-of-video slots and the per-frame
    embedding (zero) keep their initialisation. A GPT of another vocabulary, or a video GPT, is refused."""
    data, train = tmp_path / "data", dict(lr=3e-3, warmup_steps=1, log_every=1, bf16=False, ema_decay=0.0)
    gpt_config = {k: v for k, v in TOY.items() if k in {f.name for f in dataclasses.fields(GPTConfig)}}
    torch.manual_seed(0)
    gpt = LlamaGenGPT(GPTConfig(vocab_size=32, block_size=16, **gpt_config))
    save_pretrained(gpt, tmp_path / "gpt")
    config = NBPConfig(grid=(2, 2, 2), block="frame", hybrid=True, rope="spatial", vocab_size=2, **TOY)
    model = train_nbp(tmp_path / "video", tiny_vq_dir, data, TrainConfig(steps=0, **train),
                      ClipRecipe(num_clips=8, batch_size=4), config, CLIPS, first_frames=0,
                      init_from=tmp_path / "gpt")
    state = model.state_dict()
    assert model.grid == (4, 4, 4) and not state["frame_embedding.weight"].any()
    assert all(torch.equal(state[k], v) for k, v in gpt.state_dict().items())
    assert set(state) - set(gpt.state_dict()) == {"bov", "frame_embedding.weight"}
    save_pretrained(LlamaGenGPT(GPTConfig(vocab_size=64, block_size=16, **gpt_config)), tmp_path / "gpt64")
    with pytest.raises(CheckpointError, match="tok_embeddings.weight"):
        train_nbp(tmp_path / "other", tiny_vq_dir, data, TrainConfig(steps=0, **train),
                  ClipRecipe(num_clips=8, batch_size=4), config, CLIPS, init_from=tmp_path / "gpt64")
    save_pretrained(LlamaGenGPT(GPTConfig(vocab_size=32, block_size=64, frames=4, **gpt_config)),
                    tmp_path / "video-gpt")
    with pytest.raises(CheckpointError, match="not an NBP model or a next-token image model"):
        train_nbp(tmp_path / "other2", tiny_vq_dir, data, TrainConfig(steps=0, **train),
                  ClipRecipe(num_clips=8, batch_size=4), config, CLIPS, init_from=tmp_path / "video-gpt")


@torch.no_grad()
def test_a_model_of_fewer_frames_starts_a_longer_one_that_computes_its_frames_as_it_does() -> None:
    """An NBP model trained on 2 frames starts a 4-frame one (an 8-frame model a 16-frame one): every weight by name,
    the later frames' embeddings the source's last frame's. Over the source's frames the longer model's logits are
    the source's; a source of more frames than the model is refused."""
    torch.manual_seed(0)
    spatial = dict(block="row", hybrid=True, hybrid_blocks=2, rope="spatial", vocab_size=32, **TOY)
    short = NBPTransformer(NBPConfig(grid=(2, 2, 2), **spatial)).eval()
    torch.nn.init.normal_(short.frame_embedding.weight)
    torch.nn.init.normal_(short.output.weight, std=0.02)
    long = NBPTransformer(NBPConfig(grid=(4, 2, 2), **spatial)).eval()
    warm_start(long, short.state_dict(), source="2-frame NBP")
    learnt = short.frame_embedding.weight
    torch.testing.assert_close(long.frame_embedding.weight, torch.cat([learnt, learnt[-1:], learnt[-1:]]))
    classes, tokens = torch.tensor([1, 5]), torch.randint(0, 32, (2, 16))
    torch.testing.assert_close(long(classes, tokens)[:, :8], short(classes, tokens[:, :8]))
    with pytest.raises(CheckpointError, match="trained on 4 frames; it can start a model of as many frames or more"):
        warm_start(short, long.state_dict(), source="4-frame NBP")
