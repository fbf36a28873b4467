"""The released sizes of the two layout families, on the meta device (nothing is allocated or downloaded):
``transformers``' own classes at Emu3-Gen's and Chameleon / Lumina-mGPT-7B's released configs hold the released
parameter counts, and vgen's :class:`~vgen.models.mllm.LayoutLM` at the same sizes (the configs
``benchmarks/t2i_speed.py`` times, built by the families' own config converters) holds the language model less the
head rows of the text tokens it never predicts (it keeps only the image-code rows of ``lm_head``)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the released configs are transformers' classes")

# Emu3-Gen: transformers' Emu3Config defaults are the released model's (vocabulary 184,622, width 4096, 32 layers)
EMU3_LM, EMU3_VQ, EMU3_CODES = 8_492_011_520, 270_740_287, 32_768
# Chameleon-7B / Lumina-mGPT-7B: vocabulary 65,536 (8,192 image codes), width 4096, MLP 11,008, 32 layers of 32 heads
CHAMELEON_LM, CHAMELEON_VQ_ENCODER, CHAMELEON_CODES = 7_013_666_816, 29_423_616, 8_192
LUMINA_QK_NORM = (1, 128)  # Lumina-mGPT's q/k LayerNorm: one [model_parallel_size, head_dim] row shared by the heads


def count(module: torch.nn.Module, skip: str | None = None) -> int:
    return sum(p.numel() for name, p in module.named_parameters() if skip is None or not name.startswith(skip))


def chameleon_config():
    return transformers.ChameleonConfig(vocab_size=65536, hidden_size=4096, intermediate_size=11008,
                                        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                                        rope_theta=1e4, vocabulary_map={})


def test_transformers_emu3_gen_holds_the_released_parameter_count() -> None:
    config = transformers.Emu3Config(vocabulary_map={})
    assert (config.text_config.vocab_size, config.text_config.hidden_size, config.text_config.num_hidden_layers,
            config.vq_config.codebook_size) == (184622, 4096, 32, EMU3_CODES)
    with torch.device("meta"):
        model = transformers.Emu3ForConditionalGeneration(config)
    assert count(model) == 8_762_751_807 == EMU3_LM + EMU3_VQ
    assert count(model, skip="model.vqmodel.") == EMU3_LM


def test_transformers_chameleon_7b_holds_the_released_parameter_count_and_lumina_shares_its_qk_norm() -> None:
    config = chameleon_config()
    with torch.device("meta"):
        model = transformers.ChameleonForConditionalGeneration(config)
    assert count(model) == 7_043_090_432 == CHAMELEON_LM + CHAMELEON_VQ_ENCODER  # tf's VQ is the encoder only
    assert count(model, skip="model.vqmodel.") == CHAMELEON_LM
    # transformers keeps a q/k LayerNorm row per head; Lumina-mGPT's released checkpoint one per model-parallel rank
    norm = model.model.layers[0].self_attn.q_norm
    assert tuple(norm.weight.shape) == (32, 128)
    per_head = 4 * 32 * 128  # q and k, weight and bias, a row per head
    shared = 4 * LUMINA_QK_NORM[0] * LUMINA_QK_NORM[1]
    assert CHAMELEON_LM - 32 * (per_head - shared) == 7_013_158_912


@pytest.mark.parametrize(("name", "language_model", "text_rows", "codes", "vgen_count"), [
    ("emu3_gen_config", EMU3_LM, 184622, EMU3_CODES, 7_870_017_536),
    ("lumina_7b_config", CHAMELEON_LM, 65536, CHAMELEON_CODES, 6_778_785_792),
])
def test_the_benchmarks_layout_lm_is_the_released_language_model_less_the_head_rows_of_text(
        name, language_model, text_rows, codes, vgen_count, benchmark_module) -> None:
    from vgen.models.mllm import LayoutLM

    config, code_ids = getattr(benchmark_module("t2i_speed"), name)(tiny=False)
    assert (config.text_vocab_size, config.vocab_size, len(code_ids)) == (text_rows, codes, codes)
    with torch.device("meta"):
        model = LayoutLM(config)
    # LayoutLM keeps the whole embedding table but only the code rows of lm_head (qk norms a row per head, as tf)
    assert count(model) == vgen_count == language_model - (text_rows - codes) * config.dim
    assert tuple(model.head.weight.shape) == (codes, 4096) and model.config.n_layer == 32
