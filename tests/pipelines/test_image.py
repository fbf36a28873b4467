"""The image pipeline: images decoded from the sampled tokens, seeded determinism, the stored defaults, and
specific errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from vgen.models.llamagen import GPTConfig, LlamaGenGPT
from vgen.pipelines import ImagePipeline, PipelineInfo, load
from vgen.samplers import ARSampler, SamplingParams
from vgen.tokenizers.vq import VQConfig, VQModel

TINY_VQ = VQConfig(codebook_size=32, ch=8, ch_mult=(1, 2, 2), num_res_blocks=1, z_channels=8, norm_groups=4)


def tiny_pipeline(num_classes: int = 3, block_size: int = 16) -> ImagePipeline:
    torch.manual_seed(0)
    gpt = LlamaGenGPT(GPTConfig(vocab_size=32, dim=32, n_layer=1, n_head=2, num_classes=num_classes,
                                block_size=block_size))
    with torch.no_grad():
        gpt.output.weight.normal_(std=0.5)
    info = PipelineInfo(name="tiny", image_size=16, class_names=["a", "b", "c"], defaults={"cfg_scale": 3.0})
    return ImagePipeline(gpt, VQModel(TINY_VQ), info)


def test_call_returns_pil_images_tokens_and_stats():
    out = tiny_pipeline()(class_ids=[1, 2], seed=0)
    assert [im.size for im in out.images] == [(16, 16), (16, 16)]
    assert out.tokens.shape == (2, 16) and out.class_ids == [1, 2]
    assert out.stats.sampler == "ar" and out.stats.forward_passes == 16 and out.stats.tokens == 32


def test_images_are_the_tokenizer_decoding_of_the_tokens():
    pipe = tiny_pipeline()
    out = pipe(class_ids=[0], seed=1)
    pixels = pipe.tokenizer.decode_code(out.tokens, (4, 4))
    expected = (pixels * 127.5 + 128).clamp(0, 255).to(torch.uint8)[0].permute(1, 2, 0)
    assert torch.equal(torch.from_numpy(np.array(out.images[0])), expected)


def test_pipeline_equals_the_sampler_with_the_stored_defaults():
    pipe = tiny_pipeline()
    out = pipe(class_ids=[0, 2], seed=7)
    ref = ARSampler().sample(pipe.model, torch.tensor([0, 2]), SamplingParams(cfg_scale=3.0),
                             generator=torch.Generator().manual_seed(7))
    assert torch.equal(out.tokens, ref.tokens)
    assert not torch.equal(pipe(class_ids=[0, 2], seed=7, cfg_scale=1.0).tokens, ref.tokens)


def test_same_seed_same_images_and_num_images_cycles_classes():
    pipe = tiny_pipeline()
    a, b = pipe([0, 1], seed=3, num_images=5), pipe([0, 1], seed=3, num_images=5)
    assert a.class_ids == [0, 1, 0, 1, 0]
    assert torch.equal(a.tokens, b.tokens)
    assert pipe(None, seed=0).class_ids == [0, 1, 2]  # default: every class once


def test_save_pretrained_writes_the_weights_in_the_dtype_asked_for(tmp_path):
    pipe = tiny_pipeline()
    pipe.save_pretrained(tmp_path / "p", dtype=torch.bfloat16)
    for part in ("gpt", "vq"):
        stored = load_file(tmp_path / "p" / part / "model.safetensors")
        assert {t.dtype for t in stored.values() if t.is_floating_point()} == {torch.bfloat16}
    loaded = load(tmp_path / "p")
    assert next(loaded.model.parameters()).dtype == torch.float32  # the weights load into fp32 models
    expected = {k: v.to(torch.bfloat16).float() for k, v in pipe.model.state_dict().items()}
    assert all(torch.equal(v, expected[k]) for k, v in loaded.model.state_dict().items() if v.is_floating_point())


def test_errors_are_specific():
    pipe = tiny_pipeline()
    with pytest.raises(ValueError, match="class id 3 is out of range for tiny with 3 classes"):
        pipe([3])
    with pytest.raises(ValueError, match="class_ids is empty"):
        pipe([])
    with pytest.raises(ValueError, match="does not match the model's 5x5 token grid"):
        ImagePipeline(LlamaGenGPT(GPTConfig(vocab_size=32, dim=32, n_layer=1, n_head=2, block_size=25)),
                      VQModel(TINY_VQ), PipelineInfo(name="x", image_size=16))
    with pytest.raises(ValueError, match="vocabulary 64 != tokenizer codebook 32"):
        ImagePipeline(LlamaGenGPT(GPTConfig(vocab_size=64, dim=32, n_layer=1, n_head=2, block_size=16)),
                      VQModel(TINY_VQ), PipelineInfo(name="x", image_size=16))
