"""The image pipeline: tokenizer + backbone + sampler -> images, behind one ``__call__``.

:func:`vgen.pipelines.load` returns an :class:`ImagePipeline` for an embedded default (``shapes-c2i``) or a folder
written by :meth:`ImagePipeline.save_pretrained`, and :func:`vgen.pipelines.load_llamagen` one over LlamaGen
checkpoint files. The CLI and the web app are thin layers over this class: no generation logic lives in them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from PIL import Image

from vgen.hub import PIPELINE_CONFIG, save_pretrained
from vgen.images import tensor_to_pil
from vgen.models.conditioning import Condition, PrefixCondition
from vgen.models.text_encoder import check_caption_dim
from vgen.pipelines.inputs import ClassConditional, ClassLabel, check_count, check_generator, check_seed
from vgen.samplers import (
    ContinuousARSampler,
    SampleOutput,
    Sampler,
    SamplerStats,
    SamplingParams,
    available_samplers,
    continuing_samplers,
    get_sampler,
)
from vgen.samplers.continuous import TOKEN_ORDER, check_draft
from vgen.samplers.options import merge_settings
from vgen.tokenizers.kl import KLTokenizer

TEXT_ENCODER_FOLDER = "text_encoder"
"""A pipeline folder's text encoder subfolder (a text-to-image model trained with its own encoder)."""


@dataclass
class PipelineOutput:
    """Generated images (PIL), their tokens ([B, h*w] codes or [B, h*w, C] continuous), the class ids asked for
    (empty for a text-to-image model), the sampler's stats, and the prompts asked for (empty for a class model or
    for ``prompt_embeds``)."""

    images: list[Image.Image]
    tokens: torch.Tensor
    class_ids: list[int]
    stats: SamplerStats
    prompts: list[str] = field(default_factory=list)


@dataclass
class PipelineInfo:
    """What a pipeline folder records beside its weights: names, image size, recommended defaults, the rendering
    config of the ``vgen.data`` set it was trained on (so evaluation can render matching real images), and for a
    text-to-image model a few example prompts (what ``vgen sample`` and the web demo offer by default)."""

    name: str
    image_size: int
    class_names: list[str] | None = None
    defaults: dict = field(default_factory=dict)
    data: dict | None = None
    example_prompts: list[str] | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "image_size": self.image_size, "class_names": self.class_names,
                "defaults": self.defaults, "data": self.data, "example_prompts": self.example_prompts}


def is_continuous(model: torch.nn.Module) -> bool:
    """Whether ``model`` generates continuous tokens (a diffusion-head AR) rather than codebook indices."""
    return getattr(model, "token_order", "raster") == TOKEN_ORDER


def default_sampler(model: torch.nn.Module) -> str:
    """The plain one-token-per-pass sampler for ``model``'s token kind; for a parallel-order backbone (NAR, NBP)
    the sampler of its order."""
    if is_continuous(model):
        return ContinuousARSampler.name
    order = getattr(model, "token_order", "raster")
    return "ar" if order == "raster" else available_samplers(order)[0]


class ImagePipeline(ClassConditional):
    """Class-conditional or text-to-image generation with a token backbone, its tokenizer and, optionally, a
    drafter. A text-to-image backbone (``text_conditional``, e.g. LlamaGen-T2I) takes precomputed prompt
    embeddings (``prompt_embeds`` with ``prompt_attention_mask``, diffusers' names) instead of class ids.

    Discrete backbones (LlamaGen) pair with a VQ tokenizer; their drafter is a trained draft head for the
    speculative samplers (``drafter="head"``, and what ``lantern`` picks when present). Continuous backbones
    (a diffusion-head AR) pair with a KL tokenizer; their drafter is a small draft model for ``cspd``.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: torch.nn.Module, info: PipelineInfo,
                 draft_head: torch.nn.Module | None = None,
                 prompt_encoder: Callable[[list[str]], PrefixCondition] | None = None,
                 text_encoder: torch.nn.Module | None = None) -> None:
        grid = model.grid
        if info.image_size != grid[0] * tokenizer.downsample_factor:
            raise ValueError(f"image size {info.image_size} does not match the model's {grid[0]}x{grid[1]} token "
                             f"grid with a tokenizer downsampling by {tokenizer.downsample_factor}")
        if is_continuous(model):
            if getattr(tokenizer.config, "latent_channels", None) != model.token_channels:
                raise ValueError(f"the model's tokens have {model.token_channels} channels; the tokenizer "
                                 f"({type(tokenizer).__name__}) does not give latents of that many")
            if draft_head is not None:
                check_draft(model, draft_head.eval())
        else:
            if model.vocab_size != getattr(tokenizer, "codebook_size", None):
                raise ValueError(f"model vocabulary {model.vocab_size} != tokenizer codebook "
                                 f"{getattr(tokenizer, 'codebook_size', None)}")
            if draft_head is not None:
                draft_head.check_target(model)
                draft_head.eval()
        if text_encoder is not None:
            if prompt_encoder is not None:
                raise ValueError("give a prompt_encoder or a text_encoder, not both")
            check_caption_dim(text_encoder.caption_dim, model.config.caption_dim)
            prompt_encoder = text_encoder.eval().condition
        self.model, self.tokenizer, self.info, self.draft_head = model.eval(), tokenizer.eval(), info, draft_head
        self.prompt_encoder = prompt_encoder  # prompts -> the model's PrefixCondition (a text-to-image model)
        self.text_encoder = text_encoder  # a vgen text encoder module the pipeline folder holds, if any

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def num_classes(self) -> int:
        return self.model.num_classes

    def to(self, device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> ImagePipeline:
        """Move the backbone (and the tokenizer, kept in fp32 for decoding quality) to a device / dtype."""
        self.model.to(device=device, dtype=dtype)
        self.tokenizer.to(device=device)
        if self.draft_head is not None:
            self.draft_head.to(device=device, dtype=dtype)
        if self.text_encoder is not None:
            self.text_encoder.to(device=device)
        return self

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor) -> list[Image.Image]:
        """Token grids [B, h*w] (codes) or [B, h*w, C] (continuous tokens) -> PIL images."""
        tokens = tokens.to(next(self.tokenizer.parameters()).device)
        if is_continuous(self.model):
            return tensor_to_pil(self.tokenizer.decode(tokens))
        return tensor_to_pil(self.tokenizer.decode_code(tokens, self.model.grid))

    @property
    def text_conditional(self) -> bool:
        """Whether the backbone is conditioned on a prompt rather than a class."""
        return bool(getattr(self.model, "text_conditional", False))

    def condition(self, class_ids: Sequence[ClassLabel] | ClassLabel | None, prompt: str | Sequence[str] | None,
                  prompt_embeds: torch.Tensor | None, prompt_attention_mask: torch.Tensor | None,
                  num_images: int | None) -> tuple[Condition, list[int], list[str]]:
        """The sampler's condition for one call, and the class ids and prompts it stands for: class ids for a class
        model; for a text model the prompts through the pipeline's prompt encoder, or ``prompt_embeds`` left-padded
        to the model's caption length; each repeated in turn to ``num_images`` when given."""
        if prompt_attention_mask is not None and prompt_embeds is None:
            raise ValueError("prompt_attention_mask was given without prompt_embeds")
        if prompt is None and prompt_embeds is None:
            if self.text_conditional:
                raise ValueError(f"{self.info.name} is a text-to-image model: give a prompt (or prompt_embeds), "
                                 f"not class ids")
            class_ids = self.class_list(class_ids, num_images)
            return torch.tensor(class_ids, device=self.device), class_ids, []
        if not self.text_conditional:
            raise ValueError(f"{self.info.name} is class-conditional: give class ids, not a prompt")
        if class_ids is not None:
            raise ValueError("give class ids or a prompt, not both")
        if prompt is not None and prompt_embeds is not None:
            raise ValueError("give prompt or prompt_embeds, not both")
        prompts: list[str] = []
        if prompt is not None:
            prompts = list(prompt) if isinstance(prompt, Iterable) and not isinstance(prompt, str) else [prompt]
            bad = [type(p).__name__ for p in prompts if not isinstance(p, str)]
            if bad:
                raise ValueError(f"prompt must be a string or a list of strings, got {bad[0]}")
            if not prompts:
                raise ValueError("the prompt list is empty: give at least one prompt")
            if self.prompt_encoder is None:
                raise ValueError(f"{self.info.name} has no text encoder loaded: load it with one (LlamaGen-T2I: "
                                 f"--t5-path) or pass prompt_embeds")
            cond = self.prompt_encoder(prompts)
        else:
            cond = PrefixCondition.from_padded(prompt_embeds, prompt_attention_mask, self.model.prefix_len)
        if num_images is not None:
            check_count("num_images", num_images)
            rows = torch.arange(num_images, device=cond.device) % len(cond)
            cond = PrefixCondition(cond.values[rows], cond.mask[rows])
            prompts = [prompts[int(r)] for r in rows] if prompts else []
        return cond.to(self.device), [], prompts

    @torch.no_grad()
    def sample_tokens(self, class_ids: Sequence[ClassLabel] | ClassLabel | None = None, *,
                      num_images: int | None = None, sampler: str | Sampler | None = None, seed: int | None = 0,
                      generator: torch.Generator | None = None, cfg_scale: float | None = None,
                      cfg_interval: int | None = None, temperature: float | None = None, top_k: int | None = None,
                      top_p: float | None = None, progress: bool = False, prefix: torch.Tensor | None = None,
                      prompt: str | Sequence[str] | None = None, prompt_embeds: torch.Tensor | None = None,
                      prompt_attention_mask: torch.Tensor | None = None,
                      **sampler_options) -> tuple[SampleOutput, list[int], list[str]]:
        """Draw the tokens of one image per entry of ``class_ids`` (class ids or the pipeline's class names), or for a
        text-to-image model per ``prompt`` (through the pipeline's prompt encoder) or per row of ``prompt_embeds``
        [B, L, D] (text-encoder features, padded as ``prompt_attention_mask`` [B, L] says), repeated in turn to
        ``num_images`` if given. Every argument is checked before sampling starts (:mod:`vgen.pipelines.inputs`).

        ``sampler`` defaults to one token per pass (``ar``, or ``continuous-ar`` for a continuous model).
        Sampling settings left as ``None`` take the pipeline's recommended defaults. ``seed`` seeds a fresh
        ``torch.Generator`` (ignored when ``generator`` is given): the same seed gives the same images.
        ``prefix`` [B, n] holds given leading tokens of every sample, for a sampler that continues them.
        """
        check_seed(seed)
        check_generator(generator, self.device)
        cond, class_ids, prompts = self.condition(class_ids, prompt, prompt_embeds, prompt_attention_mask,
                                                  num_images)
        given = {"cfg_scale": cfg_scale, "cfg_interval": cfg_interval, "temperature": temperature,
                 "top_k": top_k, "top_p": top_p}
        params = SamplingParams(**merge_settings(self.info.defaults, given))
        sampler_obj = get_sampler(sampler or default_sampler(self.model), **sampler_options)
        continuation = {}
        if prefix is not None:
            if not sampler_obj.continues:
                raise ValueError(f"the {sampler_obj.name!r} sampler cannot continue given tokens; samplers that can: "
                                 f"{continuing_samplers()}")
            continuation = {"prefix": prefix.to(self.device)}
        if generator is None:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(0 if seed is None else int(seed))
        out = sampler_obj.sample(self.model, cond, params, generator=generator, progress=progress,
                                 tokenizer=self.tokenizer, draft_head=self.draft_head, **continuation)
        return out, class_ids, prompts

    def __call__(self, class_ids: Sequence[ClassLabel] | ClassLabel | None = None, **kwargs) -> PipelineOutput:
        """Generate one image per entry of ``class_ids`` (or per prompt): :meth:`sample_tokens`'s arguments, the
        tokens decoded to images."""
        out, class_ids, prompts = self.sample_tokens(class_ids, **kwargs)
        return PipelineOutput(self.decode(out.tokens), out.tokens.cpu(), class_ids, out.stats, prompts)

    def save_pretrained(self, path: str | Path, dtype: torch.dtype | None = None) -> Path:
        """Write ``pipeline.json`` plus ``gpt/``, ``vq/`` or ``kl/`` (and ``drafter/``, ``text_encoder/``) model folders
        (safetensors), the weights in ``dtype`` (default: as they are)."""
        path = Path(path)
        save_pretrained(self.model, path / "gpt", dtype=dtype)
        save_pretrained(self.tokenizer, path / tokenizer_folder(self.tokenizer), dtype=dtype)
        if self.draft_head is not None:
            save_pretrained(self.draft_head, path / "drafter", dtype=dtype)
        if self.text_encoder is not None:
            save_pretrained(self.text_encoder, path / TEXT_ENCODER_FOLDER, dtype=dtype)
        (path / PIPELINE_CONFIG).write_text(json.dumps(self.info.to_dict(), indent=1))
        return path


def tokenizer_folder(tokenizer: torch.nn.Module) -> str:
    """A pipeline folder's tokenizer subfolder: ``kl`` for a KL tokenizer, ``vq`` otherwise."""
    return "kl" if isinstance(tokenizer, KLTokenizer) else "vq"
