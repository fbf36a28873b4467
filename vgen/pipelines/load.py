"""Loading pipelines: an embedded default by name, a pipeline folder written by ``save_pretrained`` (its content
picks the image, video or streaming pipeline), or LlamaGen's released checkpoint files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from vgen.hub import (
    ASSETS,
    PIPELINE_CONFIG,
    CheckpointError,
    from_pretrained,
    load_weights,
    read_torch_checkpoint,
)
from vgen.models.janus import is_janus_folder, load_janus
from vgen.models.llamagen import (
    LLAMAGEN_T2I_CHECKPOINTS,
    GPTConfig,
    LlamaGenGPT,
    llamagen_config_for,
    llamagen_t2i_config_for,
)
from vgen.models.text_encoder import T5TextEncoder, check_caption_dim
from vgen.pipelines.image import ImagePipeline, PipelineInfo
from vgen.pipelines.stream import MODEL_FOLDER, TOKENIZER_FOLDER, StreamPipeline
from vgen.pipelines.video import VideoPipeline
from vgen.tokenizers.vq import VQ_CONFIGS, VQConfig, VQModel


def available_models() -> list[str]:
    """Names of the embedded default pipelines shipped inside the package."""
    return sorted(p.name for p in ASSETS.iterdir() if (p / PIPELINE_CONFIG).is_file()) if ASSETS.is_dir() else []


def pipeline_folder(name_or_path: str | Path) -> Path:
    """The folder of an embedded default by name, or ``name_or_path`` itself when it is a pipeline folder."""
    path = Path(name_or_path)
    if (path / PIPELINE_CONFIG).is_file():
        return path
    if str(name_or_path) in available_models():
        return ASSETS / str(name_or_path)
    if path.exists():
        raise CheckpointError(f"{path} is not a vgen pipeline folder (no {PIPELINE_CONFIG})")
    raise ValueError(f"unknown model {str(name_or_path)!r}; embedded models: {available_models()}, "
                     f"or pass a folder written by save_pretrained")


def load(name_or_path: str | Path = "shapes-c2i", device: str | torch.device = "cpu",
         dtype: torch.dtype | None = None) -> ImagePipeline | VideoPipeline | StreamPipeline:
    """An embedded default by name, or a pipeline folder written by ``save_pretrained``: a
    :class:`StreamPipeline` for a block-diffusion model, a :class:`VideoPipeline` for a backbone over a
    frames x rows x columns grid, an :class:`ImagePipeline` otherwise; a Janus-Pro folder in ``transformers``'
    layout (:func:`load_janus_pipeline`)."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise ValueError(f"load takes an embedded model's name or a pipeline folder, got {name_or_path!r:.60}; "
                         f"embedded models: {available_models()}")
    if is_janus_folder(name_or_path):
        return load_janus_pipeline(name_or_path, device, dtype)
    path = pipeline_folder(name_or_path)
    try:
        meta = json.loads((path / PIPELINE_CONFIG).read_text())
        info = PipelineInfo(**meta)
    except (json.JSONDecodeError, TypeError) as e:
        raise CheckpointError(f"bad {path / PIPELINE_CONFIG}: {e}") from None
    if (path / MODEL_FOLDER).is_dir():  # a streaming block-diffusion pipeline: no sampler, a tokenizer if latent
        kl = from_pretrained(path / TOKENIZER_FOLDER) if (path / TOKENIZER_FOLDER).is_dir() else None
        return StreamPipeline(from_pretrained(path / MODEL_FOLDER), info, kl).to(device, dtype)
    head = from_pretrained(path / "drafter") if (path / "drafter").is_dir() else None
    tokenizer_dir = path / "kl" if (path / "kl").is_dir() else path / "vq"
    model = from_pretrained(path / "gpt")
    if len(model.grid) == 3:  # frames x rows x columns
        return VideoPipeline(model, from_pretrained(tokenizer_dir), info, head).to(device, dtype)
    pipe = ImagePipeline(model, from_pretrained(tokenizer_dir), info, head)
    return pipe.to(device, dtype)


def load_llamagen(gpt_ckpt: str | Path, vq_ckpt: str | Path, gpt_model: str = "GPT-B", image_size: int = 256,
                  vq_model: str = "VQ-16", codebook_size: int = 16384, codebook_embed_dim: int = 8,
                  num_classes: int = 1000, device: str | torch.device = "cpu",
                  dtype: torch.dtype | None = None) -> ImagePipeline:
    """A pipeline over LlamaGen's released class-conditional ``.pt`` checkpoints, used unchanged.

    Defaults follow LlamaGen's ``sample_c2i.py`` (CFG 4.0, top-k 2000) for the sampling settings.
    """
    vq_cfg = _llamagen_vq_config(vq_model, codebook_size, codebook_embed_dim)
    gpt_cfg = llamagen_config_for(gpt_model, image_size, vq_cfg.downsample_factor, codebook_size, num_classes)
    tokenizer = _llamagen_vq(vq_ckpt, vq_cfg)
    model = _llamagen_gpt(gpt_ckpt, gpt_cfg, f"{gpt_model}, image size {image_size}")
    info = PipelineInfo(name=Path(gpt_ckpt).stem, image_size=image_size,
                        defaults={"cfg_scale": 4.0, "top_k": 2000})
    return ImagePipeline(model, tokenizer, info).to(device, dtype)


def load_llamagen_t2i(gpt_ckpt: str | Path, vq_ckpt: str | Path, image_size: int | None = None,
                      gpt_model: str = "GPT-XL", vq_model: str = "VQ-16", codebook_size: int = 16384,
                      codebook_embed_dim: int = 8, caption_dim: int = 2048, t5_path: str | Path | None = None,
                      device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> ImagePipeline:
    """A pipeline over LlamaGen's released text-to-image ``.pt`` checkpoints (``t2i_XL_stage1_256.pt`` or
    ``t2i_XL_stage2_512.pt`` with ``vq_ds16_t2i.pt``), used unchanged. With ``t5_path`` (a local FLAN-T5-XL
    folder) it takes ``prompt=``; it always takes T5 features as ``prompt_embeds``.

    ``image_size`` defaults to the released checkpoint's (by its file name). Defaults follow LlamaGen's
    ``sample_t2i.py`` (CFG 7.5, top-k 1000) for the sampling settings.
    """
    if image_size is None:
        if Path(gpt_ckpt).name not in LLAMAGEN_T2I_CHECKPOINTS:
            raise ValueError(f"cannot tell the image size of {Path(gpt_ckpt).name}: pass image_size (LlamaGen's "
                             f"releases: {LLAMAGEN_T2I_CHECKPOINTS})")
        image_size = LLAMAGEN_T2I_CHECKPOINTS[Path(gpt_ckpt).name]
    vq_cfg = _llamagen_vq_config(vq_model, codebook_size, codebook_embed_dim)
    gpt_cfg = llamagen_t2i_config_for(image_size, gpt_model, vq_cfg.downsample_factor, codebook_size, caption_dim)
    encoder = None
    if t5_path is not None:  # before the checkpoints are read, so that a wrong folder fails at once
        encoder = T5TextEncoder.from_pretrained(t5_path, max_length=gpt_cfg.cls_token_num, device=device)
        check_caption_dim(encoder.caption_dim, gpt_cfg.caption_dim, f"the T5 encoder at {t5_path}")
    tokenizer = _llamagen_vq(vq_ckpt, vq_cfg)
    model = _llamagen_gpt(gpt_ckpt, gpt_cfg, f"{gpt_model} t2i, image size {image_size}")
    info = PipelineInfo(name=Path(gpt_ckpt).stem, image_size=image_size,
                        defaults={"cfg_scale": 7.5, "top_k": 1000})
    return ImagePipeline(model, tokenizer, info, prompt_encoder=encoder and encoder.condition).to(device, dtype)


def load_janus_pipeline(folder: str | Path, device: str | torch.device = "cpu",
                        dtype: torch.dtype | None = None) -> ImagePipeline:
    """A Janus-Pro checkpoint in ``transformers``' layout (model and processor saved in one folder) as a
    text-to-image pipeline: ``pipe(prompt=[...])``, CFG 5 as ``generate(generation_mode="image")`` uses."""
    loaded = load_janus(folder, device=device)
    model, tokenizer = loaded.model, loaded.tokenizer
    info = PipelineInfo(name=Path(folder).name, image_size=model.grid[0] * tokenizer.downsample_factor,
                        defaults={"cfg_scale": model.config.cfg_scale})
    return ImagePipeline(model, tokenizer, info, prompt_encoder=loaded.condition).to(device, dtype)


def _llamagen_vq_config(vq_model: str, codebook_size: int, codebook_embed_dim: int) -> VQConfig:
    """LlamaGen's VQ architecture ``vq_model`` with the given codebook: checked before any file is read."""
    if vq_model not in VQ_CONFIGS:
        raise ValueError(f"unknown VQ model {vq_model!r}; expected one of {list(VQ_CONFIGS)}")
    vq_cfg = VQ_CONFIGS[vq_model]
    return type(vq_cfg).from_dict({**vq_cfg.to_dict(), "codebook_size": codebook_size,
                                   "codebook_embed_dim": codebook_embed_dim})


def _llamagen_vq(vq_ckpt: str | Path, vq_cfg: VQConfig) -> VQModel:
    tokenizer = VQModel(vq_cfg)
    load_weights(tokenizer, read_torch_checkpoint(vq_ckpt, "VQ"), source=f"VQ checkpoint {vq_ckpt}")
    return tokenizer


def _llamagen_gpt(gpt_ckpt: str | Path, config: GPTConfig, what: str) -> LlamaGenGPT:
    state = read_torch_checkpoint(gpt_ckpt, "GPT")
    with torch.device("meta"):  # no throw-away random init of a possibly multi-GB model
        model = LlamaGenGPT(config)
    model = model.to_empty(device="cpu")
    load_weights(model, state, source=f"GPT checkpoint {gpt_ckpt} ({what})")
    return model
