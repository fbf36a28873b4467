"""Emu3-Gen as a vgen backbone equals ``transformers``' documented image generation on a tiny random checkpoint: the
prompt and negative-prompt rows, the logits of every step (conditional rows against ``generate``'s own, negative rows
against a forward pass over the negative prompt and the generated tokens), greedy tokens under guidance, the layout
of the generated sequence and the VQ decoding; bad folders, weights, prompts and image areas are refused in one
line before any weight is read."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

from vgen.models.conditioning import cat_conditions
from vgen.samplers import SamplingParams, get_sampler

transformers = pytest.importorskip("transformers", reason="Emu3 needs transformers (pip install -e '.[t2i]')")

from vgen.models.emu3 import (  # noqa: E402
    NEGATIVE_PROMPT,
    Emu3VQ,
    LoadedEmu3,
    emu3_code_ids,
    emu3_condition,
    emu3_config,
    emu3_defaults,
    is_emu3_folder,
    load_emu3,
)

PROMPTS = ["a red star", "a big blue dog on the moon under the rain"]  # prompts of different lengths in one batch
AREA, SIDE = 576, 3  # 24 x 24 pixels: 3 x 3 codes, the docs' constraint function gives the whole tail at this width


@pytest.fixture(scope="module")
def emu3(tiny_emu3_dir) -> LoadedEmu3:
    return load_emu3(tiny_emu3_dir, image_area=AREA)


@pytest.fixture(scope="module")
def hf_model(tiny_emu3_dir):
    return transformers.Emu3ForConditionalGeneration.from_pretrained(tiny_emu3_dir, local_files_only=True).eval()


def docs_inputs(processor) -> tuple[dict, dict]:
    """The prompt and negative-prompt inputs as transformers' docs build them."""
    inputs = processor(text=PROMPTS, padding=True, return_tensors="pt", return_for_image_generation=True,
                       image_area=AREA)
    negative = processor(text=[NEGATIVE_PROMPT] * len(PROMPTS), return_tensors="pt")
    return inputs, negative


def docs_prefix_allowed_tokens_fn(model, processor, height: int, width: int):
    """The docs' ``prefix_allowed_tokens_fn``: visual tokens, the end of line after every row, then the tail."""
    tok = processor.tokenizer
    eol = tok.encode("<|extra_200|>", return_tensors="pt")[0]
    visual = model.vocabulary_mapping.image_tokens

    def allowed(batch_id, input_ids):
        position = torch.nonzero(input_ids == tok.image_wrapper_token_id, as_tuple=True)[0][0]
        offset = input_ids.shape[0] - position
        if offset % (width + 1) == 0:
            return (eol,)
        for step, token in enumerate((tok.eof_token_id, tok.eoi_token_id, tok.eos_token_id), start=1):
            if offset == (width + 1) * height + step:
                return (torch.tensor([token]),)
        if offset > (width + 1) * height + 3:
            return (torch.tensor([tok.pad_token_id]),)
        return visual

    return allowed


@pytest.fixture(scope="module")
def generated(hf_model, emu3) -> tuple[torch.Tensor, list[torch.Tensor], dict, dict]:
    """Greedy ``generate`` with guidance 3 as the docs run it: the generated tokens [2, 15], the raw logits of every
    step, the prompt and negative inputs."""
    inputs, negative = docs_inputs(emu3.processor)
    height, width = inputs.pop("image_sizes")[0]
    out = hf_model.generate(**inputs, max_new_tokens=height * (width + 1) + 3, do_sample=False, guidance_scale=3.0,
                            prefix_allowed_tokens_fn=docs_prefix_allowed_tokens_fn(hf_model, emu3.processor, height,
                                                                                    width),
                            negative_prompt_ids=negative["input_ids"],
                            negative_prompt_attention_mask=negative["attention_mask"],
                            return_dict_in_generate=True, output_logits=True)
    return out.sequences[:, inputs["input_ids"].shape[1]:], list(out.logits), inputs, negative


def test_the_prompt_and_negative_rows_are_the_docs(emu3, generated) -> None:
    _, _, inputs, negative = generated
    cond = emu3.condition(PROMPTS)
    assert torch.equal(cond.values, inputs["input_ids"]) and torch.equal(cond.mask, inputs["attention_mask"].bool())
    assert not cond.mask[0, 0]  # left-padded to the longest
    tok = emu3.processor.tokenizer
    header = tok.convert_tokens_to_ids(["<|image start|>", "3", "*", "3", "<|image token|>"])
    assert (cond.values[:, -5:] == torch.tensor(header)).all()
    assert [int(row[m][0]) for row, m in zip(cond.values, cond.mask, strict=True)] == [tok.bos_token_id] * 2
    assert torch.equal(cond.null.values, negative["input_ids"]) and cond.null.mask.all()
    own = emu3.condition(PROMPTS, negative_prompt=["blurry", "bad anatomy"]).null
    assert own.values[0, -2:].tolist() == [tok.bos_token_id, tok.convert_tokens_to_ids("blurry")]
    assert own.mask.tolist() == [[False, True, True], [True, True, True]]


def test_every_step_and_greedy_tokens_equal_transformers_generate(emu3, hf_model, generated) -> None:
    sequence, logits, _, negative = generated
    model, layout = emu3.model, emu3.model.config.layout
    code_ids = model.code_ids
    assert model.grid == (SIDE, SIDE) and len(logits) == sequence.shape[1] == layout.offset(9) + 3
    # generate's image part is the layout's sequence of its codes: a row end after each row, then the tail
    text_of_codes = layout.codes_of(sequence)
    codes = (text_of_codes[..., None] == code_ids).int().argmax(-1)
    assert torch.equal(code_ids[codes], text_of_codes)
    assert torch.equal(layout.sequence(code_ids[codes]), sequence)
    # the negative rows' logits: transformers' forward over the negative prompt and every generated token
    with torch.no_grad():
        null_logits = hf_model(torch.cat([negative["input_ids"], sequence], dim=1)).logits
    steps = layout.code_slots()
    cond = emu3.condition(PROMPTS)
    cache = model.new_cache(4)
    out = model.prefill(cat_conditions([cond, model.null_condition(cond)]), cache)
    length = negative["input_ids"].shape[1]
    for t in range(model.num_tokens):
        step = int(steps[t])
        torch.testing.assert_close(out[:2], logits[step][:, code_ids], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out[2:], null_logits[:, length - 1 + step, code_ids], rtol=1e-4, atol=1e-4)
        if t + 1 < model.num_tokens:
            out = model.decode(codes[:, t:t + 1].repeat(2, 1), cache)[:, -1]
    assert logits[0][:, code_ids].std() > 0.3  # informative logits, not a flat law that any order would match
    greedy = get_sampler("ar").sample(model, cond, SamplingParams(temperature=0.0, cfg_scale=3.0))
    assert torch.equal(greedy.tokens, codes)


def test_the_vq_tokenizer_decodes_as_transformers_and_the_processor_unnormalises(emu3, hf_model) -> None:
    codes = torch.randint(0, 64, (2, SIDE * SIDE), generator=torch.Generator().manual_seed(1))
    images = emu3.tokenizer.decode_code(codes, emu3.model.grid)
    assert images.shape == (2, 3, 8 * SIDE, 8 * SIDE)
    sequence = emu3.model.config.layout.sequence(emu3.model.code_ids[codes])
    expected = hf_model.decode_image_tokens(image_tokens=sequence, height=SIDE, width=SIDE)
    image_processor = emu3.processor.image_processor
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (image_processor.image_mean, image_processor.image_std))
    torch.testing.assert_close(images, (expected * std + mean) * 2 - 1)  # the pixels postprocess gives, in [-1, 1]
    assert emu3.tokenizer.codebook().shape == (64, 4) and emu3.tokenizer.downsample_factor == 8
    with pytest.raises(ValueError, match=r"codes must lie in \[0, 64\)"):
        emu3.tokenizer.decode_code(codes + 64)


def test_the_backbone_keeps_the_visual_rows_of_the_head_by_name(emu3, hf_model) -> None:
    model, vocab = emu3.model, hf_model.config.vocabulary_map
    assert model.code_ids.tolist() == [vocab[f"<|visual token {c:06d}|>"] for c in range(64)]
    assert model.code_ids.diff().ne(1).any()  # the fixture scrambles them: a contiguity assumption would fail
    torch.testing.assert_close(model.head.weight, hf_model.lm_head.weight[model.code_ids])
    torch.testing.assert_close(model.text_embeddings.weight, hf_model.get_input_embeddings().weight)
    config = model.config
    assert config.row_end == (vocab["<|extra_200|>"],)
    assert config.tail == (vocab["<|extra_201|>"], vocab["<|image end|>"], vocab["<|extra_204|>"])
    assert config.head_tokens == () and not model.training


def test_sampling_defaults_come_from_the_generation_config_else_the_original(emu3) -> None:
    assert (emu3.model.config.cfg_scale, emu3.model.config.top_k) == (3.0, 2048)
    assert emu3.defaults.source == ("guidance_scale from the original Emu3 code, top_k from the original Emu3 code")
    own = emu3_defaults(transformers.GenerationConfig(guidance_scale=5.0, top_k=100))
    assert (own.cfg_scale, own.top_k) == (5.0, 100)
    assert own.source == "guidance_scale from generation_config.json, top_k from generation_config.json"


def test_missing_and_wrong_folders_are_refused_in_one_line(tmp_path, tiny_emu3_dir) -> None:
    for name in ("empty", "original", "no-tok"):
        (tmp_path / name).mkdir()
    (tmp_path / "original" / "config.json").write_text(json.dumps({"model_type": "Emu3"}))
    shutil.copy(tiny_emu3_dir / "config.json", tmp_path / "no-tok")
    cases = [(tmp_path / "nowhere", "does not exist; put an Emu3-Gen checkpoint in transformers' layout there, "
                                    "e.g. `huggingface-cli download BAAI/Emu3-Gen-hf"),
             (tmp_path / "empty", r"is not an Emu3 checkpoint \(no config.json\)"),
             (tmp_path / "original", "holds a 'Emu3' model, not Emu3 .*the original BAAI/Emu3-Gen layout"),
             (tmp_path / "no-tok", "has an Emu3 model but no tokenizer")]
    for folder, message in cases:
        with pytest.raises(ValueError, match=message) as info:
            load_emu3(folder)
        assert "\n" not in str(info.value)
    assert is_emu3_folder(tiny_emu3_dir) and not is_emu3_folder(tmp_path / "original")
    assert not is_emu3_folder(tmp_path / "empty") and not is_emu3_folder(tmp_path / "nowhere")


def test_weights_that_do_not_fit_the_config_are_refused_before_loading(tmp_path, tiny_emu3_dir) -> None:
    folder = shutil.copytree(tiny_emu3_dir, tmp_path / "bad")
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["num_hidden_layers"] = 3
    config["text_config"]["intermediate_size"] = 128
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="do not fit its config.json: missing keys: model.text_model.layers.2.*"
                                         "shape mismatches: .*mlp.down_proj.weight") as info:
        load_emu3(folder, image_area=AREA)
    assert "\n" not in str(info.value)


def test_an_image_or_prompt_too_long_for_the_context_is_refused(emu3, tiny_emu3_dir) -> None:
    # 512 positions: 20 x 20 codes take 20 * 21 + 3 = 423, leaving 89 for prompts
    with pytest.raises(ValueError, match=r"image_area 25600 takes 20x20 codes, 423 positions .* prompts of up to 256 "
                                         r"tokens .* 512 positions .* \(room for 89 prompt tokens\)"):
        load_emu3(tiny_emu3_dir, image_area=160 * 160)
    with pytest.raises(ValueError, match=r"prompt 1 takes 16 tokens with the image header; this model takes "
                                         r"at most 12 \(max_prompt_tokens\): shorten it"):
        emu3_condition(emu3.processor, PROMPTS, emu3.model.grid, max_prompt_tokens=12)
    with pytest.raises(ValueError, match="negative prompt 0 takes 44 tokens; this model takes at most 20"):
        emu3_condition(emu3.processor, PROMPTS, emu3.model.grid, max_prompt_tokens=20)
    for prompts, message in [([], "non-empty list of prompts"), ("a star", "non-empty list of prompts"),
                             (["a star", " "], "prompt 1 is empty")]:
        with pytest.raises(ValueError, match=message):
            emu3.condition(prompts)
    with pytest.raises(ValueError, match=r"one string or one per prompt \(2\)"):
        emu3.condition(PROMPTS, negative_prompt=["blurry"])


def test_a_vq_model_of_another_scale_is_refused(hf_model) -> None:
    config = transformers.Emu3Config(text_config=hf_model.config.text_config.to_dict(),
                                     vq_config=dict(codebook_size=64, channel_multiplier=[1, 1, 1]),
                                     vocabulary_map=hf_model.config.vocabulary_map)
    with pytest.raises(ValueError, match=r"maps 4 pixels to a code \(channel_multiplier \[1, 1, 1\]\), but "
                                         r"Emu3Processor sizes prompts for 8"):
        emu3_config(config, hf_model.generation_config, image_area=AREA)
    with pytest.raises(ValueError, match="must map 8 pixels to a code"):
        Emu3VQ(transformers.Emu3VQVAE(transformers.Emu3VQVAEConfig(codebook_size=4, base_channels=32, embed_dim=2,
                                                                   latent_channels=2, channel_multiplier=[1, 1],
                                                                   num_res_blocks=1, attn_resolutions=[],
                                                                   hidden_size=32)))


def test_a_vocabulary_without_every_visual_token_or_the_row_end_is_refused(hf_model) -> None:
    vocab = dict(hf_model.config.vocabulary_map)
    del vocab["<|visual token 000007|>"]
    with pytest.raises(ValueError, match="names 63 visual tokens, not one for each of the 64 codes"):
        emu3_code_ids(vocab, 64)
    config = transformers.Emu3Config(text_config=hf_model.config.text_config.to_dict(),
                                     vq_config=hf_model.config.vq_config.to_dict(),
                                     vocabulary_map={k: v for k, v in vocab.items() if k != "<|extra_200|>"})
    with pytest.raises(ValueError, match=re.escape("vocabulary_map has no '<|extra_200|>' token")):
        emu3_config(config, hf_model.generation_config, image_area=AREA)
