"""The text-to-image recipe at toy scale: it warm-starts from a class model, trains both parts, exports them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vgen.data.scenes import caption_vocabulary
from vgen.hub import from_pretrained, save_pretrained
from vgen.models.checkpoint_io import copy_shared_tensors
from vgen.models.llamagen import GPTConfig, LlamaGenGPT
from vgen.models.word_encoder import WordEncoderConfig, WordTextEncoder
from vgen.training.t2i import CaptionedGPT, T2IRecipe, export, prompt_probe, start_from, train_t2i
from vgen.training.trainer import TrainConfig

TOY_C2I = GPTConfig(vocab_size=32, dim=32, n_layer=1, n_head=2, multiple_of=16, num_classes=8, block_size=256)
TOY_T2I = dataclasses.replace(TOY_C2I, model_type="t2i", caption_dim=16, cls_token_num=24)
TOY_WORDS = WordEncoderConfig.for_words(caption_vocabulary(), dim=16, n_layer=1, n_head=2, max_length=24)


def test_a_class_model_warm_starts_a_text_model_in_everything_but_the_condition_embedder():
    torch.manual_seed(0)
    source, target = LlamaGenGPT(TOY_C2I), LlamaGenGPT(TOY_T2I)
    fresh = copy_shared_tensors(target, source)
    assert fresh and all(name.startswith("cls_embedding.") for name in fresh)
    for name, tensor in source.state_dict().items():
        if not name.startswith("cls_embedding."):
            assert torch.equal(target.state_dict()[name], tensor), name


def test_recipe_trains_from_a_class_model_and_exports_a_loadable_encoder_and_gpt(tmp_path, tiny_vq_dir):
    torch.manual_seed(0)
    init = save_pretrained(LlamaGenGPT(TOY_C2I), tmp_path / "c2i")
    cfg = TrainConfig(steps=2, lr=1e-3, warmup_steps=1, bf16=False)
    model = train_t2i(tmp_path / "run", tiny_vq_dir, tmp_path / "data", cfg, T2IRecipe(num_images=16, batch_size=4),
                      gpt_config=TOY_T2I, encoder_config=TOY_WORDS, init_from=init)
    encoder, gpt = from_pretrained(tmp_path / "run/export/text_encoder"), from_pretrained(tmp_path / "run/export/gpt")
    assert encoder.config == TOY_WORDS and gpt.config == TOY_T2I
    torch.testing.assert_close(gpt.state_dict()["output.weight"], model.gpt.state_dict()["output.weight"])
    cond = encoder.condition(["a red star"])
    assert gpt(cond).shape == (1, 1, 32)


def test_a_text_model_folder_starts_both_parts_under_the_new_runs_settings(tmp_path):
    torch.manual_seed(0)
    trained = CaptionedGPT(WordTextEncoder(TOY_WORDS), LlamaGenGPT(TOY_T2I))
    folder = export(trained, tmp_path / "export")
    run = CaptionedGPT(WordTextEncoder(TOY_WORDS), LlamaGenGPT(dataclasses.replace(TOY_T2I, prefix_rope="identity")))
    start_from(run, folder)
    for name, tensor in trained.state_dict().items():
        assert torch.equal(run.state_dict()[name], tensor), name
    assert run.gpt.config.prefix_rope == "identity"


@pytest.mark.parametrize("change", [{"dim": 32},
                                    {"vocabulary": TOY_WORDS.vocabulary[:3] + TOY_WORDS.vocabulary[3:][::-1]}],
                         ids=["another size", "the same words in another order"])
def test_a_text_encoder_of_another_size_or_vocabulary_is_refused(tmp_path, change):
    """A vocabulary of the same length in another order would load by shape and read each word as another."""
    folder = export(CaptionedGPT(WordTextEncoder(TOY_WORDS), LlamaGenGPT(TOY_T2I)), tmp_path / "export")
    other = dataclasses.replace(TOY_WORDS, **change)
    run = CaptionedGPT(WordTextEncoder(other), LlamaGenGPT(dataclasses.replace(TOY_T2I, caption_dim=other.dim)))
    with pytest.raises(ValueError, match="the text encoder in .*export/text_encoder does not fit this run's"):
        start_from(run, folder)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")])])
def test_the_prompt_probe_samples_where_the_model_is_and_keeps_the_training_mode(tiny_vq_dir, device):
    torch.manual_seed(0)
    model = CaptionedGPT(WordTextEncoder(TOY_WORDS), LlamaGenGPT(TOY_T2I)).to(device).train()
    figures = prompt_probe(tiny_vq_dir, prompts=("a red star",), per_prompt=2)(model)
    assert figures["probe_tokens_measured"] > 0 and 0 < figures["probe_median_top1_prob"] <= 1
    assert model.training
