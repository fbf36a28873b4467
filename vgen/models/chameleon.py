"""Lumina-mGPT and Anole (Chameleon models) as vgen text-to-image backbones, with Chameleon's VQGAN tokenizer.

A Lumina-mGPT folder is the ``save_pretrained`` of Lumina's ``ChameleonXLLMXForConditionalGeneration``
(Alpha-VLLM/Lumina-mGPT, ``model_type`` "chameleon"): ``config.json``, safetensors weights and the text tokenizer
(``tokenizer.json``). Lumina's README puts Meta's Chameleon tokenizer files beside its code, in
``ckpts/chameleon/tokenizer/``; vgen reads them from the same place inside the model folder:
``<folder>/ckpts/chameleon/tokenizer/{text_tokenizer.json, vqgan.yaml, vqgan.ckpt}``.

The weights are read from the safetensors directly (``transformers``' Chameleon cannot load them: Lumina keeps each
query/key LayerNorm as ``[model_parallel_size, head_dim]``, repeated over the heads of each shard at run time, where
``transformers`` has ``[n_heads, head_dim]``). Every header shape is checked against ``config.json`` before a tensor
is read; either qk-norm layout is taken and expanded per head. The language model runs in vgen's
:class:`~vgen.models.mllm.LayoutLM`: Llama blocks with the per-head LayerNorm on queries and keys before the rotary
embedding, and a head of the image-token rows of ``lm_head`` only. ``model.vqmodel.*`` (an encoder kept by
``transformers``' converter; Lumina's training deletes it) is not read: the VQGAN comes from ``vqgan.ckpt``.

Generation follows Lumina's ``inference_solver.py`` (``FlexARInferenceSolver``):

- prompt: ``BOS + "Generate an image of {w}x{h} according to the following prompt:\\n{caption}<reserved08706>"``
  (its conversation template, one human turn), then the image header ``<racm3:break>``, ``<reserved{8800+h/32}>``,
  ``<reserved{8800+w/32}>``; Lumina samples the two size tokens, vgen fixes them to the requested size;
- image: ``h/16`` rows of ``w/16`` codes, each row followed by ``<reserved08799>`` (forced), then ``<eoss>``;
- classifier-free guidance on raw logits, ``u + s (c - u)``, against the unconditional context that starts at the
  header (``<racm3:break>, h, w`` at positions 0, 1, 2, then every generated token); image top-k 2000 and guidance
  3.0 (``create_logits_processor``'s defaults), temperature 1; 768 px (48 x 48 codes) by default.

``transformers``' own ``ChameleonForConditionalGeneration`` folders (Anole's converted checkpoint: q/k norms per
head, ``model.vqmodel`` an encoder only) load the same way (:func:`load_anole`), with Chameleon's VQGAN in the same
place, and generate as Anole's ``chameleon/inference/chameleon.py`` does: ``[BOS] + prompt + <reserved08706>``, then
``<racm3:break>``, 32 x 32 codes with no row ends, ``<eoss>``; guidance 3 against ``[BOS, <racm3:break>]``,
temperature 0.7, top-p 0.9. ``transformers`` cannot generate images from them itself: its forward sets every image
logit to the lowest value, and its VQ model has no decoder.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from vgen.models.checkpoint_io import (
    CheckpointError,
    describe_mismatch,
    load_weights,
    read_safetensors,
    read_torch_checkpoint,
    safetensors_shapes,
)
from vgen.models.conditioning import PrefixCondition
from vgen.models.layers import llama_block_weights, permute_rotary
from vgen.models.mllm import LayoutLM, MLLMConfig
from vgen.tokenizers.vq import VQConfig, VQModel

TOKENIZER_DIR = Path("ckpts", "chameleon", "tokenizer")
"""Where the Chameleon tokenizer files lie, relative to the model folder (Lumina's README: ``lumina_mgpt/ckpts/
chameleon/tokenizer/``)."""
TOKENIZER_FILES = ("text_tokenizer.json", "vqgan.yaml", "vqgan.ckpt")
LUMINA_HINT = ("download a Lumina-mGPT checkpoint (e.g. `huggingface-cli download Alpha-VLLM/Lumina-mGPT-7B-768 "
               "--local-dir {folder}`) and put Chameleon's tokenizer files (text_tokenizer.json, vqgan.yaml, "
               "vqgan.ckpt, from Meta's Chameleon release) in {folder}/ckpts/chameleon/tokenizer/")
ANOLE_HINT = ("save transformers' ChameleonForConditionalGeneration of an image-generating checkpoint there (e.g. "
              "Anole-7b converted by transformers' convert_chameleon_weights_to_hf.py) with its tokenizer, and put "
              "Chameleon's tokenizer files (text_tokenizer.json, vqgan.yaml, vqgan.ckpt) in "
              "{folder}/ckpts/chameleon/tokenizer/")
FAMILIES = {"lumina": ("Lumina-mGPT", LUMINA_HINT, "ChameleonXLLMXForConditionalGeneration"),
            "anole": ("Anole", ANOLE_HINT, "ChameleonForConditionalGeneration")}
PROMPT_TEMPLATE = "Generate an image of {w}x{h} according to the following prompt:\n{caption}<reserved08706>"
IMAGE_START, IMAGE_END, NEW_LINE = "<racm3:break>", "<eoss>", "<reserved08799>"
PATCH = 32  # pixels a size token counts (Lumina's item processor: <reserved{8800 + side / 32}>)
CFG_SCALE, TOP_K, IMAGE_SIZE = 3.0, 2000, 768
ANOLE_IMAGE_SIZE, ANOLE_CFG_SCALE, ANOLE_TEMPERATURE, ANOLE_TOP_P = 512, 3.0, 0.7, 0.9
END_OF_TURN = "<reserved08706>"
MAX_PROMPT_TOKENS = 256  # the default room for a prompt (template and image header included) in a cache


def size_token(pixels: int) -> str:
    """The name of the header token of an image side of ``pixels`` (Lumina's ``get_n_grids_token``)."""
    return f"<reserved{8800 + pixels // PATCH:05d}>"


# --------------------------------------------------------------------------------------------------------------
# Chameleon's VQGAN (taming-transformers' VQModel)


def vqgan_config(path: str | Path) -> VQConfig:
    """The :class:`VQConfig` of a taming ``vqgan.yaml`` (``model.params``: ``n_embed``, ``embed_dim`` and the
    ``ddconfig`` of the encoder and decoder). Chameleon's has no attention but the middle blocks'
    (``attn_resolutions: []``) and a raw codebook; other attention layouts are refused."""
    path = Path(path)
    try:
        import yaml
    except ImportError as e:
        raise ImportError(f"reading {path} needs PyYAML (installed with transformers: pip install -e \".[t2i]\"): "
                          f"{e}") from None
    try:
        params = yaml.safe_load(path.read_text())["model"]["params"]
        dd = params["ddconfig"]
        fields = dict(codebook_size=params["n_embed"], codebook_embed_dim=params["embed_dim"], ch=dd["ch"],
                      ch_mult=dd["ch_mult"], num_res_blocks=dd["num_res_blocks"], z_channels=dd["z_channels"],
                      dropout=dd.get("dropout", 0.0))
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from None
    except (yaml.YAMLError, UnicodeDecodeError):
        raise ValueError(f"{path} is not a readable YAML file") from None
    except (KeyError, TypeError) as e:
        what = f"{e.args[0]!r} missing" if isinstance(e, KeyError) else "a section is not a mapping"
        raise ValueError(f"{path} is not a taming VQGAN config (model.params with n_embed, embed_dim and ddconfig: "
                         f"ch, ch_mult, num_res_blocks, z_channels): {what}") from None
    if dd.get("attn_resolutions"):
        raise ValueError(f"{path}: attn_resolutions {dd['attn_resolutions']} is not supported (Chameleon's VQGAN has "
                         f"[]: attention in the middle blocks only)")
    if dd.get("double_z", False) or dd.get("in_channels", 3) != 3 or dd.get("out_ch", 3) != 3:
        raise ValueError(f"{path}: a VQGAN of RGB images with double_z false is expected, got double_z "
                         f"{dd.get('double_z')}, in_channels {dd.get('in_channels')}, out_ch {dd.get('out_ch')}")
    try:
        return VQConfig(**fields, codebook_l2_norm=False, level_attn=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None


def vqgan_state_dict(taming: dict[str, torch.Tensor], config: VQConfig) -> dict[str, torch.Tensor]:
    """:class:`VQModel`'s weights from a taming VQGAN state dict: ``{encoder,decoder}.mid.{block_1, attn_1,
    block_2}`` -> ``mid.{0, 1, 2}``, ``encoder.down.i.{block.j, downsample}`` -> ``encoder.conv_blocks.i.{res.j,
    downsample}``, ``decoder.up.i.{block.j, upsample}`` -> ``decoder.conv_blocks.{n-1-i}.{res.j, upsample}`` (taming
    numbers the decoder's levels from the output, vgen in running order); the rest by name. Taming's training loss
    (``loss.*``: LPIPS and the discriminator) is dropped; the quantizer's usage buffer, which taming lacks, is zero."""
    n, mid = len(config.ch_mult), {"block_1": "0", "attn_1": "1", "block_2": "2"}
    out = {}
    for key, value in taming.items():
        parts = key.split(".")
        if parts[0] == "loss":
            continue
        if len(parts) < 4:  # a name of no block: kept, for the strict load to name
            pass
        elif parts[0] in ("encoder", "decoder") and parts[1] == "mid":
            parts[2] = mid.get(parts[2], parts[2])
        elif parts[0] == "encoder" and parts[1] == "down":
            parts[1] = "conv_blocks"
            parts[3] = "res" if parts[3] == "block" else parts[3]
        elif parts[0] == "decoder" and parts[1] == "up" and parts[2].isdigit():
            parts[1], parts[2] = "conv_blocks", str(n - 1 - int(parts[2]))
            parts[3] = "res" if parts[3] == "block" else parts[3]
        out[".".join(parts)] = value
    out["quantize.codebook_used"] = torch.zeros(65536)
    return out


def load_vqgan(folder: str | Path) -> VQModel:
    """Chameleon's VQGAN from a tokenizer folder (``vqgan.yaml`` and ``vqgan.ckpt``, or ``vqgan.safetensors`` holding
    the same state dict), loaded strictly; float32, in eval mode. The ``.ckpt`` is read with ``torch.load(
    weights_only=True)``: a Lightning pickle that needs code to load is refused, naming the safetensors file that
    is read in its place."""
    folder = Path(folder)
    config = vqgan_config(folder / "vqgan.yaml")
    safe, ckpt = folder / "vqgan.safetensors", folder / "vqgan.ckpt"
    if safe.is_file():
        taming = read_safetensors(safe)
    elif ckpt.is_file():
        try:
            taming = read_torch_checkpoint(ckpt, "VQGAN")
        except CheckpointError as e:
            raise CheckpointError(f"{e}; torch.load(weights_only=True) reads tensors only: save the file's state_dict "
                                  f"as {safe} (safetensors.torch.save_file) and vgen reads that instead") from None
    else:
        raise ValueError(f"no VQGAN weights in {folder}: put Chameleon's vqgan.ckpt (or vqgan.safetensors) there")
    model = VQModel(config)
    load_weights(model, vqgan_state_dict(taming, config), source=str(safe if safe.is_file() else ckpt))
    return model.eval()


# --------------------------------------------------------------------------------------------------------------
# the folder


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds a JSON {type(data).__name__}, not an object")
    return data


def _chameleon_kind(folder: str | Path) -> str | None:
    """"lumina" for a Lumina-mGPT ``config.json`` (model type "chameleon" with Lumina's ``ChameleonXLLMX*``
    architecture or its ``z_loss_weight`` setting), "anole" for ``transformers``' own
    ``ChameleonForConditionalGeneration``, else None."""
    config_file = Path(folder) / "config.json"
    try:
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(config, dict) or config.get("model_type") != "chameleon":
        return None
    archs = [str(a) for a in config.get("architectures") or []]
    if "z_loss_weight" in config or any(a.startswith("ChameleonXLLMX") for a in archs):
        return "lumina"
    return "anole" if "ChameleonForConditionalGeneration" in archs else None


def is_lumina_folder(folder: str | Path) -> bool:
    """Whether ``folder`` holds a Lumina-mGPT checkpoint (``save_pretrained`` of its Chameleon model)."""
    return _chameleon_kind(folder) == "lumina"


def is_anole_folder(folder: str | Path) -> bool:
    """Whether ``folder`` holds ``transformers``' ``ChameleonForConditionalGeneration`` (Anole's converted
    checkpoint, or Chameleon's)."""
    return _chameleon_kind(folder) == "anole"


def weight_files(folder: Path, hint: str = LUMINA_HINT) -> list[Path]:
    """The safetensors files of a ``save_pretrained`` folder: ``model.safetensors``, or the shards its
    ``model.safetensors.index.json`` names."""
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if not index.is_file():
        raise ValueError(f"{folder} has no weights (model.safetensors or model.safetensors.index.json); "
                         + hint.format(folder=folder))
    weight_map = _read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index} has no weight_map")
    files = [folder / name for name in sorted(set(weight_map.values()))]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ValueError(f"{index} names shards missing from {folder}: {', '.join(missing[:4])}")
    return files


def check_lumina_folder(folder: str | Path) -> Path:
    """``folder`` as a Path, or a one-line ValueError naming what is missing (and where it goes): a Lumina-mGPT
    ``config.json``, its weights, its ``tokenizer.json``, and Chameleon's tokenizer files in
    ``ckpts/chameleon/tokenizer/``."""
    return _check_folder(folder, "lumina")


def check_anole_folder(folder: str | Path) -> Path:
    """:func:`check_lumina_folder` for a ``transformers`` Chameleon folder (Anole)."""
    return _check_folder(folder, "anole")


def _check_folder(folder: str | Path, kind: str) -> Path:
    path = Path(folder)
    name, hint, arch = FAMILIES[kind]
    if not path.is_dir():
        raise ValueError(f"{name} folder {str(path)!r} does not exist; " + hint.format(folder=path))
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{str(path)!r} is not a {name} checkpoint (no config.json); " + hint.format(folder=path))
    config = _read_json(config_file)
    if _chameleon_kind(path) != kind:
        raise ValueError(f"{config_file} describes a {config.get('model_type')!r} model "
                         f"({', '.join(map(str, config.get('architectures') or [])) or 'no architecture'}), not "
                         f"{name} (model_type 'chameleon', architecture {arch})")
    weight_files(path, hint)
    if not (path / "tokenizer.json").is_file():
        raise ValueError(f"{path} has no tokenizer.json: {name}'s prompts use the model folder's own tokenizer "
                         f"(saved with the checkpoint)")
    tok_dir = path / TOKENIZER_DIR
    missing = [f for f in TOKENIZER_FILES if not (tok_dir / f).is_file()
               and not (f == "vqgan.ckpt" and (tok_dir / "vqgan.safetensors").is_file())]
    if missing:
        raise ValueError(f"missing {', '.join(missing)} in {tok_dir}: put Chameleon's tokenizer files there (Lumina-"
                         f"mGPT's README places them in lumina_mgpt/ckpts/chameleon/tokenizer/)")
    return path


# --------------------------------------------------------------------------------------------------------------
# the language model


def image_token_ids(text_tokenizer: str | Path, vocabulary_map: dict[str, int] | None,
                    codebook_size: int) -> list[int]:
    """The text id of each VQ code (Chameleon's ``img2bpe``): the ``IMGIMG*`` names of ``text_tokenizer.json``,
    whose letters ``A``..``J`` spell the code's digits (``IMGIMG`` + digits + one final character). Every code of
    the codebook must have exactly one name, and ``config.json``'s ``vocabulary_map`` (when present) must give the
    same ids."""
    path = Path(text_tokenizer)
    vocab = _read_json(path).get("model", {}).get("vocab")
    if not isinstance(vocab, dict):
        raise ValueError(f"{path} has no model.vocab (the BPE vocabulary with the IMGIMG image tokens)")
    digits = {chr(ord("A") + i): str(i) for i in range(10)}
    code_ids: dict[int, int] = {}
    for name, token in vocab.items():
        if name.startswith("IMGIMG"):
            spelled = "".join(digits.get(c, c) for c in name[len("IMGIMG"):-1])
            if not spelled.isdigit() or int(spelled) in code_ids:
                raise ValueError(f"{path}: image token {name!r} does not name a code of its own")
            code_ids[int(spelled)] = int(token)
    if sorted(code_ids) != list(range(codebook_size)):
        raise ValueError(f"{path} names {len(code_ids)} image tokens (IMGIMG*), but the VQGAN has {codebook_size} "
                         f"codes: each code needs one")
    if vocabulary_map:
        wrong = [name for name, token in vocab.items() if name.startswith("IMGIMG")
                 and vocabulary_map.get(name) != token]
        if wrong:
            raise ValueError(f"config.json's vocabulary_map gives {wrong[0]!r} id {vocabulary_map.get(wrong[0])}, "
                             f"{path} gives {vocab[wrong[0]]} ({len(wrong)} image tokens differ)")
    return [code_ids[c] for c in range(codebook_size)]


def _rope_theta(hf: dict) -> float:
    """The rotary base of a Chameleon config: ``rope_theta`` (Lumina, ``transformers`` 4), or inside
    ``rope_parameters`` (``transformers`` 5); Chameleon's 10000 when unset."""
    return float(hf.get("rope_theta") or (hf.get("rope_parameters") or {}).get("rope_theta") or 10000.0)


def _check_chameleon_config(hf: dict, where: Path, lumina: bool) -> None:
    """A one-line ValueError for a config.json that is not the Llama-with-qk-norm that Lumina-mGPT and Anole run
    as (for Lumina, also one whose own forward masks the image tokens)."""
    problems = []
    if hf.get("swin_norm", False):
        problems.append("swin_norm (post-norm blocks) is not supported")
    if lumina and hf.get("mask_image_logits", True):
        problems.append("mask_image_logits is true (or unset, Lumina's default): Lumina's own forward then masks every "
                        "image token, so it cannot generate images")
    if hf.get("attention_bias", False) or hf.get("mlp_bias", False):
        problems.append("attention or MLP biases are not supported")
    if hf.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {hf.get('hidden_act')!r} is not silu")
    rope_type = (hf.get("rope_parameters") or {}).get("rope_type", "default")
    if hf.get("rope_scaling") is not None or rope_type != "default":
        problems.append(f"rotary scaling {hf.get('rope_scaling') or rope_type!r} is not supported")
    if problems:
        raise ValueError(f"{where}: " + "; ".join(problems))


def lumina_config(hf: dict, vocab: dict[str, int], code_ids: Sequence[int], image_size: int = IMAGE_SIZE,
                  vq_factor: int = 16, max_prompt_tokens: int | None = None,
                  where: Path = Path("config.json")) -> MLLMConfig:
    """The :class:`MLLMConfig` of a Lumina-mGPT ``config.json`` (``hf``) for square images of ``image_size`` px:
    ``vocab`` is the text tokenizer's (the fixed tokens by name), ``code_ids`` the text id of each VQ code.
    ``max_prompt_tokens`` (image header included) defaults to :data:`MAX_PROMPT_TOKENS`, or what the model's
    ``max_position_embeddings`` leave beside the image (its codes, a row end after each row, ``<eoss>``)."""
    _check_chameleon_config(hf, where, lumina=True)
    if image_size % PATCH or image_size <= 0:
        raise ValueError(f"image_size {image_size} is not a positive multiple of {PATCH} (Lumina-mGPT's size tokens "
                         f"count {PATCH}-px steps)")
    if vq_factor != PATCH // 2:
        raise ValueError(f"the VQGAN maps {vq_factor} px to a code; Lumina-mGPT's layout needs {PATCH // 2}")
    names = [IMAGE_START, size_token(image_size), NEW_LINE, IMAGE_END]
    missing = [n for n in names if n not in vocab]
    if missing:
        raise ValueError(f"the model's tokenizer has no {', '.join(missing)} (needed for {image_size}-px images)")
    head = (vocab[IMAGE_START], vocab[size_token(image_size)], vocab[size_token(image_size)])
    return _mllm_config(hf, code_ids, image_size // vq_factor, (vocab[NEW_LINE],), head, (vocab[IMAGE_END],),
                        max_prompt_tokens, CFG_SCALE, TOP_K, where)


def anole_config(hf: dict, vocab: dict[str, int], code_ids: Sequence[int], image_size: int = ANOLE_IMAGE_SIZE,
                 vq_factor: int = 16, max_prompt_tokens: int | None = None,
                 where: Path = Path("config.json")) -> MLLMConfig:
    """The :class:`MLLMConfig` of a ``transformers`` Chameleon ``config.json`` generating as Anole does
    (``chameleon/inference/chameleon.py``'s ``ImageDecoder``): ``<racm3:break>`` ends the prompt, then
    ``(image_size / 16)^2`` codes with no row ends (32 x 32 at Chameleon's 512 px), then ``<eoss>``; guidance 3."""
    _check_chameleon_config(hf, where, lumina=False)
    if image_size % vq_factor or image_size <= 0:
        raise ValueError(f"image_size {image_size} is not a positive multiple of the VQGAN's {vq_factor} px a code")
    missing = [n for n in (IMAGE_START, IMAGE_END) if n not in vocab]
    if missing:
        raise ValueError(f"the model's tokenizer has no {', '.join(missing)}")
    return _mllm_config(hf, code_ids, image_size // vq_factor, (), (vocab[IMAGE_START],), (vocab[IMAGE_END],),
                        max_prompt_tokens, ANOLE_CFG_SCALE, None, where)


def _mllm_config(hf: dict, code_ids: Sequence[int], side: int, row_end: tuple[int, ...], head: tuple[int, ...],
                 tail: tuple[int, ...], max_prompt_tokens: int | None, cfg_scale: float, top_k: int | None,
                 where: Path) -> MLLMConfig:
    """The :class:`MLLMConfig` of a Chameleon ``config.json`` with a ``side x side`` layout; ``max_prompt_tokens``
    None: :data:`MAX_PROMPT_TOKENS`, or what ``max_position_embeddings`` leave beside the image."""
    pad, positions = hf.get("pad_token_id"), hf.get("max_position_embeddings", 4096)
    pad = 0 if pad is None else pad  # any id: padding is masked out of attention
    if max_prompt_tokens is None:  # a context too short for a prompt keeps the default, which MLLMConfig refuses
        room = positions - side * (side + len(row_end)) - len(tail) if isinstance(positions, int) else 0
        max_prompt_tokens = min(MAX_PROMPT_TOKENS, room) if room >= 16 else MAX_PROMPT_TOKENS
    try:
        return MLLMConfig(
            vocab_size=len(code_ids), text_vocab_size=hf["vocab_size"], dim=hf["hidden_size"],
            n_layer=hf["num_hidden_layers"], n_head=hf["num_attention_heads"],
            n_kv_head=hf.get("num_key_value_heads") or hf["num_attention_heads"],
            norm_eps=float(hf.get("rms_norm_eps", 1e-5)), rope_base=_rope_theta(hf),
            intermediate_size=hf["intermediate_size"], qk_norm=True, image_rows=side, image_cols=side,
            row_end=row_end, head_tokens=head, tail=tail, max_positions=positions,
            max_prompt_tokens=max_prompt_tokens, pad_token_id=pad, cfg_scale=cfg_scale, top_k=top_k)
    except KeyError as e:
        raise ValueError(f"{where} has no {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def checkpoint_shapes(hf: dict, qk_rows: dict[str, int]) -> dict[str, tuple[int, ...]]:
    """The tensor shapes of a Lumina-mGPT checkpoint (``transformers``' Chameleon names) that ``config.json``
    describes, the vqmodel left out; ``qk_rows``: the rows of the q and k norms the file holds (accepted layouts)."""
    d, v, inter = hf["hidden_size"], hf["vocab_size"], hf["intermediate_size"]
    nh = hf["num_attention_heads"]
    hd, nkv = d // nh, hf.get("num_key_value_heads") or nh
    shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,), "lm_head.weight": (v, d)}
    for i in range(hf["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (nh * hd, d), p + "self_attn.k_proj.weight": (nkv * hd, d),
                       p + "self_attn.v_proj.weight": (nkv * hd, d), p + "self_attn.o_proj.weight": (d, nh * hd),
                       p + "mlp.gate_proj.weight": (inter, d), p + "mlp.up_proj.weight": (inter, d),
                       p + "mlp.down_proj.weight": (d, inter), p + "input_layernorm.weight": (d,),
                       p + "post_attention_layernorm.weight": (d,)})
        for norm in ("q_norm", "k_norm"):
            for part in ("weight", "bias"):
                shapes[f"{p}self_attn.{norm}.{part}"] = (qk_rows[norm], hd)
    return shapes


def _qk_rows(hf: dict, shapes: dict[str, tuple[int, ...]], where: str) -> dict[str, int]:
    """The rows of the q and k norms in the file: ``model_parallel_size`` (Lumina's layout) or one per head
    (``transformers``'), the same in every layer; anything else is a one-line error."""
    nh = hf["num_attention_heads"]
    nkv, hd, mp = hf.get("num_key_value_heads") or nh, hf["hidden_size"] // nh, hf.get("model_parallel_size", 1)
    if not isinstance(mp, int) or mp < 1 or nh % mp or nkv % mp:
        raise ValueError(f"{where}: model_parallel_size {mp!r} does not divide the {nh} query and {nkv} key heads")
    rows = {}
    for norm, heads in (("q_norm", nh), ("k_norm", nkv)):
        found = {shapes[k] for k in shapes if k.endswith(f".self_attn.{norm}.weight")}
        if len(found) != 1 or next(iter(found)) not in ((mp, hd), (heads, hd)):
            raise ValueError(f"{where}: {norm} weights of shape {sorted(found)}; a checkpoint of {heads} heads of "
                             f"{hd} with model_parallel_size {mp} has ({mp}, {hd}) (Lumina) or ({heads}, {hd})")
        rows[norm] = next(iter(found))[0]
    return rows


def read_chameleon_weights(files: Sequence[Path], hf: dict, config: MLLMConfig, code_ids: Sequence[int],
                        dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """:class:`LayoutLM`'s state dict from Lumina-mGPT's safetensors ``files``: the header shapes are checked against
    ``hf`` (``config.json``) first, then each tensor is read once and mapped (q/k rows from Llama's halves to vgen's
    interleaved pairs, the qk norms expanded per head with their columns in the same order, the head cut to the
    image-token rows of ``lm_head``); ``model.vqmodel.*`` is skipped."""
    where = f"{files[0].parent / 'config.json'}"
    shapes, owner = {}, {}
    for f in files:
        for key, shape in safetensors_shapes(f).items():
            if not key.startswith("model.vqmodel."):
                shapes[key], owner[key] = shape, f
    try:
        problem = describe_mismatch(checkpoint_shapes(hf, _qk_rows(hf, shapes, where)), shapes)
    except KeyError as e:
        raise ValueError(f"{where} has no {e.args[0]!r}") from None
    if problem:
        names = ", ".join(sorted({f.name for f in files}))
        raise CheckpointError(f"{names} does not match {where}: {problem}")

    handles: dict[Path, Any] = {}

    def get(key: str) -> torch.Tensor:
        f = owner[key]
        try:
            if f not in handles:
                handles[f] = safe_open(str(f), framework="pt")
            return handles[f].get_tensor(key).to(dtype)
        except (SafetensorError, OSError):
            raise CheckpointError(f"cannot read {key} from {f}: the file is corrupt") from None

    def norm(key: str, heads: int) -> torch.Tensor:
        w = get(key)
        w = w.repeat_interleave(heads // w.shape[0], dim=0)
        return permute_rotary(w.reshape(-1, 1), heads).view_as(w)

    codes = torch.tensor(list(code_ids), dtype=torch.long)
    nh, nkv = config.n_head, config.kv_heads
    out = {"text_embeddings.weight": get("model.embed_tokens.weight"), "code_ids": codes,
           "norm.weight": get("model.norm.weight"), "head.weight": get("lm_head.weight")[codes].contiguous()}
    for i in range(config.n_layer):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        out.update(llama_block_weights(get, src, dst, nh, nkv))
        for name, heads in (("q_norm", nh), ("k_norm", nkv)):
            for part in ("weight", "bias"):
                out[f"{dst}attention.{name}.{part}"] = norm(f"{src}self_attn.{name}.{part}", heads)
    return out


# --------------------------------------------------------------------------------------------------------------
# prompts and the loader


def lumina_prompt(caption: str, image_size: int) -> str:
    """The text of Lumina-mGPT's image-generation turn (its conversation template closes a human turn with
    ``<reserved08706>``; BOS is added as an id, not as text)."""
    return PROMPT_TEMPLATE.format(w=image_size, h=image_size, caption=caption)


def _bos(tokenizer: Any) -> int:
    """The BOS id as ``xllmx``'s Tokenizer takes it: the tokenizer's ``bos_token_id``, else its EOS."""
    return tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id


def _check_prompts(prompts: Sequence[str]) -> None:
    if isinstance(prompts, str) or not len(prompts):
        raise ValueError("give a non-empty list of prompts")
    for i, p in enumerate(prompts):
        if not isinstance(p, str) or not p.strip():
            raise ValueError(f"prompt {i} is empty or not a string")


def _left_padded(rows: list[list[int]], config: MLLMConfig, family: str) -> PrefixCondition:
    """Token rows left-padded to one length (pad id, masked), or a one-line ValueError for a row longer than
    ``config.max_prompt_tokens``."""
    longest = max(range(len(rows)), key=lambda i: len(rows[i]))
    length = len(rows[longest])
    if length > config.max_prompt_tokens:
        raise ValueError(f"prompt {longest} takes {length} tokens with {family}'s template and image header; this "
                         f"model takes at most {config.max_prompt_tokens} (max_prompt_tokens): shorten it")
    ids = torch.full((len(rows), length), config.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(rows), length, dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, length - len(row):] = torch.tensor(row)
        mask[i, length - len(row):] = True
    return PrefixCondition(ids, mask)


def lumina_condition(tokenizer: Any, prompts: Sequence[str], config: MLLMConfig, image_size: int) -> PrefixCondition:
    """Each prompt as Lumina's inference solver feeds it, ``[BOS] + encode(lumina_prompt(p))`` (no special tokens
    added by the tokenizer), then the image header ``config.head_tokens``; rows left-padded to one length. No null
    prompt: the backbone's null condition is the header alone, Lumina's unconditional context."""
    _check_prompts(prompts)
    head = list(config.head_tokens)
    rows = [[_bos(tokenizer), *tokenizer.encode(lumina_prompt(p, image_size), add_special_tokens=False), *head]
            for p in prompts]
    return _left_padded(rows, config, "Lumina-mGPT")


def anole_condition(tokenizer: Any, prompts: Sequence[str], config: MLLMConfig) -> PrefixCondition:
    """Each prompt as Anole's ``text2image.py`` feeds it: ``[BOS] + encode(p) + [<reserved08706>]`` (the end of the
    user's turn), then ``<racm3:break>``, left-padded. Its guidance mixes three rows, ``u + 1.2 (i - u) + 3 (c -
    i)``, where the image-conditioned row ``i`` keeps the prompt's BOS, image tokens and image markers: for a text
    prompt that is ``[BOS, <racm3:break>]``, the unconditional row ``u`` itself, so the mix is ``u + 3 (c - u)``,
    vgen's guidance against the null prompt ``[BOS, <racm3:break>]`` carried here."""
    _check_prompts(prompts)
    vocab, head = tokenizer.get_vocab(), list(config.head_tokens)
    if END_OF_TURN not in vocab:
        raise ValueError(f"the model's tokenizer has no {END_OF_TURN} (Chameleon's end of turn)")
    bos = _bos(tokenizer)
    rows = [[bos, *tokenizer.encode(p, add_special_tokens=False), vocab[END_OF_TURN], *head] for p in prompts]
    null = torch.tensor([[bos, *head]] * len(rows))
    cond = _left_padded(rows, config, "Anole")
    return PrefixCondition(cond.values, cond.mask, null=PrefixCondition(null, torch.ones_like(null, dtype=torch.bool)))


@dataclass
class LoadedLumina:
    """What :func:`load_lumina` returns: the backbone, Chameleon's VQGAN, the text tokenizer, the image size, and
    the family's sampling defaults (``defaults``: options of :class:`~vgen.samplers.SamplingParams`)."""

    model: LayoutLM
    tokenizer: VQModel
    text_tokenizer: Any
    image_size: int

    @property
    def defaults(self) -> dict[str, float | int]:
        """Lumina's inference solver: guidance 3 and top-k 2000 over the image tokens, temperature 1."""
        return {"cfg_scale": self.model.config.cfg_scale, "top_k": self.model.config.top_k}

    def condition(self, prompts: Sequence[str]) -> PrefixCondition:
        """:func:`lumina_condition` of ``prompts`` on the model's device."""
        cond = lumina_condition(self.text_tokenizer, prompts, self.model.config, self.image_size)
        return cond.to(self.model.head.weight.device)


class LoadedAnole(LoadedLumina):
    """What :func:`load_anole` returns (the fields of :class:`LoadedLumina`)."""

    @property
    def defaults(self) -> dict[str, float | int]:
        """Anole's ``Options.Image``: guidance 3 (text; 1.2 on an image that a text prompt does not have),
        temperature 0.7, top-p 0.9, no top-k."""
        return {"cfg_scale": self.model.config.cfg_scale, "temperature": ANOLE_TEMPERATURE, "top_p": ANOLE_TOP_P}

    def condition(self, prompts: Sequence[str]) -> PrefixCondition:
        """:func:`anole_condition` of ``prompts`` on the model's device."""
        return anole_condition(self.text_tokenizer, prompts, self.model.config).to(self.model.head.weight.device)


def load_lumina(folder: str | Path, dtype: torch.dtype | None = None, device: torch.device | str | None = None,
                image_size: int = IMAGE_SIZE, max_prompt_tokens: int | None = None) -> LoadedLumina:
    """A Lumina-mGPT folder (see the module docstring), read offline, for square images of ``image_size`` px: the
    backbone (``dtype``, float32 by default), the VQGAN (float32, as Lumina runs it) and the text tokenizer.
    ``max_prompt_tokens``: as :func:`lumina_config`."""
    path = check_lumina_folder(folder)
    model, vq, text_tokenizer = _load(path, dtype, device, lambda hf, vocab, code_ids, factor: lumina_config(
        hf, vocab, code_ids, image_size, factor, max_prompt_tokens, path / "config.json"))
    return LoadedLumina(model, vq, text_tokenizer, image_size)


def load_anole(folder: str | Path, dtype: torch.dtype | None = None, device: torch.device | str | None = None,
               image_size: int = ANOLE_IMAGE_SIZE, max_prompt_tokens: int | None = None) -> LoadedAnole:
    """A ``transformers`` Chameleon folder (``save_pretrained`` of ``ChameleonForConditionalGeneration`` with its
    tokenizer; Chameleon's VQGAN and ``text_tokenizer.json`` in ``ckpts/chameleon/tokenizer/``, which
    ``transformers``' folder lacks: its VQ model has no decoder) generating as Anole does (:func:`anole_config`).
    ``transformers`` itself cannot: its forward sets every image-token logit to the lowest value. vgen reads the
    weights directly, so the image rows of ``lm_head`` are used as they are; whether they draw images is the
    checkpoint's (Anole's do; Chameleon's release was tuned not to generate images)."""
    path = check_anole_folder(folder)
    model, vq, text_tokenizer = _load(path, dtype, device, lambda hf, vocab, code_ids, factor: anole_config(
        hf, vocab, code_ids, image_size, factor, max_prompt_tokens, path / "config.json"))
    return LoadedAnole(model, vq, text_tokenizer, image_size)


def _load(path: Path, dtype: torch.dtype | None, device: torch.device | str | None,
          make_config: Any) -> tuple[LayoutLM, VQModel, Any]:
    """The backbone, VQGAN and text tokenizer of a checked Chameleon folder; ``make_config(hf, vocab, code_ids,
    vq_factor)`` gives the backbone's :class:`MLLMConfig`."""
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise ImportError(f"Chameleon models need transformers (pip install -e \".[t2i]\"): {e}") from None
    hf = _read_json(path / "config.json")
    tok_dir = path / TOKENIZER_DIR
    vq = load_vqgan(tok_dir)
    code_ids = image_token_ids(tok_dir / "text_tokenizer.json", hf.get("vocabulary_map"), vq.codebook_size)
    text_tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    config = make_config(hf, text_tokenizer.get_vocab(), code_ids, vq.downsample_factor)
    state = read_chameleon_weights(weight_files(path), hf, config, code_ids, dtype or torch.float32)
    with torch.device("meta"):
        model = LayoutLM(config)
    model.load_state_dict(state, strict=True, assign=True)
    model = model.eval()
    if device is not None:
        model, vq = model.to(device), vq.to(device)
    return model, vq, text_tokenizer
