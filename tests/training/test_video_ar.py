"""Next-token video AR training: the shapes-video-ar layout (1024 tokens, 16 frames, the NBP model's size), a loss
that falls over a few steps on tiny tokenised clips, and a resumable run that exports a LlamaGen GPT on the
tokenizer's (frames, rows, columns) grid, which packages into a video pipeline that the speculative samplers run."""

from __future__ import annotations

import json

import numpy as np
import torch

import vgen
from vgen.apps.cli import main
from vgen.data.clips import ClipsConfig
from vgen.hub import from_pretrained
from vgen.models.llamagen import GPTConfig, LlamaGenGPT
from vgen.pipelines import VideoPipeline
from vgen.tokenizers.vq import VQModel
from vgen.training.clip_codes import ClipRecipe
from vgen.training.nbp import SHAPES_VIDEO_NBP
from vgen.training.tokenizer import SHAPES_FRAME_VQ
from vgen.training.trainer import TrainConfig, latest_checkpoint
from vgen.training.video_ar import SHAPES_VIDEO_AR, train_video_ar, video_ar_config

TOY = GPTConfig(vocab_size=2, dim=32, n_layer=2, n_head=2, multiple_of=16, num_classes=8, block_size=4,
                class_dropout_prob=0.1, token_dropout_p=0.0, resid_dropout_p=0.0, ffn_dropout_p=0.0)
CLIPS = ClipsConfig(num_frames=4, frame_size=16, supersample=1)


def test_the_shapes_video_ar_is_the_nbp_model_size_over_1024_tokens_in_16_frames() -> None:
    config = video_ar_config(VQModel(SHAPES_FRAME_VQ), ClipsConfig(), SHAPES_VIDEO_AR)
    assert config == SHAPES_VIDEO_AR
    assert config.grid == (16, 8, 8) and config.block_size == 1024 and config.vocab_size == 1024
    assert (config.dim, config.n_layer, config.n_head) == (SHAPES_VIDEO_NBP.dim, SHAPES_VIDEO_NBP.n_layer,
                                                           SHAPES_VIDEO_NBP.n_head)


def test_a_few_steps_reduce_the_loss_and_the_run_resumes_exports_and_samples(tiny_vq_dir, tmp_path) -> None:
    run, data = tmp_path / "run", tmp_path / "data"
    train = dict(lr=3e-3, warmup_steps=5, log_every=5, bf16=False, ema_decay=0.9)
    recipe = ClipRecipe(num_clips=16, batch_size=8)
    train_video_ar(run, tiny_vq_dir, data, TrainConfig(steps=40, **train), recipe, TOY, CLIPS)
    logs = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in logs if "loss" in r]
    assert losses[0] > 2.5 and losses[-1] < losses[0] - 0.5, losses  # from about ln 32 = 3.47
    model = from_pretrained(run / "export")
    assert isinstance(model, LlamaGenGPT) and model.grid == (4, 4, 4) and model.vocab_size == 32
    train_video_ar(run, tiny_vq_dir, data, TrainConfig(steps=45, override_config=True, **train), recipe, TOY,
                   CLIPS)  # extended by 5 steps
    assert json.loads((latest_checkpoint(run) / "state.json").read_text())["step"] == 45

    pipe_dir = tmp_path / "pipe"
    assert main(["train", "package", "--gpt", str(run / "export"), "--vq", str(tiny_vq_dir), "--out", str(pipe_dir),
                 "--name", "toy-video-ar"]) == 0
    pipe = vgen.load(str(pipe_dir))
    assert isinstance(pipe, VideoPipeline) and pipe.num_frames == 4
    ar = pipe(class_ids=[1, 5], sampler="ar", seed=0, temperature=0.0)
    sjd = pipe(class_ids=[1, 5], sampler="mcsjd", seed=0, temperature=0.0)
    assert ar.videos.shape == (2, 4, 16, 16, 3) and ar.videos.dtype == np.uint8
    assert torch.equal(sjd.tokens, ar.tokens)  # greedy: the lossless sampler gives vanilla AR's clips
    assert sjd.stats.forward_passes < ar.stats.forward_passes == 64


def test_the_cli_refuses_a_warm_start_for_a_video_run(tmp_path, capsys) -> None:
    assert main(["train", "ar", "--video", "--init-from", str(tmp_path), "--run-dir", str(tmp_path / "run")]) == 2
    assert "--init-from is for image AR runs" in capsys.readouterr().err
