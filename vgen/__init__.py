"""vgen: visual autoregressive generation with fast samplers.

Public API: ``vgen.load(name_or_path)`` -> pipeline, ``vgen.load_llamagen(...)`` and ``vgen.load_llamagen_t2i(...)``
for LlamaGen's class-conditional and text-to-image checkpoints, the sampler registry (``vgen.samplers``). Imports
stay light: no gradio, no triton.
"""

from vgen.pipelines import ImagePipeline, PipelineOutput, available_models, load, load_llamagen, load_llamagen_t2i

__all__ = ["ImagePipeline", "PipelineOutput", "available_models", "load", "load_llamagen", "load_llamagen_t2i"]
__version__ = "0.1.0"
