"""Lumina-mGPT (Chameleon) as a vgen backbone, on a tiny random folder in Lumina's released layout.

The oracle is a forward pass written in the tests from Lumina's ``lumina_mgpt/model/chameleon/modeling_chameleon.py``
(``lumina_reference`` in tests/conftest.py: RMSNorm pre-norm blocks; queries and keys layer-normalised over
``head_dim`` with the ``[model_parallel_size, head_dim]`` weight and bias repeated over each shard's heads, before
Llama's ``rotate_half`` rotary embedding; SwiGLU; ``lm_head``), and a greedy loop written here from its
``inference_solver.py`` logits processors (guidance on raw
logits against the context that starts at ``<racm3:break>``, then the forced new-line / ``<eoss>`` tokens or the
image-token mask, then top-k). ``transformers``' ``ChameleonModel`` computes the same hidden states once the q/k
norms are expanded per head. The differences found between the two implementations, checked below:

- ``transformers`` keeps the q/k norms as ``[n_heads, head_dim]`` and refuses Lumina's ``[model_parallel_size,
  head_dim]`` tensors;
- ``transformers``' ``ChameleonForConditionalGeneration`` sets every image-token logit to the dtype's minimum (Lumina
  only under ``mask_image_logits``, which its image models turn off), so it cannot generate images;
- its ``ChameleonVQVAE`` has no decoder (codes cannot become pixels); vgen reads Chameleon's VQGAN instead.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from vgen.hub import CheckpointError
from vgen.models import chameleon
from vgen.models.chameleon import check_lumina_folder, is_lumina_folder, load_lumina
from vgen.samplers import SamplingParams, get_sampler

transformers = pytest.importorskip("transformers", reason="Lumina-mGPT needs transformers (pip install -e .[t2i])")

PROMPTS = ["a red star", "a big blue cat on the moon"]
QK_NORMS = ("q_norm.weight", "q_norm.bias", "k_norm.weight", "k_norm.bias")


@pytest.fixture(scope="module")
def lumina(tiny_lumina_dir):
    return load_lumina(tiny_lumina_dir, image_size=64, max_prompt_tokens=40)


@pytest.fixture(scope="module")
def weights(tiny_lumina_dir) -> dict[str, torch.Tensor]:
    return load_file(tiny_lumina_dir / "model.safetensors")


@pytest.fixture(scope="module")
def hf_config(tiny_lumina_dir) -> dict:
    return json.loads((tiny_lumina_dir / "config.json").read_text())


@pytest.fixture(scope="module")
def forward(lumina_reference, weights, hf_config):
    """One unpadded sequence (a list of ids) -> its logits [T, text vocab], by the reference."""
    return lambda ids: lumina_reference(weights, hf_config, torch.tensor([ids]))[0]


def prompt_rows(cond) -> list[list[int]]:
    return [row[mask].tolist() for row, mask in zip(cond.values, cond.mask)]


def test_prompt_is_lumina_template_then_the_image_header(lumina) -> None:
    tok, config = lumina.text_tokenizer, lumina.model.config
    vocab = tok.get_vocab()
    assert config.head_tokens == (vocab["<racm3:break>"], vocab["<reserved08802>"], vocab["<reserved08802>"])
    assert (config.row_end, config.tail) == ((vocab["<reserved08799>"],), (vocab["<eoss>"],))
    assert (config.grid, config.cfg_scale, config.top_k) == ((4, 4), 3.0, 2000)
    cond = lumina.condition(PROMPTS)
    text = "Generate an image of 64x64 according to the following prompt:\na red star<reserved08706>"
    expected = [vocab["<s>"], *tok.encode(text, add_special_tokens=False), *config.head_tokens]
    assert prompt_rows(cond)[0] == expected
    assert cond.mask.sum(1).tolist() == [len(expected), len(expected) + 4]  # left-padded to the longer prompt
    null = lumina.model.null_condition(cond)
    assert null.values.tolist() == [list(config.head_tokens)] * 2 and bool(null.mask.all())


def test_code_ids_follow_the_imgimg_names_of_text_tokenizer(lumina) -> None:
    vocab = lumina.text_tokenizer.get_vocab()
    names = {"IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(c)) + "Z": c for c in range(4)}
    assert lumina.model.code_ids.tolist() == [vocab[name] for name, _ in sorted(names.items(), key=lambda x: x[1])]
    assert lumina.model.code_ids.tolist() != list(range(4, 8))  # the fixture shuffles them: order matters


@torch.no_grad()
def test_teacher_forced_logits_equal_lumina_forward(lumina, forward) -> None:
    model, config = lumina.model, lumina.model.config
    cond = lumina.condition(PROMPTS)
    codes = torch.randint(4, (2, config.num_tokens), generator=torch.Generator().manual_seed(0))
    cache = model.new_cache(2)
    logits = torch.cat([model.prefill(cond, cache)[:, None], model.decode(codes[:, :-1], cache)], dim=1)
    newline, width = config.row_end[0], config.image_cols
    for b, prompt in enumerate(prompt_rows(cond)):
        seq, predicts = list(prompt), []
        for c, code in enumerate(model.code_ids[codes[b]].tolist()):
            predicts.append(len(seq) - 1)
            seq.append(code)
            if c % width == width - 1:
                seq.append(newline)
        expected = forward(seq)[predicts][:, model.code_ids]
        torch.testing.assert_close(logits[b], expected, rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_transformers_chameleon_agrees_once_qk_norms_are_expanded(weights, hf_config, lumina, forward) -> None:
    """and shows the two differences that keep ``transformers`` from running Lumina's images."""
    hf = hf_config
    config = transformers.ChameleonConfig(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], intermediate_size=hf["intermediate_size"],
        num_hidden_layers=hf["num_hidden_layers"], num_attention_heads=hf["num_attention_heads"],
        num_key_value_heads=hf["num_key_value_heads"], max_position_embeddings=hf["max_position_embeddings"],
        rope_theta=hf["rope_theta"], rms_norm_eps=hf["rms_norm_eps"], vocabulary_map=hf["vocabulary_map"],
        vq_config={"embed_dim": 4, "num_embeddings": 4, "base_channels": 32, "channel_multiplier": [1, 2]})
    tf = transformers.ChameleonForConditionalGeneration(config).eval()
    own = {k: v for k, v in tf.state_dict().items() if k.startswith("model.vqmodel.")}
    with pytest.raises(RuntimeError, match="q_norm.weight"):  # Lumina's [model_parallel_size, head_dim]
        tf.load_state_dict({**weights, **own}, strict=True)
    shapes = {k: v.shape for k, v in tf.state_dict().items()}
    expanded = {k: v.repeat_interleave(shapes[k][0] // v.shape[0], 0) if k.endswith(QK_NORMS) else v
                for k, v in weights.items() if not k.startswith("model.vqmodel.")}
    tf.load_state_dict({**expanded, **own}, strict=True)
    ids = prompt_rows(lumina.condition(PROMPTS[1:]))[0] + lumina.model.code_ids[[0, 2, 1]].tolist()
    hidden = tf.model(torch.tensor([ids])).last_hidden_state[0]
    torch.testing.assert_close(hidden @ weights["lm_head.weight"].T, forward(ids), rtol=1e-4,
                               atol=1e-4)
    image_logits = tf(torch.tensor([ids])).logits[0][:, lumina.model.code_ids]
    assert bool((image_logits == torch.finfo(image_logits.dtype).min).all())  # tf masks every image token
    assert not hasattr(tf.model.vqmodel, "decoder")


def lumina_greedy(forward, prompt: list[int], image_ids: list[int], newline: int, eoss: int, grid: tuple[int, int],
                  cfg: float, top_k: int) -> list[int]:
    """The image tokens (codes, new lines, ``<eoss>``) Lumina's ``generate`` picks greedily after a prompt ending
    in the image header, through ``create_logits_processor(cfg, image_top_k)``: guidance on raw logits against the
    unconditional context (the header, then every generated token), then the new-line / ``<eoss>`` forcing or the
    image-token mask, then top-k."""
    h, width = grid
    seq, uncond, out = list(prompt), prompt[-3:], []
    while not out or out[-1] != eoss:
        cond_logits, uncond_logits = forward(seq)[-1], forward(uncond)[-1]
        scores = cfg * (cond_logits - uncond_logits) + uncond_logits
        n = len(out) + 1
        if n % (width + 1) == 0 or n == (width + 1) * h + 1:
            forced = newline if n % (width + 1) == 0 else eoss
            scores = torch.full_like(scores, float("-inf")).index_fill(0, torch.tensor([forced]), 0.0)
        else:
            allowed = torch.zeros_like(scores, dtype=torch.bool).index_fill(0, torch.tensor(image_ids), True)
            scores = scores.masked_fill(~allowed, float("-inf"))
        k = min(top_k, scores.numel())
        scores = scores.masked_fill(scores < torch.topk(scores, k).values[-1], float("-inf"))
        token = int(scores.argmax())
        out.append(token), seq.append(token), uncond.append(token)
    return out


@torch.no_grad()
def test_greedy_ar_equals_lumina_inference_solver(lumina, forward) -> None:
    model, config = lumina.model, lumina.model.config
    cond = lumina.condition(PROMPTS)
    params = SamplingParams(temperature=0.0, cfg_scale=config.cfg_scale, top_k=config.top_k)
    tokens = get_sampler("ar").sample(model, cond, params, generator=torch.Generator().manual_seed(0)).tokens
    for b, prompt in enumerate(prompt_rows(cond)):
        expected = lumina_greedy(forward, prompt, sorted(model.code_ids.tolist()), config.row_end[0], config.tail[0],
                                 config.grid, config.cfg_scale, config.top_k)
        assert config.layout.sequence(model.code_ids[tokens[b:b + 1]])[0, 3:].tolist() == expected


# ---- the folder: bad input is one line -------------------------------------------------------------------------
@pytest.fixture
def folder_copy(tiny_lumina_dir, tmp_path):
    return shutil.copytree(tiny_lumina_dir, tmp_path / "lumina")


def edit_config(folder, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def one_line(err: pytest.ExceptionInfo) -> str:
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_lumina_folder_is_told_by_its_architecture_or_z_loss_weight(tiny_lumina_dir, folder_copy) -> None:
    assert is_lumina_folder(tiny_lumina_dir) and check_lumina_folder(tiny_lumina_dir) == tiny_lumina_dir
    config = json.loads((folder_copy / "config.json").read_text())
    config.pop("z_loss_weight")
    (folder_copy / "config.json").write_text(json.dumps({**config, "architectures": ["ChameleonModel"]}))
    assert not is_lumina_folder(folder_copy)
    with pytest.raises(ValueError) as err:
        check_lumina_folder(folder_copy)
    assert "not Lumina-mGPT" in one_line(err)


@pytest.mark.parametrize("name", ["text_tokenizer.json", "vqgan.yaml", "vqgan.ckpt"])
def test_a_missing_chameleon_tokenizer_file_is_named_with_where_it_goes(folder_copy, name) -> None:
    (folder_copy / "ckpts" / "chameleon" / "tokenizer" / name).unlink()
    with pytest.raises(ValueError) as err:
        load_lumina(folder_copy)
    message = one_line(err)
    assert f"missing {name} in {folder_copy / 'ckpts' / 'chameleon' / 'tokenizer'}" in message
    assert "lumina_mgpt/ckpts/chameleon/tokenizer/" in message


def test_missing_weights_or_tokenizer_json_are_one_line(folder_copy) -> None:
    (folder_copy / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="no tokenizer.json") as err:
        check_lumina_folder(folder_copy)
    one_line(err)
    (folder_copy / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="has no weights") as err:
        check_lumina_folder(folder_copy)
    one_line(err)


def test_config_that_disagrees_with_the_weights_is_refused_before_any_tensor_is_read(folder_copy,
                                                                                     monkeypatch) -> None:
    edit_config(folder_copy, intermediate_size=80)
    monkeypatch.setattr(chameleon, "safe_open", lambda *a, **k: pytest.fail("a tensor was read"))
    with pytest.raises(CheckpointError) as err:
        load_lumina(folder_copy, image_size=64, max_prompt_tokens=40)
    message = one_line(err)
    assert "model.safetensors does not match" in message and str(folder_copy / "config.json") in message
    assert "mlp.gate_proj.weight: checkpoint (96, 64) vs model (80, 64)" in message


def test_qk_norms_in_transformers_layout_load_too_and_other_shapes_are_refused(folder_copy, weights, lumina) -> None:
    per_head = {k: v.repeat_interleave(2 if "q_norm" in k else 1, 0) if k.endswith(QK_NORMS) else v
                for k, v in weights.items()}  # 4 query heads, 2 key heads, model_parallel_size 2
    save_file(per_head, str(folder_copy / "model.safetensors"))
    loaded = load_lumina(folder_copy, image_size=64, max_prompt_tokens=40)
    for name, tensor in lumina.model.state_dict().items():
        torch.testing.assert_close(loaded.model.state_dict()[name], tensor)
    save_file({**weights, "model.layers.1.self_attn.q_norm.weight": torch.ones(3, 16)},
              str(folder_copy / "model.safetensors"))
    with pytest.raises(ValueError) as err:
        load_lumina(folder_copy, image_size=64, max_prompt_tokens=40)
    message = one_line(err)
    assert "q_norm weights of shape [(2, 16), (3, 16)]" in message and "(2, 16) (Lumina) or (4, 16)" in message


@pytest.mark.parametrize(("changes", "expected"), [
    (dict(mask_image_logits=True), "mask_image_logits is true"),
    (dict(swin_norm=True), "swin_norm"),
    (dict(max_position_embeddings=40), "max_positions 40"),
    (dict(vocabulary_map={"IMGIMGAZ": 30}), "vocabulary_map gives 'IMGIMGAZ' id 30"),
])
def test_a_config_lumina_cannot_generate_with_is_one_line(folder_copy, changes, expected) -> None:
    edit_config(folder_copy, **changes)
    with pytest.raises(ValueError, match=expected) as err:
        load_lumina(folder_copy, image_size=64, max_prompt_tokens=40)
    one_line(err)


@pytest.mark.parametrize(("size", "expected"), [(48, "not a positive multiple of 32"),
                                                (128, "no <reserved08804>")])
def test_an_image_size_without_size_tokens_is_one_line(tiny_lumina_dir, size, expected) -> None:
    with pytest.raises(ValueError, match=expected) as err:
        load_lumina(tiny_lumina_dir, image_size=size, max_prompt_tokens=40)
    one_line(err)


def test_a_prompt_longer_than_the_cache_is_one_line(lumina) -> None:
    with pytest.raises(ValueError, match="takes at most 40") as err:
        lumina.condition(["a red star " * 10])
    one_line(err)


def test_prompt_room_defaults_to_what_the_context_leaves_beside_the_image(tiny_lumina_dir) -> None:
    """128 positions less 4 rows of 4 codes and a new line each, less ``<eoss>``."""
    assert load_lumina(tiny_lumina_dir, image_size=64).model.config.max_prompt_tokens == 128 - 4 * 5 - 1


def test_sharded_weights_load_as_one_file_and_a_missing_shard_is_named(folder_copy, weights, lumina) -> None:
    """Lumina's 7B checkpoints come in shards named by ``model.safetensors.index.json``."""
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in shards.items():
        save_file({k: weights[k] for k in keys}, str(folder_copy / shard))
    (folder_copy / "model.safetensors").unlink()
    (folder_copy / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: shard for shard, keys in shards.items() for k in keys}}))
    loaded = load_lumina(folder_copy, image_size=64, max_prompt_tokens=40)
    for name, tensor in lumina.model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[name], tensor)
    (folder_copy / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ValueError, match="names shards missing from .*: model-00002-of-00002.safetensors") as err:
        load_lumina(folder_copy, image_size=64, max_prompt_tokens=40)
    one_line(err)


def test_the_shapes_read_for_a_released_7b_config_are_its_parameter_count() -> None:
    """Lumina-mGPT-7B (Chameleon-7B's shapes, q/k norms [1, 128]): 7,013,158,912 parameters without the VQ model
    (tests/models/test_mllm_sizes.py derives the number from ``transformers``' Chameleon-7B)."""
    hf = {"vocab_size": 65536, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
          "num_attention_heads": 32, "num_key_value_heads": 32, "model_parallel_size": 1}
    shapes = chameleon.checkpoint_shapes(hf, {"q_norm": 1, "k_norm": 1})
    assert sum(math.prod(s) for s in shapes.values()) == 7_013_158_912
    assert len(shapes) == 3 + 32 * 13
