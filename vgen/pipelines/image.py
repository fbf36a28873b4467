"""The image pipeline: tokenizer + backbone + sampler -> images, behind one ``__call__``.

:func:`vgen.pipelines.load` returns an :class:`ImagePipeline` for an embedded default (``shapes-c2i``) or a folder
written by :meth:`ImagePipeline.save_pretrained`, and :func:`vgen.pipelines.load_llamagen` one over LlamaGen
checkpoint files. The CLI and the web app are thin layers over this class: no generation logic lives in them.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from vgen.hub import PIPELINE_CONFIG, save_pretrained
from vgen.images import tensor_to_pil
from vgen.models.conditioning import Condition, PrefixCondition, cat_conditions
from vgen.models.llamagen import teacher_forced_logits
from vgen.models.text_encoder import check_caption_dim
from vgen.pipelines.inputs import (
    DEFAULT_BATCH_SIZE,
    MAX_SAMPLES,
    ClassConditional,
    ClassLabel,
    check_batch_size,
    check_count,
    check_generator,
    check_output_size,
    check_prompts,
    check_seed,
)
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
from vgen.samplers.base import SharedBar
from vgen.samplers.continuous import TOKEN_ORDER, check_draft
from vgen.samplers.options import merge_settings, short_repr
from vgen.tokenizers.kl import KLTokenizer

TEXT_ENCODER_FOLDER = "text_encoder"
"""A pipeline folder's text encoder subfolder (a text-to-image model trained with its own encoder)."""


@dataclass
class PipelineOutput:
    """Generated images (PIL), their tokens ([B, h*w] codes or [B, h*w, C] continuous), the class ids asked for
    (empty for a text-to-image model), the sampler's stats (those of every chunk added up, for a request drawn in
    chunks), and the prompts asked for (empty for a class model or for ``prompt_embeds`` / ``prompt_ids``)."""

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

    ``batch_size`` (a call's default, :data:`~vgen.pipelines.inputs.DEFAULT_BATCH_SIZE` unless set) bounds the
    images drawn at once: a larger request is drawn in chunks (:meth:`sample_tokens`).

    Discrete backbones (LlamaGen) pair with a VQ tokenizer; their drafter is a trained draft head for the
    speculative samplers (``drafter="head"``, and what ``lantern`` picks when present). Continuous backbones
    (a diffusion-head AR) pair with a KL tokenizer; their drafter is a small draft model for ``cspd``.

    ``takes_negative_prompt`` says that the model's guidance runs against a prompt of its own (Emu3's negative
    prompt): the ``prompt_encoder`` then also takes ``negative_prompt=`` (None: the model's default), and so does a
    call with ``prompt=``.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: torch.nn.Module, info: PipelineInfo,
                 draft_head: torch.nn.Module | None = None,
                 prompt_encoder: Callable[[list[str]], PrefixCondition] | None = None,
                 text_encoder: torch.nn.Module | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
                 takes_negative_prompt: bool = False) -> None:
        check_batch_size(batch_size)
        if takes_negative_prompt and prompt_encoder is None:
            raise ValueError("takes_negative_prompt needs the prompt_encoder that reads the negative prompt")
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
        self.batch_size = batch_size  # images drawn at once; a larger request is drawn in chunks of this many
        self.takes_negative_prompt = takes_negative_prompt  # prompt_encoder(prompts, negative_prompt=...)

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

    def request(self, class_ids: Sequence[ClassLabel] | ClassLabel | None, prompt: str | Sequence[str] | None,
                prompt_embeds: torch.Tensor | None, prompt_attention_mask: torch.Tensor | None,
                num_images: int | None, prompt_ids: torch.Tensor | None = None,
                batch_size: int | None = None, negative_prompt: str | None = None) -> Request:
        """What one call asks for, checked before anything is drawn: class ids for a class model; for a text model
        prompts (through the pipeline's prompt encoder, with ``negative_prompt`` for a model whose guidance runs
        against one), ``prompt_embeds`` left-padded to the model's caption length, or ``prompt_ids`` (a token-id
        model's own prompt rows); each repeated in turn to ``num_images`` when given. A request whose images would
        take more than :data:`~vgen.pipelines.inputs.MAX_OUTPUT_BYTES` is refused here."""
        size = self.batch_size if batch_size is None else batch_size
        check_batch_size(size)
        if num_images is not None:
            check_count("num_images", num_images)
        given = {"prompt": prompt, "prompt_embeds": prompt_embeds, "prompt_ids": prompt_ids}
        named = [name for name, value in given.items() if value is not None]
        if negative_prompt is not None:
            negative_prompt = self.check_negative_prompt(negative_prompt, named)
        if prompt_attention_mask is not None and prompt_embeds is None and prompt_ids is None:
            raise ValueError("prompt_attention_mask was given without prompt_embeds or prompt_ids")
        if not named:
            if self.text_conditional:
                raise ValueError(f"{self.info.name} is a text-to-image model: give a prompt (or prompt_embeds), "
                                 f"not class ids")
            asked = num_images if num_images is not None else _length(class_ids)
            self.check_output(asked)
            ids = self.class_list(class_ids, num_images)
            self.check_output(len(ids))
            return Request(ids, [], len(ids), int(size), lambda rows: torch.tensor(ids[rows.start:rows.stop]))
        if not self.text_conditional:
            raise ValueError(f"{self.info.name} is class-conditional: give class ids, not a prompt")
        if class_ids is not None:
            raise ValueError("give class ids or a prompt, not both")
        if len(named) > 1:
            raise ValueError(f"give {' or '.join(named)}, not {'both' if len(named) == 2 else 'all three'}")
        takes_ids = bool(getattr(self.model, "prompt_token_ids", False))
        if prompt is not None:
            prompts = check_prompts(prompt)
            if self.prompt_encoder is None:
                raise ValueError(f"{self.info.name} has no text encoder loaded: load it with one (LlamaGen-T2I: "
                                 f"--t5-path) or pass prompt_embeds")
            return self._prompt_request(prompts, num_images, int(size), negative_prompt)
        if prompt_embeds is not None:
            if takes_ids:
                raise ValueError(f"{self.info.name} is conditioned on prompt token ids, not embeddings: give prompt= "
                                 f"or prompt_ids= (with prompt_attention_mask=)")
            if not isinstance(prompt_embeds, torch.Tensor):
                raise ValueError(f"prompt_embeds must be a tensor [batch, tokens, features], got "
                                 f"{type(prompt_embeds).__name__}")
            cond = PrefixCondition.from_padded(prompt_embeds, prompt_attention_mask, self.model.prefix_len)
        else:
            if not takes_ids:
                raise ValueError(f"{self.info.name} is conditioned on text-encoder features, not token ids: give "
                                 f"prompt= or prompt_embeds= (with prompt_attention_mask=)")
            cond = prompt_id_condition(prompt_ids, prompt_attention_mask)
            self.model.check_condition(cond)
        count = len(cond) if num_images is None else int(num_images)
        self.check_output(count)
        return Request([], [], count, int(size), lambda rows: cond[torch.arange(rows.start, rows.stop) % len(cond)])

    def check_negative_prompt(self, negative_prompt: Any, named: list[str]) -> str:
        """``negative_prompt`` as :func:`~vgen.pipelines.inputs.check_prompts` cleans it; refused where it cannot
        apply: a model whose guidance runs against no prompt of its own (its unconditional rows are fixed), a
        request without ``prompt=`` (``named``: the condition arguments given), or not a non-empty string."""
        if not self.takes_negative_prompt:
            kind = "text-to-image" if self.text_conditional else "class-conditional"
            raise ValueError(f"{self.info.name} takes no negative_prompt: its guidance runs against the "
                             f"{kind} model's own unconditional rows")
        if named != ["prompt"]:
            raise ValueError(f"negative_prompt goes with prompt=, not {' or '.join(named) or 'class ids'}")
        return check_prompts(negative_prompt, "negative_prompt", many=False)[0]

    def _prompt_request(self, prompts: list[str], num_images: int | None, size: int,
                        negative_prompt: str | None = None) -> Request:
        """The request of ``prompts`` (repeated in turn to ``num_images``, guided against ``negative_prompt`` when
        given), encoded chunk by chunk: all of them once when they fit in a chunk (so that a one-chunk call pads
        them together, as one batch does), else each chunk's distinct prompts."""
        count = len(prompts) if num_images is None else int(num_images)
        self.check_output(count)
        every = [prompts[i % len(prompts)] for i in range(count)]
        encode = self.prompt_encoder
        if negative_prompt is not None:
            def encode(texts: list[str]) -> Condition:
                return self.prompt_encoder(texts, negative_prompt=negative_prompt)
        if len(prompts) <= size:
            encoded: list[Condition] = []

            def condition(rows: range) -> Condition:
                if not encoded:
                    encoded.append(encode(prompts))
                return encoded[0][torch.arange(rows.start, rows.stop) % len(prompts)]
        else:
            def condition(rows: range) -> Condition:
                used = sorted({i % len(prompts) for i in rows})
                where = {j: n for n, j in enumerate(used)}
                return encode([prompts[j] for j in used])[torch.tensor([where[i % len(prompts)] for i in rows])]
        return Request([], every, count, size, condition)

    def check_output(self, count: int | None) -> None:
        """Refuse ``count`` images whose pixels would not fit in one call's output (None: not known yet)."""
        if count is not None:
            check_output_size(count, 1, self.info.image_size)

    def condition(self, class_ids: Sequence[ClassLabel] | ClassLabel | None, prompt: str | Sequence[str] | None,
                  prompt_embeds: torch.Tensor | None, prompt_attention_mask: torch.Tensor | None,
                  num_images: int | None,
                  prompt_ids: torch.Tensor | None = None) -> tuple[Condition, list[int], list[str]]:
        """The sampler's condition for a whole request (:meth:`request`, drawn as one batch), and the class ids
        and prompts it stands for."""
        req = self.request(class_ids, prompt, prompt_embeds, prompt_attention_mask, num_images, prompt_ids,
                           batch_size=MAX_SAMPLES)
        return req.condition(range(req.count)).to(self.device), req.class_ids, req.prompts

    @torch.no_grad()
    def sample_chunks(self, class_ids: Sequence[ClassLabel] | ClassLabel | None = None, *,
                      num_images: int | None = None, sampler: str | Sampler | None = None, seed: int | None = 0,
                      generator: torch.Generator | None = None, cfg_scale: float | None = None,
                      cfg_interval: int | None = None, temperature: float | None = None, top_k: int | None = None,
                      top_p: float | None = None, progress: bool = False, prefix: torch.Tensor | None = None,
                      prompt: str | Sequence[str] | None = None, prompt_embeds: torch.Tensor | None = None,
                      prompt_attention_mask: torch.Tensor | None = None, prompt_ids: torch.Tensor | None = None,
                      batch_size: int | None = None, negative_prompt: str | None = None,
                      **sampler_options) -> tuple[Request, Iterator[SampleOutput]]:
        """:meth:`sample_tokens`'s request, checked whole, and an iterator that draws it chunk by chunk: each
        chunk's tokens and stats, one chunk of at most ``batch_size`` in memory at a time."""
        check_seed(seed)
        check_generator(generator, self.device)
        req = self.request(class_ids, prompt, prompt_embeds, prompt_attention_mask, num_images, prompt_ids,
                           batch_size, negative_prompt)
        given = {"cfg_scale": cfg_scale, "cfg_interval": cfg_interval, "temperature": temperature,
                 "top_k": top_k, "top_p": top_p}
        params = SamplingParams(**merge_settings(self.info.defaults, given))
        sampler_obj = get_sampler(sampler or default_sampler(self.model), **sampler_options)
        if prefix is not None and not sampler_obj.continues:
            raise ValueError(f"the {sampler_obj.name!r} sampler cannot continue given tokens; samplers that can: "
                             f"{continuing_samplers()}")
        if generator is None:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(0 if seed is None else int(seed))

        def draw() -> Iterator[SampleOutput]:
            with contextlib.closing(SharedBar(req.count * self.model.num_tokens, sampler_obj.name, progress)) as bar:
                for rows in req.chunks():
                    continuation = {}
                    if prefix is not None:
                        rows_prefix = prefix[rows.start:rows.stop] if _rows_of(prefix) == req.count else prefix
                        continuation = {"prefix": rows_prefix.to(self.device)}
                    yield sampler_obj.sample(self.model, req.condition(rows).to(self.device), params,
                                             generator=generator, progress=bar, tokenizer=self.tokenizer,
                                             draft_head=self.draft_head, **continuation)
        return req, draw()

    def sample_tokens(self, class_ids: Sequence[ClassLabel] | ClassLabel | None = None,
                      **kwargs) -> tuple[SampleOutput, list[int], list[str]]:
        """Draw the tokens of one image per entry of ``class_ids`` (class ids or the pipeline's class names), or for a
        text-to-image model per ``prompt`` (through the pipeline's prompt encoder), per row of ``prompt_embeds``
        [B, L, D] (text-encoder features, padded as ``prompt_attention_mask`` [B, L] says) or, for a model
        conditioned on prompt token ids (Janus), per row of ``prompt_ids`` [B, L] (left-padded as
        ``prompt_attention_mask`` says; none: all real), repeated in turn to ``num_images`` if given. Every argument
        is checked before sampling starts (:mod:`vgen.pipelines.inputs`). ``negative_prompt`` (with ``prompt=``,
        for a pipeline that ``takes_negative_prompt``: Emu3) replaces the text guidance steers away from.

        ``sampler`` defaults to one token per pass (``ar``, or ``continuous-ar`` for a continuous model).
        Sampling settings left as ``None`` take the pipeline's recommended defaults. ``seed`` seeds a fresh
        ``torch.Generator`` (ignored when ``generator`` is given): the same seed gives the same images.
        ``prefix`` [B, n] holds given leading tokens of every sample, for a sampler that continues them.

        ``batch_size`` (default: the pipeline's ``batch_size``) bounds what is drawn at once: a larger request is
        drawn as consecutive chunks of ``batch_size`` images (the last one shorter), one after the other with the
        one generator, so it draws exactly what those calls made in turn with a shared ``generator`` draw, and a
        request of at most ``batch_size`` images is one batch. The stats of a chunked request add up: forward
        passes, drawn tokens, wall time and rows (``batch_size``) are summed, accepted lengths and ``accept_step``
        rows concatenated (each row's passes counted within its chunk), ``details["chunks"]`` counts the chunks.
        """
        req, outputs = self.sample_chunks(class_ids, **kwargs)
        out = [o for o in outputs]
        return (SampleOutput(torch.cat([o.tokens for o in out]), stacked_stats([o.stats for o in out])),
                req.class_ids, req.prompts)

    def __call__(self, class_ids: Sequence[ClassLabel] | ClassLabel | None = None, **kwargs) -> PipelineOutput:
        """Generate one image per entry of ``class_ids`` (or per prompt): :meth:`sample_tokens`'s arguments, the
        tokens decoded to images chunk by chunk."""
        req, outputs = self.sample_chunks(class_ids, **kwargs)
        images, tokens, stats = [], [], []
        for out in outputs:
            images += self.decode(out.tokens)
            tokens.append(out.tokens.cpu())
            stats.append(out.stats)
        return PipelineOutput(images, torch.cat(tokens), req.class_ids, stacked_stats(stats), req.prompts)

    @torch.no_grad()
    def logits(self, class_ids: Sequence[ClassLabel] | ClassLabel | None = None, *, tokens: torch.Tensor,
               prompt: str | Sequence[str] | None = None, prompt_embeds: torch.Tensor | None = None,
               prompt_attention_mask: torch.Tensor | None = None, prompt_ids: torch.Tensor | None = None,
               unconditional: bool = False, negative_prompt: str | None = None) -> torch.Tensor:
        """The backbone's next-token logits at every step of given images, teacher-forced: for one condition per
        row of ``tokens`` [B, n] (class ids, ``prompt``, ``prompt_embeds`` or ``prompt_ids``, as
        :meth:`sample_tokens` takes them), fp32 logits [B, n, V] whose entry ``[b, i]`` is the distribution of
        token ``i`` given the condition and ``tokens[b, :i]``: what a one-token-per-pass sampler computes at step
        ``i``, before guidance, temperature or filtering (for checking a port against its original).

        ``unconditional=True`` gives the batch classifier-free guidance runs, [2B, n, V]: the conditional rows,
        then the same tokens under the null condition (``model.null_condition``: the ``negative_prompt``'s rows
        where one is given); the guided logits at scale s are ``u + s * (c - u)`` of the two halves."""
        if is_continuous(self.model) or getattr(self.model, "token_order", "raster") != "raster":
            raise ValueError(f"{self.info.name} does not draw one codebook token per step; logits() is for "
                             f"raster next-token models")
        req = self.request(class_ids, prompt, prompt_embeds, prompt_attention_mask, None, prompt_ids, MAX_SAMPLES,
                           negative_prompt)
        n = self.model.num_tokens
        if (not isinstance(tokens, torch.Tensor) or tokens.ndim != 2 or tokens.is_floating_point()
                or tokens.dtype == torch.bool or not 1 <= tokens.shape[1] <= n or len(tokens) != req.count):
            raise ValueError(f"tokens must be integer codes [{req.count}, 1..{n}] (one row per condition), got "
                             f"{short_repr(tokens) if not isinstance(tokens, torch.Tensor) else tokens.dtype} of "
                             f"shape {tuple(getattr(tokens, 'shape', ()))}")
        if int(tokens.min()) < 0 or int(tokens.max()) >= self.model.vocab_size:
            raise ValueError(f"tokens must lie in [0, {self.model.vocab_size})")
        cond = req.condition(range(req.count)).to(self.device)
        self.model.check_condition(cond)
        tokens = tokens.to(self.device).long()
        if unconditional:
            cond, tokens = cat_conditions([cond, self.model.null_condition(cond)]), torch.cat([tokens, tokens])
        return teacher_forced_logits(self.model, cond, tokens).float()

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


@dataclass
class Request:
    """What one pipeline call asks for: the class ids or prompts of every image (empty when not given that way),
    how many images, the chunk size, and the sampler's condition of a range of them (built when that chunk is
    drawn)."""

    class_ids: list[int]
    prompts: list[str]
    count: int
    batch_size: int
    condition: Callable[[range], Condition]

    def chunks(self) -> Iterator[range]:
        """The images of each chunk, in order: ``batch_size`` of them, the last chunk shorter."""
        for start in range(0, self.count, self.batch_size):
            yield range(start, min(start + self.batch_size, self.count))


def stacked_stats(chunks: list[SamplerStats]) -> SamplerStats:
    """The stats of chunks drawn one after the other as one request's: one chunk's unchanged; for several,
    passes, drawn tokens, wall time and rows summed, accepted lengths and ``accept_step`` rows concatenated
    (each row's passes counted within its chunk, so ``tokens_per_forward`` stays a per-row mean and
    ``batch_tokens_per_forward`` the tokens per batched pass), and ``details["chunks"]`` added."""
    if len(chunks) == 1:
        return chunks[0]
    first, steps = chunks[0], [c.accept_step for c in chunks]
    return SamplerStats(sampler=first.sampler, forward_passes=sum(c.forward_passes for c in chunks),
                        tokens=sum(c.tokens for c in chunks), wall_time_s=sum(c.wall_time_s for c in chunks),
                        batch_size=sum(c.batch_size for c in chunks),
                        draft_forward_passes=sum(c.draft_forward_passes for c in chunks),
                        accepted_lengths=[n for c in chunks for n in c.accepted_lengths],
                        accept_step=None if any(s is None for s in steps) else torch.cat(steps),
                        details={**first.details, "chunks": len(chunks)})


def prompt_id_condition(prompt_ids: Any, mask: Any) -> PrefixCondition:
    """``prompt_ids`` [B, L] (a token-id model's prompt rows, left-padded) with ``prompt_attention_mask`` [B, L]
    (1 or True on real positions; None: all real) as a condition; a ValueError naming the argument otherwise."""
    if not isinstance(prompt_ids, torch.Tensor) or prompt_ids.ndim != 2 or prompt_ids.is_floating_point() \
            or prompt_ids.dtype == torch.bool or not prompt_ids.numel():
        raise ValueError(f"prompt_ids must be integer token ids [batch, tokens], got "
                         f"{getattr(prompt_ids, 'dtype', type(prompt_ids).__name__)} of shape "
                         f"{tuple(getattr(prompt_ids, 'shape', ()))}")
    if mask is None:
        mask = torch.ones(prompt_ids.shape, dtype=torch.bool)
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != tuple(prompt_ids.shape):
        raise ValueError(f"prompt_attention_mask must be a tensor of prompt_ids' shape {tuple(prompt_ids.shape)}, got "
                         f"{tuple(getattr(mask, 'shape', ())) or type(mask).__name__}")
    mask = mask.to(prompt_ids.device).bool()
    if (mask[:, :-1] & ~mask[:, 1:]).any() or not mask[:, -1].all():
        raise ValueError("prompt_attention_mask must be left-padded (padding first, each row's tokens last, at least "
                         "one), as the prompt rows the model was trained on")
    return PrefixCondition(prompt_ids.long(), mask)


def _length(value: Any) -> int | None:
    """How many class ids a given list holds (None for one id, a name, or None)."""
    if value is None or isinstance(value, (str, bytes)) or getattr(value, "ndim", 1) == 0:
        return None
    return len(value) if hasattr(value, "__len__") else None


def _rows_of(prefix: Any) -> int | None:
    return len(prefix) if isinstance(prefix, torch.Tensor) and prefix.ndim >= 1 else None
