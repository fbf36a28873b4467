"""The training recipes end to end at toy scale: they train, restart dead codes, export loadable models."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from vgen.data.clips import ClipsConfig
from vgen.hub import CheckpointError, from_pretrained
from vgen.models.llamagen import GPTConfig
from vgen.tokenizers.vq import ENCODER_KINDS, VQConfig
from vgen.training.ar import ARRecipe, cached_codes, train_ar
from vgen.training.tokenizer import TokenizerRecipe, train_frame_tokenizer, train_tokenizer
from vgen.training.trainer import TrainConfig

TOY_VQ = VQConfig(codebook_size=64, ch=8, ch_mult=(1, 2, 2), num_res_blocks=1, z_channels=8, norm_groups=4)


def test_tokenizer_recipe_restarts_dead_codes_and_exports(tmp_path):
    cfg = TrainConfig(steps=4, lr=1e-3, warmup_steps=1, bf16=False, log_every=2)
    model = train_tokenizer(tmp_path / "vq", tmp_path / "data", cfg, TokenizerRecipe(num_images=32, batch_size=8,
                                                                                      restart_every=2), TOY_VQ)
    log = [json.loads(line) for line in (tmp_path / "vq" / "log.jsonl").read_text().splitlines()]
    restarts = [r for r in log if "restarted" in r]
    assert [r["step"] for r in restarts] == [2, 4]
    # 8 images x 16 tokens per step cannot use all 64 codes, so codes were dead and got restarted
    assert restarts[0]["restarted"] > 0 and restarts[0]["codebook_usage_window"] < 1.0
    exported = from_pretrained(tmp_path / "vq" / "export")
    for a, b in zip(model.state_dict().values(), exported.state_dict().values()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("encoder", ENCODER_KINDS)
def test_frame_tokenizer_trains_on_every_frame_of_the_clips(tmp_path, encoder):
    clips = ClipsConfig(num_frames=4, frame_size=16)
    cfg = TrainConfig(steps=2, lr=1e-3, warmup_steps=1, bf16=False)
    model = train_frame_tokenizer(tmp_path / "vq", tmp_path / "clips", cfg, TokenizerRecipe(num_images=3, batch_size=4),
                                  replace(TOY_VQ, encoder=encoder), clips)
    assert np.load(tmp_path / "clips" / "train_clips.npy").shape == (3, 4, 16, 16, 3)  # 12 frames to draw from
    frames = torch.zeros(2, 3, 16, 16)
    _, codes, _ = model.encode(frames)
    assert codes.shape == (2, 4, 4)  # downsample 4: a 16-px frame is 4 x 4 codes
    exported = from_pretrained(tmp_path / "vq" / "export")
    assert isinstance(exported, type(model)) and exported.config.encoder == encoder


def test_ar_recipe_caches_codes_and_exports_the_ema_model(tmp_path):
    vq_cfg = TrainConfig(steps=1, warmup_steps=1, bf16=False)
    train_tokenizer(tmp_path / "vq", tmp_path / "data", vq_cfg, TokenizerRecipe(num_images=16, batch_size=8), TOY_VQ)
    gpt = GPTConfig(vocab_size=64, dim=32, n_layer=1, n_head=2, num_classes=8, block_size=256)
    ar_cfg = TrainConfig(steps=3, warmup_steps=1, bf16=False, ema_decay=0.5)
    model = train_ar(tmp_path / "ar", tmp_path / "vq" / "export", tmp_path / "data", ar_cfg,
                     ARRecipe(num_images=16, batch_size=4), gpt)
    codes, labels = cached_codes(tmp_path / "vq" / "export", tmp_path / "data", "train", 16, tmp_path / "ar")
    assert codes.shape == (16, 256) and codes.dtype == np.int16 and codes.min() >= 0 and codes.max() < 64
    assert labels.tolist() == [i % 8 for i in range(16)]
    # a longer cache extends the shorter one: its first 16 rows are the cached codes
    more, _ = cached_codes(tmp_path / "vq" / "export", tmp_path / "data", "train", 24, tmp_path / "ar")
    assert more.shape == (24, 256) and np.array_equal(more[:16], codes)
    exported = from_pretrained(tmp_path / "ar" / "export")
    for a, b in zip(model.state_dict().values(), exported.state_dict().values()):
        assert torch.equal(a, b)

    # fine-tuning: a new run started from the export begins at its weights (zero steps leave them as they are)
    tuned = train_ar(tmp_path / "tuned", tmp_path / "vq" / "export", tmp_path / "data",
                     TrainConfig(steps=0, warmup_steps=1, bf16=False), ARRecipe(num_images=16, batch_size=4), gpt,
                     init_from=tmp_path / "ar" / "export")
    for a, b in zip(exported.state_dict().values(), tuned.state_dict().values()):
        assert torch.equal(a, b)
    with pytest.raises(CheckpointError, match="does not match"):
        train_ar(tmp_path / "wrong", tmp_path / "vq" / "export", tmp_path / "data", TrainConfig(steps=0),
                 ARRecipe(num_images=16, batch_size=4), GPTConfig(vocab_size=64, dim=16, n_layer=1, n_head=2,
                                                                  num_classes=8, block_size=256),
                 init_from=tmp_path / "ar" / "export")


def test_drafter_recipe_trains_a_head_for_the_ar_model_and_exports_it(tmp_path):
    from vgen.models.draft_head import DraftHead
    from vgen.training.drafter import DrafterRecipe, train_drafter

    vq_cfg = TrainConfig(steps=1, warmup_steps=1, bf16=False)
    train_tokenizer(tmp_path / "vq", tmp_path / "data", vq_cfg, TokenizerRecipe(num_images=16, batch_size=8), TOY_VQ)
    gpt = GPTConfig(vocab_size=64, dim=32, n_layer=1, n_head=2, num_classes=8, block_size=256)
    train_ar(tmp_path / "ar", tmp_path / "vq" / "export", tmp_path / "data", TrainConfig(steps=1, warmup_steps=1,
             bf16=False), ARRecipe(num_images=16, batch_size=4), gpt)
    head_cfg = TrainConfig(steps=2, warmup_steps=1, bf16=False, log_every=1)
    head = train_drafter(tmp_path / "head", tmp_path / "ar" / "export", tmp_path / "vq" / "export",
                         tmp_path / "data", tmp_path / "ar", head_cfg, DrafterRecipe(num_images=16, batch_size=4))
    assert not (tmp_path / "head" / "train_codes_16.npy").exists()  # it reused the AR run's tokenised split
    exported = from_pretrained(tmp_path / "head" / "export")
    assert isinstance(exported, DraftHead)
    for a, b in zip(head.state_dict().values(), exported.state_dict().values()):
        assert torch.equal(a, b)
    exported.check_target(from_pretrained(tmp_path / "ar" / "export"))
    log = [json.loads(line) for line in (tmp_path / "head" / "log.jsonl").read_text().splitlines()]
    assert {"ce", "feat", "agree"} <= set(log[-1])

    # a new run started from that head (for a fine-tuned target) begins at its weights
    again = train_drafter(tmp_path / "again", tmp_path / "ar" / "export", tmp_path / "vq" / "export",
                          tmp_path / "data", tmp_path / "ar", replace(head_cfg, steps=0),
                          DrafterRecipe(num_images=16, batch_size=4), init_from=tmp_path / "head" / "export")
    for a, b in zip(exported.state_dict().values(), again.state_dict().values()):
        assert torch.equal(a, b)


def test_kl_and_mar_recipes_train_export_and_package_into_a_continuous_pipeline(tmp_path):
    from vgen.models.mar import MARConfig
    from vgen.pipelines import ImagePipeline, PipelineInfo, load
    from vgen.tokenizers.kl import KLConfig
    from vgen.training.kl import KLRecipe, train_kl
    from vgen.training.mar import MARRecipe, cached_latents, train_mar

    kl_cfg = KLConfig(block_out_channels=(8, 8, 8), norm_num_groups=4, latent_channels=2)
    kl = train_kl(tmp_path / "kl", tmp_path / "data", TrainConfig(steps=2, warmup_steps=1, bf16=False),
                  KLRecipe(num_images=16, batch_size=8, scale_images=16), kl_cfg)
    # the exported scale makes the tokens of the training images unit-variance
    tokens, labels = cached_latents(tmp_path / "kl" / "export", tmp_path / "data", "train", 16, tmp_path / "mar")
    assert tokens.shape == (16, 256, 2) and tokens.dtype == np.float16
    assert float(np.std(tokens.astype(np.float32))) == pytest.approx(1.0, abs=0.02)
    assert kl.config.latent_scale != 1.0
    small = dict(token_channels=2, grid_size=16, dim=16, n_layer=1, n_head=2, num_classes=8, head_width=16,
                 head_depth=1, num_sampling_steps=4, multiple_of=16)
    target = train_mar(tmp_path / "mar", tmp_path / "kl" / "export", tmp_path / "data",
                       TrainConfig(steps=2, warmup_steps=1, bf16=False), MARRecipe(num_images=16, batch_size=4),
                       MARConfig(**small))
    draft = from_pretrained(tmp_path / "mar" / "export")
    for a, b in zip(target.state_dict().values(), draft.state_dict().values()):
        assert torch.equal(a, b)  # the export is the EMA model the recipe returns
    pipe = ImagePipeline(target, from_pretrained(tmp_path / "kl" / "export"), PipelineInfo("toy", 64), draft)
    pipe.save_pretrained(tmp_path / "pipe")
    loaded = load(tmp_path / "pipe")
    out = loaded([1, 2], sampler="cspd", seed=0)
    assert len(out.images) == 2 and out.images[0].size == (64, 64) and out.tokens.shape == (2, 256, 2)
    with pytest.raises(ValueError, match="tokens"):
        train_mar(tmp_path / "bad", tmp_path / "kl" / "export", tmp_path / "data", TrainConfig(steps=0),
                  MARRecipe(num_images=16, batch_size=4), MARConfig(**{**small, "token_channels": 3}))
