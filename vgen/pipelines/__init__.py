"""Pipelines: tokenizer + backbone + sampler -> images (:mod:`~vgen.pipelines.image`), clips
(:mod:`~vgen.pipelines.video`) or streamed clips (:mod:`~vgen.pipelines.stream`), behind one ``__call__`` each;
:func:`load` picks the right one for a pipeline folder or an embedded default (:mod:`~vgen.pipelines.load`)."""

from vgen.pipelines.image import ImagePipeline, PipelineInfo, PipelineOutput, default_sampler, tokenizer_folder
from vgen.pipelines.load import (
    DEFAULT_MODEL,
    DEFAULT_TEXT_MODEL,
    LLAMAGEN_T2I_CONFIG,
    LLAMAGEN_T2I_DEFAULTS,
    RELEASED_FOLDERS,
    LlamaGenT2IConfig,
    available_models,
    is_model_folder,
    load,
    load_anole_pipeline,
    load_emu3_pipeline,
    load_janus_pipeline,
    load_llamagen,
    load_llamagen_t2i,
    load_lumina_pipeline,
    pipeline_folder,
    write_llamagen_t2i_config,
)
from vgen.pipelines.stream import StreamOutput, StreamPipeline
from vgen.pipelines.video import VideoOutput, VideoPipeline, tile_clips

__all__ = ["DEFAULT_MODEL", "DEFAULT_TEXT_MODEL", "LLAMAGEN_T2I_CONFIG", "LLAMAGEN_T2I_DEFAULTS", "RELEASED_FOLDERS",
           "ImagePipeline", "LlamaGenT2IConfig", "PipelineInfo", "PipelineOutput", "StreamOutput", "StreamPipeline",
           "VideoOutput", "VideoPipeline", "available_models", "default_sampler", "is_model_folder", "load",
           "load_anole_pipeline", "load_emu3_pipeline", "load_janus_pipeline", "load_llamagen", "load_llamagen_t2i",
           "load_lumina_pipeline", "pipeline_folder", "tile_clips", "tokenizer_folder", "write_llamagen_t2i_config"]
