"""A text-to-image pipeline with its own text encoder: prompts in, and the encoder saved and loaded with it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vgen.data.scenes import caption_vocabulary
from vgen.models.llamagen import GPTConfig, LlamaGenGPT
from vgen.models.word_encoder import WordEncoderConfig, WordTextEncoder
from vgen.pipelines import ImagePipeline, PipelineInfo, load
from vgen.pipelines.image import TEXT_ENCODER_FOLDER
from vgen.tokenizers.vq import VQConfig, VQModel

GPT = GPTConfig(vocab_size=32, dim=32, n_layer=1, n_head=2, multiple_of=16, block_size=16, model_type="t2i",
                caption_dim=16, cls_token_num=8)
WORDS = WordEncoderConfig.for_words(caption_vocabulary(), dim=16, n_layer=1, n_head=2, max_length=8)
VQ = VQConfig(codebook_size=32, ch=8, ch_mult=(1, 2, 2), num_res_blocks=1, z_channels=8, norm_groups=4)


@pytest.fixture(scope="module")
def pipe() -> ImagePipeline:
    torch.manual_seed(0)
    return ImagePipeline(LlamaGenGPT(GPT), VQModel(VQ), PipelineInfo(name="toy-t2i", image_size=16),
                         text_encoder=WordTextEncoder(WORDS))


def test_prompts_go_through_the_pipelines_text_encoder(pipe):
    out = pipe(prompt=["a red star", "a blue ring"], seed=0)
    assert len(out.images) == 2 and out.prompts == ["a red star", "a blue ring"]
    values, mask = pipe.text_encoder.encode(["a red star", "a blue ring"])
    again = pipe(prompt_embeds=values, prompt_attention_mask=mask, seed=0)
    assert torch.equal(out.tokens, again.tokens)


def test_the_text_encoder_is_saved_and_loaded_with_the_pipeline(pipe, tmp_path):
    folder = pipe.save_pretrained(tmp_path / "toy")
    assert (folder / TEXT_ENCODER_FOLDER / "config.json").is_file()
    loaded = load(folder)
    assert isinstance(loaded.text_encoder, WordTextEncoder)
    assert torch.equal(loaded(prompt="a red star", seed=1).tokens, pipe(prompt="a red star", seed=1).tokens)


def test_an_encoder_of_another_width_is_refused():
    wide = WordTextEncoder(dataclasses.replace(WORDS, dim=32))
    with pytest.raises(ValueError, match="32-dim caption features but the model expects caption_dim=16"):
        ImagePipeline(LlamaGenGPT(GPT), VQModel(VQ), PipelineInfo(name="toy", image_size=16), text_encoder=wide)
