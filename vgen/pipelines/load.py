"""Loading pipelines: an embedded default by name, a pipeline folder written by ``save_pretrained`` (its content
picks the image, video or streaming pipeline), LlamaGen's released checkpoint files (as files, or as a folder
described by :data:`LLAMAGEN_T2I_CONFIG`), or a Janus-Pro folder."""

from __future__ import annotations

import json
import os
import typing
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

import torch

from vgen.hub import (
    ASSETS,
    MAX_PARAMS,
    PIPELINE_CONFIG,
    CheckpointError,
    from_pretrained,
    load_weights,
    local_path,
    read_torch_checkpoint,
)
from vgen.models.chameleon import LoadedLumina, is_anole_folder, is_lumina_folder, load_anole, load_lumina
from vgen.models.emu3 import IMAGE_AREA as EMU3_IMAGE_AREA
from vgen.models.emu3 import SPATIAL_FACTOR as EMU3_PIXELS_PER_CODE
from vgen.models.emu3 import is_emu3_folder, load_emu3
from vgen.models.janus import is_janus_folder, load_janus
from vgen.models.llamagen import (
    LLAMAGEN_T2I_CHECKPOINTS,
    GPTConfig,
    LlamaGenGPT,
    llamagen_checkpoint_kind,
    llamagen_config_for,
    llamagen_t2i_config_for,
)
from vgen.models.text_encoder import T5TextEncoder, check_caption_dim, resolve_t5_folder
from vgen.pipelines.image import TEXT_ENCODER_FOLDER, ImagePipeline, PipelineInfo
from vgen.pipelines.inputs import check_device, check_dtype
from vgen.pipelines.stream import MODEL_FOLDER, TOKENIZER_FOLDER, StreamPipeline
from vgen.pipelines.video import VideoPipeline
from vgen.samplers import SamplingParams
from vgen.samplers.options import Option, short_repr
from vgen.threads import set_threads
from vgen.tokenizers.vq import VQ_CONFIGS, VQConfig, VQModel

LLAMAGEN_T2I_CONFIG = "llamagen_t2i.json"
"""The file that makes a folder a LlamaGen-T2I folder (:func:`write_llamagen_t2i_config`): the released files it
loads and how (:class:`LlamaGenT2IConfig`)."""
LLAMAGEN_T2I_DEFAULTS = {"cfg_scale": 7.5, "top_k": 1000}
"""LlamaGen's ``sample_t2i.py`` sampling settings: a LlamaGen-T2I pipeline's recommended defaults."""


MAX_PARAMS_OPTION = Option("the most values a model folder may hold", at_least=1)


DEFAULT_MODEL = "shapes-c2i"  # the embedded model of `vgen sample` and `vgen.load()`
DEFAULT_TEXT_MODEL = "shapes-t2i"  # the embedded model prompts go to when no model is named

def available_models() -> list[str]:
    """Names of the embedded default pipelines shipped inside the package."""
    return sorted(p.name for p in ASSETS.iterdir() if (p / PIPELINE_CONFIG).is_file()) if ASSETS.is_dir() else []


def is_model_folder(folder: str | Path) -> bool:
    """Whether :func:`load` reads ``folder`` as a model folder (an embedded name is not one): a pipeline folder
    written by ``save_pretrained``, a LlamaGen-T2I folder, or a released checkpoint folder of a family it reads in
    its own layout (:data:`RELEASED_FOLDERS`)."""
    path = Path(folder)
    return ((path / PIPELINE_CONFIG).is_file() or (path / LLAMAGEN_T2I_CONFIG).is_file()
            or released_family(path) is not None)


def pipeline_folder(name_or_path: str | Path) -> Path:
    """The folder of an embedded default by name, or ``name_or_path`` itself when it is a pipeline folder."""
    path = Path(name_or_path)
    if (path / PIPELINE_CONFIG).is_file():
        return path
    if str(name_or_path) in available_models():
        return ASSETS / str(name_or_path)
    if path.exists():
        raise CheckpointError(f"{path} is not a vgen pipeline folder (no {PIPELINE_CONFIG}), nor a LlamaGen-T2I "
                              f"one (no {LLAMAGEN_T2I_CONFIG}) or a released {', '.join(RELEASED_FOLDERS)} one")
    raise ValueError(f"unknown model {short_repr(str(name_or_path))}; embedded models: {available_models()}, "
                     f"or pass a folder written by save_pretrained")


def load(name_or_path: str | Path = DEFAULT_MODEL, device: str | torch.device = "cpu",
         dtype: torch.dtype | None = None, max_params: int = MAX_PARAMS,
         threads: int | str | None = None) -> ImagePipeline | VideoPipeline | StreamPipeline:
    """An embedded default by name, or a pipeline folder written by ``save_pretrained``: a
    :class:`StreamPipeline` for a block-diffusion model, a :class:`VideoPipeline` for a backbone over a
    frames x rows x columns grid, an :class:`ImagePipeline` otherwise; a released checkpoint folder of a family of
    :data:`RELEASED_FOLDERS` (Janus-Pro, Emu3, Lumina-mGPT, Anole) in its own layout; a LlamaGen-T2I folder with its
    :data:`LLAMAGEN_T2I_CONFIG` (:func:`load_llamagen_t2i`). Each model folder may hold at most ``max_params``
    values (:func:`~vgen.hub.from_pretrained`). ``threads`` sets the CPU threads torch computes with for the rest of
    the process: a number, or ``"auto"``, the cores not busy elsewhere (:func:`~vgen.threads.set_threads`, what the
    ``vgen`` command does unless told otherwise); None leaves torch's setting as it is."""
    local_path(name_or_path, "vgen.load's name_or_path")
    check_device(device)
    check_dtype(dtype)
    MAX_PARAMS_OPTION.check("max_params", max_params, int)
    if threads is not None:
        set_threads(threads)
    family = released_family(name_or_path)
    if family is not None:
        return family.load(name_or_path, device, dtype)
    if (Path(name_or_path) / LLAMAGEN_T2I_CONFIG).is_file():
        return _load_llamagen_t2i_folder(Path(name_or_path), device, dtype)
    path = pipeline_folder(name_or_path)
    try:
        meta = json.loads((path / PIPELINE_CONFIG).read_text())
        info = PipelineInfo(**meta)
    except (json.JSONDecodeError, TypeError) as e:
        raise CheckpointError(f"bad {path / PIPELINE_CONFIG}: {e}") from None
    limit = {"max_params": max_params}
    if (path / MODEL_FOLDER).is_dir():  # a streaming block-diffusion pipeline: no sampler, a tokenizer if latent,
        # a text encoder if prompt-conditioned
        kl = from_pretrained(path / TOKENIZER_FOLDER, **limit) if (path / TOKENIZER_FOLDER).is_dir() else None
        words = from_pretrained(path / TEXT_ENCODER_FOLDER, **limit) if (path / TEXT_ENCODER_FOLDER).is_dir() else None
        return StreamPipeline(from_pretrained(path / MODEL_FOLDER, **limit), info, kl, words).to(device, dtype)
    head = from_pretrained(path / "drafter", **limit) if (path / "drafter").is_dir() else None
    tokenizer_dir = path / "kl" if (path / "kl").is_dir() else path / "vq"
    model = from_pretrained(path / "gpt", **limit)
    if len(model.grid) == 3:  # frames x rows x columns
        return VideoPipeline(model, from_pretrained(tokenizer_dir, **limit), info, head).to(device, dtype)
    text_encoder = None
    if (path / TEXT_ENCODER_FOLDER).is_dir():
        text_encoder = from_pretrained(path / TEXT_ENCODER_FOLDER, **limit)
    pipe = ImagePipeline(model, from_pretrained(tokenizer_dir, **limit), info, head, text_encoder=text_encoder)
    return pipe.to(device, dtype)


def load_llamagen(gpt_ckpt: str | Path, vq_ckpt: str | Path, *, gpt_model: str = "GPT-B", image_size: int = 256,
                  vq_model: str = "VQ-16", codebook_size: int = 16384, codebook_embed_dim: int = 8,
                  num_classes: int = 1000, device: str | torch.device = "cpu",
                  dtype: torch.dtype | None = None) -> ImagePipeline:
    """A pipeline over LlamaGen's released class-conditional ``.pt`` checkpoints, used unchanged. Every argument
    after the two files is keyword-only, as in :func:`load_llamagen_t2i`.

    Defaults follow LlamaGen's ``sample_c2i.py`` (CFG 4.0, top-k 2000) for the sampling settings.
    """
    check_device(device)
    vq_cfg = _llamagen_vq_config(vq_model, codebook_size, codebook_embed_dim)
    gpt_cfg = llamagen_config_for(gpt_model, image_size, vq_cfg.downsample_factor, codebook_size, num_classes)
    tokenizer = _llamagen_vq(vq_ckpt, vq_cfg)
    model = _llamagen_gpt(gpt_ckpt, gpt_cfg, f"{gpt_model}, image size {image_size}")
    info = PipelineInfo(name=Path(gpt_ckpt).stem, image_size=image_size,
                        defaults={"cfg_scale": 4.0, "top_k": 2000})
    return ImagePipeline(model, tokenizer, info).to(device, dtype)


def load_llamagen_t2i(gpt_ckpt: str | Path, vq_ckpt: str | Path, *, image_size: int | None = None,
                      gpt_model: str = "GPT-XL", vq_model: str = "VQ-16", codebook_size: int = 16384,
                      codebook_embed_dim: int = 8, caption_dim: int = 2048, t5_path: str | Path | None = None,
                      device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                      defaults: dict | None = None) -> ImagePipeline:
    """A pipeline over LlamaGen's released text-to-image ``.pt`` checkpoints (``t2i_XL_stage1_256.pt`` or
    ``t2i_XL_stage2_512.pt`` with ``vq_ds16_t2i.pt``), used unchanged. With ``t5_path`` (a local FLAN-T5-XL
    folder) it takes ``prompt=``; it always takes T5 features as ``prompt_embeds``. Every argument after the two
    files is keyword-only, as in :func:`load_llamagen`.

    ``image_size`` defaults to the released checkpoint's (by its file name). ``defaults``, the recommended sampling
    settings, default to LlamaGen's ``sample_t2i.py`` (CFG 7.5, top-k 1000: :data:`LLAMAGEN_T2I_DEFAULTS`).
    """
    check_device(device)
    image_size = _llamagen_t2i_image_size(gpt_ckpt, image_size)
    vq_cfg = _llamagen_vq_config(vq_model, codebook_size, codebook_embed_dim)
    gpt_cfg = llamagen_t2i_config_for(image_size, gpt_model, vq_cfg.downsample_factor, codebook_size, caption_dim)
    encoder = None
    if t5_path is not None:  # before the checkpoints are read, so that a wrong folder fails at once
        encoder = T5TextEncoder.from_pretrained(t5_path, max_length=gpt_cfg.cls_token_num, device=device)
        check_caption_dim(encoder.caption_dim, gpt_cfg.caption_dim, f"the T5 encoder at {t5_path}")
    tokenizer = _llamagen_vq(vq_ckpt, vq_cfg)
    model = _llamagen_gpt(gpt_ckpt, gpt_cfg, f"{gpt_model} t2i, image size {image_size}")
    info = PipelineInfo(name=Path(gpt_ckpt).stem, image_size=image_size,
                        defaults=dict(LLAMAGEN_T2I_DEFAULTS if defaults is None else defaults))
    return ImagePipeline(model, tokenizer, info, prompt_encoder=encoder and encoder.condition).to(device, dtype)


@dataclass(frozen=True)
class LlamaGenT2IConfig:
    """What a LlamaGen-T2I folder's :data:`LLAMAGEN_T2I_CONFIG` records: :func:`load_llamagen_t2i`'s arguments.
    The paths are relative to the folder or absolute; without ``t5_path`` the pipeline takes ``prompt_embeds``
    only. Checked on construction: the types, the architecture names and sizes, and the sampling defaults."""

    gpt_ckpt: str
    vq_ckpt: str
    image_size: int
    t5_path: str | None = None
    gpt_model: str = "GPT-XL"
    vq_model: str = "VQ-16"
    codebook_size: int = 16384
    codebook_embed_dim: int = 8
    caption_dim: int = 2048
    defaults: dict = field(default_factory=lambda: dict(LLAMAGEN_T2I_DEFAULTS))

    def __post_init__(self) -> None:
        for name, kind in typing.get_type_hints(type(self)).items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, kind):
                raise ValueError(f"{name} must be {getattr(kind, '__name__', kind)}, got {value!r}")
        vq_cfg = _llamagen_vq_config(self.vq_model, self.codebook_size, self.codebook_embed_dim)
        llamagen_t2i_config_for(self.image_size, self.gpt_model, vq_cfg.downsample_factor, self.codebook_size,
                                self.caption_dim)
        unknown = sorted(set(self.defaults) - {f.name for f in fields(SamplingParams)})
        if unknown:
            raise ValueError(f"defaults has unknown sampling settings {unknown}; known: "
                             f"{[f.name for f in fields(SamplingParams)]}")
        SamplingParams(**self.defaults)

    @classmethod
    def from_dict(cls, d: dict) -> LlamaGenT2IConfig:
        """The config a JSON object records; an unknown or missing key is a ValueError naming it."""
        if not isinstance(d, dict):
            raise ValueError(f"expected a JSON object, got {type(d).__name__}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise ValueError(f"unknown keys {unknown}; known: {names}")
        missing = [f.name for f in fields(cls)
                   if f.name not in d and f.default is MISSING and f.default_factory is MISSING]
        if missing:
            raise ValueError(f"missing keys {missing}")
        return cls(**d)


def write_llamagen_t2i_config(folder: str | Path, gpt_ckpt: str | Path, vq_ckpt: str | Path,
                              t5_path: str | Path | None = None, image_size: int | None = None,
                              gpt_model: str = "GPT-XL", vq_model: str = "VQ-16", codebook_size: int = 16384,
                              codebook_embed_dim: int = 8, caption_dim: int = 2048,
                              defaults: dict | None = None) -> Path:
    """Write ``folder/llamagen_t2i.json`` so that ``vgen.load(folder)`` (and ``vgen sample --model folder``) loads
    these files with :func:`load_llamagen_t2i` and these arguments; returns ``folder``.

    A path inside ``folder`` is recorded relative to it (the folder can move), any other as an absolute path.
    The checkpoints must exist and ``t5_path`` must be a T5 folder (a one-line error otherwise); nothing is loaded.
    ``image_size`` defaults to the released checkpoint's, ``defaults`` to :data:`LLAMAGEN_T2I_DEFAULTS`.
    """
    folder = Path(folder)
    for what, path in (("GPT", gpt_ckpt), ("VQ", vq_ckpt)):
        if not Path(path).is_file():
            raise CheckpointError(f"{what} checkpoint not found: {path}")
    if t5_path is not None:
        resolve_t5_folder(t5_path)
    config = LlamaGenT2IConfig(
        gpt_ckpt=_recorded_path(folder, gpt_ckpt), vq_ckpt=_recorded_path(folder, vq_ckpt),
        image_size=_llamagen_t2i_image_size(gpt_ckpt, image_size),
        t5_path=None if t5_path is None else _recorded_path(folder, t5_path), gpt_model=gpt_model,
        vq_model=vq_model, codebook_size=codebook_size, codebook_embed_dim=codebook_embed_dim,
        caption_dim=caption_dim, defaults=dict(LLAMAGEN_T2I_DEFAULTS if defaults is None else defaults))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LLAMAGEN_T2I_CONFIG).write_text(json.dumps(asdict(config), indent=1))
    return folder


def _load_llamagen_t2i_folder(folder: Path, device: str | torch.device, dtype: torch.dtype | None) -> ImagePipeline:
    """The pipeline a folder's :data:`LLAMAGEN_T2I_CONFIG` describes; a bad config or a file it names that is not
    there is a one-line :class:`CheckpointError`."""
    config_file = folder / LLAMAGEN_T2I_CONFIG
    try:
        config = LlamaGenT2IConfig.from_dict(json.loads(config_file.read_text()))
    except ValueError as e:  # json.JSONDecodeError included
        raise CheckpointError(f"bad {config_file}: {e}") from None
    paths = {}
    for name, is_there, kind in (("gpt_ckpt", Path.is_file, "file"), ("vq_ckpt", Path.is_file, "file"),
                                 ("t5_path", Path.is_dir, "folder")):
        value = getattr(config, name)
        if value is not None:
            paths[name] = folder / value  # an absolute value stays itself
            if not is_there(paths[name]):
                raise CheckpointError(f"{config_file} names {name} {value!r}, but {paths[name]} is not a {kind}")
    return load_llamagen_t2i(**{**asdict(config), **paths}, device=device, dtype=dtype)


def _recorded_path(folder: Path, path: str | Path) -> str:
    """``path`` as a config in ``folder`` records it: relative to ``folder`` when inside it, else absolute (links
    kept as given)."""
    path, folder = Path(os.path.abspath(path)), Path(os.path.abspath(folder))
    return str(path.relative_to(folder)) if path.is_relative_to(folder) else str(path)


def _llamagen_t2i_image_size(gpt_ckpt: str | Path, image_size: int | None) -> int:
    """``image_size``, or that of the released checkpoint ``gpt_ckpt`` names."""
    if image_size is not None:
        return image_size
    if Path(gpt_ckpt).name not in LLAMAGEN_T2I_CHECKPOINTS:
        raise ValueError(f"cannot tell the image size of {Path(gpt_ckpt).name}: pass image_size (LlamaGen's "
                         f"releases: {LLAMAGEN_T2I_CHECKPOINTS})")
    return LLAMAGEN_T2I_CHECKPOINTS[Path(gpt_ckpt).name]


def load_janus_pipeline(folder: str | Path, device: str | torch.device = "cpu",
                        dtype: torch.dtype | None = None) -> ImagePipeline:
    """A Janus-Pro checkpoint in ``transformers``' layout (model and processor saved in one folder) as a
    text-to-image pipeline: ``pipe(prompt=[...])``, CFG 5 as ``generate(generation_mode="image")`` uses."""
    check_device(device)
    loaded = load_janus(folder, device=device)
    model, tokenizer = loaded.model, loaded.tokenizer
    info = PipelineInfo(name=Path(folder).name, image_size=model.grid[0] * tokenizer.downsample_factor,
                        defaults={"cfg_scale": model.config.cfg_scale})
    return ImagePipeline(model, tokenizer, info, prompt_encoder=loaded.condition).to(device, dtype)


def load_emu3_pipeline(folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                       image_size: int | None = None) -> ImagePipeline:
    """An Emu3 folder in ``transformers``' layout (``Emu3ForConditionalGeneration`` and ``Emu3Processor`` saved
    together, e.g. BAAI/Emu3-Gen-hf; :func:`~vgen.models.emu3.load_emu3`) as a text-to-image pipeline of square
    ``image_size``-px images (default 720, ``Emu3Processor``'s area: 90 x 90 codes; a multiple of 8 px):
    ``pipe(prompt=[...], negative_prompt=...)``, guided against the docs' negative prompt unless another is given.
    The defaults are the folder's ``generation_config.json`` guidance scale and top-k where it sets them, else the
    original code's CFG 3 and top-k 2048 (:class:`~vgen.models.emu3.Emu3Defaults` says which)."""
    check_device(device)
    if image_size is not None and (image_size < 1 or image_size % EMU3_PIXELS_PER_CODE):
        raise ValueError(f"image_size {image_size} is not a positive multiple of Emu3's {EMU3_PIXELS_PER_CODE} "
                         f"pixels a code")
    area = EMU3_IMAGE_AREA if image_size is None else image_size ** 2
    loaded = load_emu3(folder, dtype=dtype, device=device, image_area=area)
    model, defaults = loaded.model, loaded.defaults
    info = PipelineInfo(name=Path(folder).name, image_size=model.grid[0] * loaded.tokenizer.downsample_factor,
                        defaults={"cfg_scale": defaults.cfg_scale, "top_k": defaults.top_k})
    return ImagePipeline(model, loaded.tokenizer, info, prompt_encoder=loaded.condition,
                         takes_negative_prompt=True).to(device, dtype)


def load_lumina_pipeline(folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                         image_size: int | None = None) -> ImagePipeline:
    """A Lumina-mGPT folder (``save_pretrained`` of its Chameleon model, with Chameleon's tokenizer files in
    ``ckpts/chameleon/tokenizer/``, :func:`~vgen.models.chameleon.load_lumina`) as a text-to-image pipeline of
    square ``image_size``-px images (default 768: 48 x 48 codes): ``pipe(prompt=[...])`` with the defaults of
    Lumina's inference solver, CFG 3 against its unconditional image header and top-k 2000 over image codes.
    Prompts may take 256 tokens, or what the model's context leaves beside the image where that is less. The
    backbone is read in ``dtype`` (float32 by default), the VQGAN kept in float32."""
    check_device(device)
    size = {} if image_size is None else {"image_size": image_size}
    return _chameleon_pipeline(load_lumina(folder, dtype=dtype, device=device, **size), folder, device, dtype)


def load_anole_pipeline(folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                        image_size: int | None = None) -> ImagePipeline:
    """A ``transformers`` Chameleon folder of an image-generating checkpoint (Anole), with Chameleon's tokenizer
    files in ``ckpts/chameleon/tokenizer/`` (:func:`~vgen.models.chameleon.load_anole`), as a text-to-image pipeline
    of square ``image_size``-px images (default 512: 32 x 32 codes) with Anole's defaults: CFG 3, temperature 0.7,
    top-p 0.9."""
    check_device(device)
    size = {} if image_size is None else {"image_size": image_size}
    return _chameleon_pipeline(load_anole(folder, dtype=dtype, device=device, **size), folder, device, dtype)


def _chameleon_pipeline(loaded: LoadedLumina, folder: str | Path, device: str | torch.device,
                        dtype: torch.dtype | None) -> ImagePipeline:
    info = PipelineInfo(name=Path(folder).name, image_size=loaded.image_size, defaults=dict(loaded.defaults))
    return ImagePipeline(loaded.model, loaded.tokenizer, info, prompt_encoder=loaded.condition).to(device, dtype)


@dataclass(frozen=True)
class ReleasedFamily:
    """A model family whose released checkpoint folders :func:`load` reads in their own layout: the test that a
    folder holds one, and its pipeline loader ``load(folder, device, dtype)``, which takes ``image_size=`` too
    where ``sized`` (the family generates more than one size)."""

    is_folder: Callable[[str | Path], bool]
    load: Callable[..., ImagePipeline]
    sized: bool = False


RELEASED_FOLDERS: dict[str, ReleasedFamily] = {
    "Janus-Pro": ReleasedFamily(is_janus_folder, load_janus_pipeline),
    "Emu3": ReleasedFamily(is_emu3_folder, load_emu3_pipeline, sized=True),
    "Lumina-mGPT": ReleasedFamily(is_lumina_folder, load_lumina_pipeline, sized=True),
    "Anole": ReleasedFamily(is_anole_folder, load_anole_pipeline, sized=True),
}
"""The families :func:`load` reads from their released folders, by name."""


def released_family(folder: str | Path) -> ReleasedFamily | None:
    """The family of :data:`RELEASED_FOLDERS` whose released folder ``folder`` is, if any."""
    return next((family for family in RELEASED_FOLDERS.values() if family.is_folder(folder)), None)


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
    kind = llamagen_checkpoint_kind(state)
    if kind == "t2i" and not config.text_conditional:
        raise CheckpointError(f"GPT checkpoint {gpt_ckpt} is a LlamaGen text-to-image model (caption projection "
                              f"cls_embedding.cap_proj): load it with load_llamagen_t2i (`vgen sample --t5-path`), "
                              f"or name its files in a folder with `vgen t2i-config`")
    if kind == "c2i" and config.text_conditional:
        raise CheckpointError(f"GPT checkpoint {gpt_ckpt} is a LlamaGen class-conditional model (class table "
                              f"cls_embedding.embedding_table): load it with load_llamagen")
    with torch.device("meta"):  # no throw-away random init of a possibly multi-GB model
        model = LlamaGenGPT(config)
    model = model.to_empty(device="cpu")
    load_weights(model, state, source=f"GPT checkpoint {gpt_ckpt} ({what})")
    return model
