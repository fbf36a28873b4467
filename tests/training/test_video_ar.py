"""Next-token video AR training: the shapes-video-ar layout (1024 tokens, 16 frames, the NBP model's size), a loss
that falls over a few steps on tiny tokenised clips, and a resumable run that exports a LlamaGen GPT on the
tokenizer's (frames, rows, columns) grid, which packages into a video pipeline that the speculative samplers run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import vgen
from vgen.apps.cli import main
from vgen.data.clips import SHAPES_CLIPS_64, ClipsConfig
from vgen.hub import CheckpointError, from_pretrained, save_pretrained
from vgen.models.llamagen import GPTConfig, LlamaGenGPT
from vgen.models.nbp import NBPConfig, NBPTransformer
from vgen.pipelines import VideoPipeline
from vgen.tokenizers.vq import VQModel
from vgen.training.ar import SHAPES_GPT
from vgen.training.clip_codes import ClipRecipe
from vgen.training.nbp import SHAPES_VIDEO_NBP
from vgen.training.tokenizer import SHAPES_FRAME_VQ, SHAPES_VQ
from vgen.training.trainer import TrainConfig, latest_checkpoint
from vgen.training.video_ar import SHAPES_VIDEO_AR, train_video_ar, video_ar_config, warm_start

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


def test_the_64px_recipe_rotates_each_frame_as_the_image_model_and_drops_nothing() -> None:
    config = video_ar_config(VQModel(SHAPES_VQ), SHAPES_CLIPS_64)
    assert config.grid == (8, 16, 16) and config.block_size == 2048 and config.rope == "spatial"
    assert config.vocab_size == SHAPES_GPT.vocab_size and (config.dim, config.n_layer) == (256, 8)
    assert config.token_dropout_p == config.resid_dropout_p == config.ffn_dropout_p == 0.0


SPATIAL = dict(vocab_size=32, dim=32, n_layer=2, n_head=2, multiple_of=16, num_classes=8, token_dropout_p=0.0,
               resid_dropout_p=0.0, ffn_dropout_p=0.0)


@torch.no_grad()
def test_an_image_model_starts_a_spatial_clip_model_that_draws_frame_0_as_it_draws_images(tiny_gpt_factory) -> None:
    image = tiny_gpt_factory(GPTConfig(block_size=16, **SPATIAL))
    clip = LlamaGenGPT(GPTConfig(block_size=64, frames=4, rope="spatial", **SPATIAL)).eval()
    warm_start(clip, image)
    assert not clip.frame_embedding.weight.any()
    classes, tokens = torch.tensor([1, 6]), torch.randint(0, 32, (2, 40))
    torch.testing.assert_close(clip(classes, tokens[:, :15]), image(classes, tokens[:, :15]))
    # a grid-rotated clip model would see other geometry: refused
    with pytest.raises(CheckpointError, match="rope='spatial'"):
        warm_start(LlamaGenGPT(GPTConfig(block_size=64, frames=4, **SPATIAL)), image)


def test_an_nbp_model_starts_a_clip_model_on_its_grid_without_its_begin_of_video_slots() -> None:
    nbp_config = {k: v for k, v in SPATIAL.items() if k != "vocab_size"}
    nbp = NBPTransformer(NBPConfig(grid=(4, 4, 4), block="row", hybrid=True, hybrid_blocks=4, rope="spatial",
                                   vocab_size=32, **nbp_config))
    torch.nn.init.normal_(nbp.frame_embedding.weight)
    clip = LlamaGenGPT(GPTConfig(block_size=64, frames=4, rope="spatial", **SPATIAL))
    warm_start(clip, nbp)
    state = clip.state_dict()
    assert set(nbp.state_dict()) - set(state) == {"bov"}
    assert all(torch.equal(state[k], v) for k, v in nbp.state_dict().items() if k != "bov")
    with pytest.raises(CheckpointError, match="grid \\(4, 4, 4\\) with rope='spatial'"):
        warm_start(LlamaGenGPT(GPTConfig(block_size=64, frames=4, **SPATIAL)), nbp)
    with pytest.raises(CheckpointError, match="holds a VQModel"):
        warm_start(clip, VQModel(SHAPES_VQ))


def test_a_new_run_starts_from_init_from(tiny_vq_dir, tiny_gpt_factory, tmp_path, capsys) -> None:
    image = tiny_gpt_factory(GPTConfig(block_size=16, **SPATIAL))
    save_pretrained(image, tmp_path / "image")
    config = GPTConfig(block_size=64, frames=4, rope="spatial", **SPATIAL)
    train = dict(lr=3e-3, warmup_steps=1, log_every=1, bf16=False, ema_decay=0.0)
    model = train_video_ar(tmp_path / "run", tiny_vq_dir, tmp_path / "data", TrainConfig(steps=0, **train),
                           ClipRecipe(num_clips=8, batch_size=4), config, CLIPS, init_from=tmp_path / "image")
    assert model.grid == (4, 4, 4)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in image.state_dict().items())
    assert main(["train", "ar", "--video", "--init-from", str(tmp_path / "missing"), "--run-dir",
                 str(tmp_path / "run2"), "--tokenizer", str(tiny_vq_dir), "--data-dir", str(tmp_path / "data")]) == 2
    assert "no config.json in" in capsys.readouterr().err
