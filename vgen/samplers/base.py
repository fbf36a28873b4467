"""The sampler contract: generation settings, the sampler config object, its output and stats, a registry.

A sampler is a small frozen dataclass (its own knobs only, e.g. a draft length) that round-trips through JSON;
the settings every sampler shares (temperature, top-k/top-p, classifier-free guidance) travel separately as
:class:`SamplingParams`, so the same settings can be handed to vanilla AR and to a speculative sampler alike.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, TypeVar

import torch
from torch import nn
from tqdm.auto import tqdm

from vgen.kernels.spec import SamplingSpec
from vgen.models.conditioning import Condition, cat_conditions
from vgen.samplers.options import check_options, option, short_repr

# accept_step goes into the stats JSON only up to this many entries (a 16x16 grid for a batch of 256)
MAX_JSON_ELEMENTS = 1 << 16
# guidance scales in use stay below 20; far above, the guided logits overflow to inf
MAX_CFG_SCALE = 100.0
# every numeric option has an upper bound that fits its meaning, generous for real models:
# tokens of one image or clip (LlamaGen's 384 / 512 px grids hold 576 / 1024, Emu3's 1024 px grid 16384)
MAX_TOKENS = 2**16
# entries of a codebook or token vocabulary (LlamaGen's VQ 16384; Chameleon's and Emu3's vocabularies 2**16 to 2**18)
MAX_VOCAB = 2**18
# logits that spread over tens of nats are all but uniform at temperature 100
MAX_TEMPERATURE = 100
CFG_SCHEDULES = ("constant", "linear")  # guidance over a sample's steps (scheduled_cfg_scale)
CFG_SCHEDULE_HELP = ("guidance over the blocks or tokens: the same scale throughout (constant) or ramped up to it "
                     "as MAR and NBP do (linear)")


def _from_fields(cls: type, d: Mapping[str, Any], what: str) -> Any:
    """``cls(**d)`` with a ValueError naming the unknown keys instead of a TypeError (and, for a sampler, the
    samplers that do take them)."""
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(d) - set(names))
    if unknown:
        takers = {name: samplers_taking(name) for name in unknown} if issubclass(cls, Sampler) else {}
        notes = [f"{name} is an option of {', '.join(samplers)}" for name, samplers in takers.items() if samplers]
        elsewhere = f" ({'; '.join(notes)})" if notes else ""
        raise ValueError(f"unknown {what} field(s) {unknown}; expected some of {names}{elsewhere}")
    return cls(**d)


@dataclass(frozen=True)
class SamplingParams:
    """Generation settings shared by all samplers, with LlamaGen's meaning.

    ``temperature`` 0 is greedy (argmax); ``top_k`` 0 and ``top_p`` 1.0 switch the filters off.
    Classifier-free guidance is used only when ``cfg_scale > 1``; ``cfg_interval`` >= 0 switches it off
    (conditional logits only) for image tokens after index ``cfg_interval + 1`` (LlamaGen counts decode steps
    from the token after the prefill's), -1 keeps it on for every token.
    """

    temperature: float = option(1.0, "sampling temperature", at_least=0, at_most=MAX_TEMPERATURE, note="0 = greedy")
    top_k: int = option(0, "keep the k most likely tokens", at_least=0, at_most=MAX_VOCAB, note="0 = off")
    top_p: float = option(1.0, "keep the smallest set of tokens with this much probability", above=0, at_most=1,
                          note="1 = off")
    cfg_scale: float = option(1.0, "classifier-free guidance scale", at_least=0, at_most=MAX_CFG_SCALE,
                              note="guidance only above 1")
    cfg_interval: int = option(-1, "guide the image tokens up to this decode step only", at_least=-1,
                               at_most=MAX_TOKENS, note="-1 = guide every token")

    def __post_init__(self) -> None:
        check_options(self)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def guided(self) -> bool:
        """Whether the batch is doubled as [cond; null] for classifier-free guidance."""
        return self.cfg_scale > 1

    def cfg_active(self, token_index: int | torch.Tensor) -> bool | torch.Tensor:
        """Whether guidance applies to the logits of image token ``token_index`` (an int or a tensor of them).

        Token 0 comes from the prefill; LlamaGen's decode index ``i`` is ``token_index - 1`` and guidance
        stops once ``i > cfg_interval``.
        """
        limit = math.inf if self.cfg_interval < 0 else self.cfg_interval + 1
        if isinstance(token_index, torch.Tensor):
            return (token_index <= limit) & self.guided
        return self.guided and token_index <= limit

    def scheduled_cfg_scale(self, schedule: str, done: int | torch.Tensor, total: int) -> float | torch.Tensor:
        """The guidance scale of a step once ``done`` of ``total`` steps (blocks, tokens) are drawn, this one
        included (an int or a tensor of them): ``cfg_scale`` for the ``constant`` schedule, or the ``linear`` ramp
        ``1 + (cfg_scale - 1) done / total`` of MAR and NBP, light on the first steps and full on the last."""
        if schedule not in CFG_SCHEDULES:
            raise ValueError(f"cfg_schedule must be one of {list(CFG_SCHEDULES)}, got {schedule!r}")
        return self.cfg_scale if schedule == "constant" else 1 + (self.cfg_scale - 1) * done / total

    def kernel_spec(self) -> SamplingSpec:
        """These settings as the probs kernel applies them."""
        return SamplingSpec(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                            cfg_scale=self.cfg_scale, guided=self.guided, greedy=self.greedy)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SamplingParams:
        return _from_fields(cls, d, "SamplingParams")


@dataclass(repr=False)
class SamplerStats:
    """What one ``sample`` call cost and, for speculative samplers, how the tokens were accepted.

    ``forward_passes`` counts target-model calls (prefill included), each serving the whole batch;
    ``tokens`` counts image tokens over the batch; ``accept_step[b, n]`` is the (1-based) target forward pass
    that produced token ``n`` of sample ``b``; ``accepted_lengths`` lists the tokens each verification gave a
    row (accepted drafts plus the recovered or bonus token; empty for AR); ``details`` holds the sampler's
    resolved settings (e.g. which drafter a preset picked). Tokens are image codes only: the fixed tokens a
    backbone writes among them (row ends, :mod:`vgen.models.layout`) are not counted.
    """

    sampler: str
    forward_passes: int
    tokens: int
    wall_time_s: float
    batch_size: int = 1
    draft_forward_passes: int = 0
    accepted_lengths: list[int] = field(default_factory=list)
    accept_step: torch.Tensor | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def row_tokens_per_forward(self) -> list[float]:
        """Each row's tokens per target pass it took (up to the pass that produced its last token, from
        ``accept_step``; every pass of the run without it): 1.0 for vanilla AR, at any batch size."""
        if not self.forward_passes:
            return [0.0] * self.batch_size
        row_tokens = self.tokens / self.batch_size
        if self.accept_step is None:
            return [row_tokens / self.forward_passes] * self.batch_size
        return (row_tokens / self.accept_step.amax(dim=1).clamp(min=1).double()).tolist()

    @property
    def tokens_per_forward(self) -> float:
        """Mean over rows of :attr:`row_tokens_per_forward`."""
        rows = self.row_tokens_per_forward
        return float(sum(rows) / len(rows)) if rows else 0.0

    @property
    def batch_tokens_per_forward(self) -> float:
        """Tokens of the whole batch per batched target pass (the batch runs until its slowest row is done)."""
        return self.tokens / self.forward_passes if self.forward_passes else 0.0

    @property
    def accepted_length_histogram(self) -> list[int]:
        """``h[n]`` = how many verifications gave a row ``n`` tokens."""
        hist = [0] * (max(self.accepted_lengths, default=0) + 1)
        for n in self.accepted_lengths:
            hist[n] += 1
        return hist

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.wall_time_s if self.wall_time_s > 0 else math.inf

    def to_dict(self, per_token: bool = False) -> dict[str, Any]:
        """JSON-ready figures: plain numbers, the accepted-length histogram and the sampler's details. With
        ``per_token`` also each verification's accepted length and ``accept_step`` as nested lists (the data of an
        acceptance map; left out above ``MAX_JSON_ELEMENTS`` entries)."""
        per_token_fields = ("accepted_lengths", "accept_step")
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in per_token_fields}
        d["tokens_per_forward"] = self.tokens_per_forward
        d["batch_tokens_per_forward"] = self.batch_tokens_per_forward
        d["accepted_length_histogram"] = self.accepted_length_histogram
        if per_token:
            d["accepted_lengths"] = [int(n) for n in self.accepted_lengths]
            if self.accept_step is not None and self.accept_step.numel() <= MAX_JSON_ELEMENTS:
                d["accept_step"] = self.accept_step.tolist()
        return d

    def __repr__(self) -> str:
        """The figures of :meth:`to_dict`, without the per-token arrays (``accept_step`` holds them)."""
        return f"SamplerStats({', '.join(f'{k}={v!r}' for k, v in self.to_dict().items())})"


@dataclass
class SampleOutput:
    """Generated image tokens [B, N] (raster order) and the statistics of the run."""

    tokens: torch.Tensor
    stats: SamplerStats


S = TypeVar("S", bound="Sampler")


@dataclass(frozen=True)
class Sampler(ABC):
    """A sampling algorithm as a small, validated, JSON-round-tripping config object."""

    name: ClassVar[str]
    # the generation order of the models it samples (a model's ``token_order`` attribute; see check_inputs)
    token_order: ClassVar[str] = "raster"
    # whether ``sample`` takes ``prefix=``: given leading tokens that it keeps and continues
    continues: ClassVar[bool] = False
    # what it does, in one line (``vgen samplers``)
    description: ClassVar[str] = ""
    # whether its preset draws the tokens of the plain sampler's distribution (True), approximately (False), or it
    # is the plain sampler of its models (None)
    lossless: ClassVar[bool | None] = None

    @abstractmethod
    def sample(self, model: nn.Module, cond: Condition, params: SamplingParams, *,
               generator: torch.Generator | None = None, progress: bool | SharedBar = False,
               tokenizer: nn.Module | None = None, draft_head: nn.Module | None = None) -> SampleOutput:
        """Generate ``model.num_tokens`` image tokens for each row of the condition ``cond`` (class ids [B] or a
        :class:`~vgen.models.conditioning.PrefixCondition`; see :mod:`vgen.models.conditioning`), counted on
        :func:`progress_bar` (a bar of its own when ``progress`` is true, or the :class:`SharedBar` ``progress``
        is). ``tokenizer`` and ``draft_head`` are for samplers that use them (LANTERN's latent neighbourhoods come
        from the codebook; a speculative sampler may draft with the head)."""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **asdict(self)}

    @classmethod
    def from_dict(cls: type[S], d: Mapping[str, Any]) -> S:
        """Rebuild from :meth:`to_dict`; on the base class the ``name`` key picks the registered subclass."""
        d = dict(d)
        name = d.pop("name", getattr(cls, "name", None))
        if cls is Sampler:
            return get_sampler(name, **d)
        if name != cls.name:
            raise ValueError(f"config is for sampler {name!r}, not {cls.name!r}")
        return _from_fields(cls, d, f"sampler {cls.name!r}")


_REGISTRY: dict[str, type[Sampler]] = {}
# the models of each token order, as ``vgen models`` and ``vgen samplers`` name them
MODEL_KINDS = {"raster": "next-token AR", "next-neighbour": "next-neighbour AR (NAR)",
               "next-block": "next-block AR (NBP)", "continuous": "continuous-token AR (diffusion head)"}


class SharedBar:
    """A progress bar of image tokens that several ``sample`` calls count on (a pipeline drawing a request in
    chunks), drawn from its first count on: a call refused before it draws a token shows none."""

    def __init__(self, total: int, desc: str, show: bool) -> None:
        self.total, self.desc, self.show, self.n = total, desc, show, 0
        self.bar: tqdm | None = None

    def update(self, count: int = 1) -> None:
        if self.bar is None:
            self.bar = tqdm(total=self.total, desc=self.desc, unit="tok", disable=not self.show)
        self.bar.update(count)
        self.n += count

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def progress_bar(progress: bool | SharedBar, total: int, desc: str) -> contextlib.AbstractContextManager:
    """The bar a sampler counts on, in one unit for every sampler: image tokens over all rows of the batch.
    ``progress`` itself when it is a :class:`SharedBar` (its owner closes it), else a new bar of ``total``
    tokens, shown when ``progress`` is true."""
    if isinstance(progress, SharedBar):
        return contextlib.nullcontext(progress)
    return tqdm(total=total, desc=desc, unit="tok", disable=not progress)


def register_sampler(cls: type[S]) -> type[S]:
    """Class decorator: make ``cls`` available to :func:`get_sampler` under ``cls.name``."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{cls.__name__} needs a non-empty class attribute 'name' to be registered")
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise ValueError(f"sampler name {name!r} is already taken by {_REGISTRY[name].__name__}")
    _REGISTRY[name] = cls
    return cls


def available_samplers(token_order: str | None = None) -> list[str]:
    """Registered sampler names; with ``token_order``, only those for models of that order (e.g. a model's
    ``getattr(model, "token_order", "raster")``)."""
    return sorted(n for n, cls in _REGISTRY.items() if token_order in (None, cls.token_order))


def samplers_taking(option: str) -> list[str]:
    """The registered sampler names that have the field ``option``."""
    return sorted(n for n, cls in _REGISTRY.items() if option in {f.name for f in dataclasses.fields(cls)})


def continuing_samplers() -> list[str]:
    """Registered sampler names whose ``sample`` continues given leading tokens (``prefix=``)."""
    return sorted(n for n, cls in _REGISTRY.items() if cls.continues)


def get_sampler(name_or_obj: str | Sampler | Mapping[str, Any], **kwargs: Any) -> Sampler:
    """A sampler from a registered name (``kwargs`` are its fields), a ``to_dict`` mapping, or an instance
    (returned as is, or a copy with ``kwargs`` replaced)."""
    if isinstance(name_or_obj, Sampler):
        if not kwargs:
            return name_or_obj
        cls = type(name_or_obj)
        return _from_fields(cls, {**asdict(name_or_obj), **kwargs}, f"sampler {cls.name!r}")
    if isinstance(name_or_obj, Mapping):
        return Sampler.from_dict({**name_or_obj, **kwargs})
    if not isinstance(name_or_obj, str):
        raise ValueError(f"sampler must be a registered name, a to_dict mapping or a Sampler, got "
                         f"{short_repr(name_or_obj)} ({type(name_or_obj).__name__})")
    if name_or_obj not in _REGISTRY:
        raise ValueError(f"unknown sampler {short_repr(name_or_obj)}; available: {', '.join(available_samplers())}")
    cls = _REGISTRY[name_or_obj]
    return _from_fields(cls, kwargs, f"sampler {cls.name!r}")


def check_inputs(sampler: Sampler, model: nn.Module, cond: Condition) -> None:
    """Raise a ValueError unless ``model`` generates in the sampler's ``token_order`` (the model's ``token_order``
    attribute; models without one, like LlamaGen's, are raster; the message names the samplers that fit it), is in
    eval mode, and ``cond`` is a condition the model takes (its ``check_condition``: valid class ids, or a prompt
    prefix for a text-conditioned model). Training mode would apply dropout and LlamaGen's class dropout while
    sampling."""
    order = getattr(model, "token_order", "raster")
    if order != sampler.token_order:
        raise ValueError(f"sampler {sampler.name!r} does not fit {type(model).__name__} ({order} tokens); samplers "
                         f"that do: {', '.join(available_samplers(order)) or 'none registered'}")
    if model.training:
        raise ValueError("the model is in training mode (dropout, class dropout); call model.eval() first")
    model.check_condition(cond)


def prepare_condition(sampler: Sampler, model: nn.Module, cond: Condition,
                      params: SamplingParams) -> tuple[Condition, Condition]:
    """:func:`check_inputs`, then ``cond`` on the model's device and the rows the model is run on: the condition,
    followed by its null form when guidance is on (the CFG batch ``[cond; null]``)."""
    check_inputs(sampler, model, cond)
    cond = cond.to(next(model.parameters()).device)
    return cond, cat_conditions([cond, model.null_condition(cond)]) if params.guided else cond
