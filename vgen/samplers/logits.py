"""Logits processing shared by every sampler: temperature, top-k, top-p, guidance, drawing tokens.

The numerics are LlamaGen's ``sample()``: guided logits ``uncond + scale * (cond - uncond)``, divided by the
temperature, top-k (keep values >= the k-th largest, so ties survive), top-p (HF nucleus: keep the smallest
sorted prefix whose mass reaches ``top_p``, the first token always; ties in the order of the vocabulary),
softmax, one multinomial draw. Everything works on logits of any leading shape [..., V], so a speculative sampler
processes a draft window [B, k, V] at once. :func:`target_probs` is the whole chain as one op (a fused Triton
kernel on CUDA, ``vgen.kernels``), which every sampler calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import replace

import torch

from vgen.kernels.dispatch import kernel_op
from vgen.samplers.base import SamplingParams


class LogitsProcessor(ABC):
    """Maps logits [..., V] to logits of the same shape; never modifies its input in place."""

    @abstractmethod
    def __call__(self, logits: torch.Tensor) -> torch.Tensor: ...


class Temperature(LogitsProcessor):
    """Divide by ``temperature`` > 0 (greedy decoding, temperature 0, is :func:`sample_logits`'s argmax)."""

    def __init__(self, temperature: float) -> None:
        if not temperature > 0:
            raise ValueError(f"Temperature needs temperature > 0, got {temperature} "
                             f"(temperature 0 means greedy and is not a processor)")
        self.temperature = temperature

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        return logits if self.temperature == 1 else logits / self.temperature


class TopK(LogitsProcessor):
    """Keep the logits >= the ``top_k``-th largest per row (ties included); 0 or >= V keeps everything."""

    def __init__(self, top_k: int) -> None:
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise ValueError(f"TopK needs an integer top_k >= 0 (0 = off), got {top_k!r}")
        self.top_k = top_k

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if self.top_k == 0 or self.top_k >= logits.shape[-1]:
            return logits
        kth = torch.topk(logits, self.top_k, dim=-1).values[..., -1:]
        return logits.masked_fill(logits < kth, -torch.inf)


class TopP(LogitsProcessor):
    """Nucleus filtering: drop a token once the mass ranked above it exceeds ``top_p``; 1.0 is off. Equal logits
    rank in vocabulary order (a stable sort), so ties at the boundary are cut the same way on every device."""

    def __init__(self, top_p: float) -> None:
        if not 0 < top_p <= 1:
            raise ValueError(f"TopP needs top_p in (0, 1] (1 = off), got {top_p}")
        self.top_p = top_p

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if self.top_p == 1:
            return logits
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
        mass = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = torch.zeros_like(mass, dtype=torch.bool)
        drop_sorted[..., 1:] = mass[..., :-1] > self.top_p
        return logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), -torch.inf)


class LogitsProcessorList(list):
    """A chain of processors applied in order (itself a processor)."""

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        for processor in self:
            logits = processor(logits)
        return logits


def build_processors(params: SamplingParams) -> LogitsProcessorList:
    """LlamaGen's order, temperature -> top-k -> top-p, leaving out the settings that change nothing."""
    chain = LogitsProcessorList()
    if not params.greedy and params.temperature != 1:
        chain.append(Temperature(params.temperature))
    if params.top_k:
        chain.append(TopK(params.top_k))
    if params.top_p < 1:
        chain.append(TopP(params.top_p))
    return chain


def cfg_merge(cond_logits: torch.Tensor, uncond_logits: torch.Tensor, scale: float) -> torch.Tensor:
    """Classifier-free guidance ``uncond + scale * (cond - uncond)``."""
    return uncond_logits + (cond_logits - uncond_logits) * scale


def apply_cfg(logits: torch.Tensor, params: SamplingParams, token_index: int | torch.Tensor) -> torch.Tensor:
    """Logits [B, ...] of the samples from the model's output on the CFG batch [2B, ...] ([cond; null]).

    ``token_index`` is the image-token index the logits predict: an int, or a tensor broadcasting against
    ``logits.shape[1:-1]`` (e.g. [k] for a window). Where guidance is off (:meth:`SamplingParams.cfg_active`)
    the conditional half is used; without guidance the logits pass through.
    """
    if not params.guided:
        return logits
    cond, uncond = logits.chunk(2)
    active = params.cfg_active(token_index)
    if isinstance(active, torch.Tensor):
        return torch.where(active[..., None], cfg_merge(cond, uncond, params.cfg_scale), cond)
    return cfg_merge(cond, uncond, params.cfg_scale) if active else cond


def sample_probs(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of ``probs`` [..., V] (LongTensor [...]) by ``torch.multinomial``."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """One token per row of ``probs`` [..., V] (not necessarily normalised) for given uniform draws [...] in
    [0, 1): the first token whose running mass exceeds ``uniforms`` times the total, summed in ``dtype`` (float64
    by default). The draws are explicit so that a kernel handed the same numbers picks the same tokens."""
    cdf = probs.to(dtype).cumsum(-1)
    index = torch.searchsorted(cdf, uniforms.to(dtype)[..., None] * cdf[..., -1:], right=True)[..., 0]
    last = torch.where(probs > 0, torch.arange(probs.shape[-1], device=probs.device), 0).amax(-1)
    return torch.minimum(index, last)  # a draw rounding up to the total takes the last possible token


def to_probs(logits: torch.Tensor, greedy: bool = False) -> torch.Tensor:
    """The distribution [..., V] of processed logits: ``softmax``, or under greedy decoding the one-hot argmax
    (the limit of temperature -> 0)."""
    if greedy:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).to(logits.dtype)
    return logits.softmax(dim=-1)


def draw(probs: torch.Tensor, greedy: bool = False, generator: torch.Generator | None = None) -> torch.Tensor:
    """Tokens [...] from distributions [..., V]: the argmax under greedy decoding (drawing nothing from
    ``generator``), else one multinomial draw per row."""
    return probs.argmax(dim=-1) if greedy else sample_probs(probs, generator)


def sample_logits(logits: torch.Tensor, greedy: bool = False,
                  generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens [...] and their distribution [..., V] from processed logits [..., V] (:func:`to_probs`, :func:`draw`)."""
    probs = to_probs(logits, greedy)
    return draw(probs, greedy, generator), probs


def _target_probs_kernel(logits: torch.Tensor, params: SamplingParams,
                         token_index: int | torch.Tensor) -> torch.Tensor:
    """:func:`target_probs` on its Triton kernel."""
    from vgen.kernels import probs  # imports triton, an optional dependency

    return probs.target_probs(logits, params.kernel_spec(), params.cfg_active(token_index))


@kernel_op("probs", _target_probs_kernel)
def target_probs(logits: torch.Tensor, params: SamplingParams, token_index: int | torch.Tensor) -> torch.Tensor:
    """The target distribution [B, ..., V] from the model's logits [R, ..., V] (R = 2B, [cond; null], under
    guidance) predicting image tokens ``token_index`` (as in :func:`apply_cfg`): CFG merge, temperature, top-k,
    top-p and softmax (the one-hot argmax when greedy), for every position of a window at once."""
    return to_probs(build_processors(params)(apply_cfg(logits, params, token_index)), params.greedy)


def nucleus_edge(logits: torch.Tensor, params: SamplingParams, token_index: int | torch.Tensor,
                 tolerance: float = 1e-5) -> torch.Tensor:
    """Bool [B, ..., V]: the tokens of :func:`target_probs` whose probability mass ranked before them (in float64)
    lies within ``tolerance`` of ``top_p``. Only their fate float32 rounding may decide, so an implementation that
    sums in another order (the Triton kernel against torch's cumsum) may keep or drop them and still be right."""
    before_top_p = target_probs.reference(logits.double(), replace(params, top_p=1.0), token_index)
    if params.top_p >= 1:
        return torch.zeros_like(before_top_p, dtype=torch.bool)
    ranked, order = before_top_p.sort(dim=-1, descending=True, stable=True)
    mass_before = torch.empty_like(ranked).scatter_(-1, order, ranked.cumsum(-1) - ranked)
    return (before_top_p > 0) & ((mass_before - params.top_p).abs() < tolerance)
