"""Samplers: the sampler contract, logits processing, and the registry (``get_sampler("ar")``)."""

from vgen.samplers.ar import ARSampler
from vgen.samplers.base import (
    SampleOutput,
    Sampler,
    SamplerStats,
    SamplingParams,
    available_samplers,
    check_inputs,
    continuing_samplers,
    get_sampler,
    register_sampler,
    samplers_taking,
)
from vgen.samplers.continuous import ContinuousARSampler, CSpD
from vgen.samplers.logits import (
    LogitsProcessor,
    LogitsProcessorList,
    Temperature,
    TopK,
    TopP,
    apply_cfg,
    build_processors,
    cfg_merge,
    sample_logits,
    sample_probs,
)
from vgen.samplers.nar import NARSampler
from vgen.samplers.nbp import NBPSampler
from vgen.samplers.speculative import GSD, MCSJD, SJD, Lantern, Speculative

__all__ = [
    "ARSampler",
    "CSpD",
    "ContinuousARSampler",
    "GSD",
    "MCSJD",
    "SJD",
    "Lantern",
    "NARSampler",
    "NBPSampler",
    "Speculative",
    "LogitsProcessor",
    "LogitsProcessorList",
    "SampleOutput",
    "Sampler",
    "SamplerStats",
    "SamplingParams",
    "Temperature",
    "TopK",
    "TopP",
    "apply_cfg",
    "available_samplers",
    "continuing_samplers",
    "build_processors",
    "cfg_merge",
    "check_inputs",
    "get_sampler",
    "register_sampler",
    "samplers_taking",
    "sample_logits",
    "sample_probs",
]
