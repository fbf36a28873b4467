"""Loading pipelines: a saved folder loads back equal (with its drafter), embedded defaults load by name, and a
name or folder that is not a pipeline fails with a specific error."""

from __future__ import annotations

import pytest
import torch

import vgen
from vgen.hub import CheckpointError
from vgen.models.draft_head import DraftHead, DraftHeadConfig
from vgen.pipelines import ImagePipeline, available_models, pipeline_folder


def test_save_and_load_round_trip(tiny_pipeline_dir, tmp_path):
    pipe = vgen.load(tiny_pipeline_dir)
    pipe.save_pretrained(tmp_path / "p")
    loaded = vgen.load(tmp_path / "p")
    assert loaded.info == pipe.info
    assert torch.equal(loaded(class_ids=[2], seed=4).tokens, pipe(class_ids=[2], seed=4).tokens)


def test_a_draft_head_travels_with_the_pipeline(tiny_pipeline_dir, tmp_path):
    pipe = vgen.load(tiny_pipeline_dir)
    pipe.draft_head = DraftHead(DraftHeadConfig.for_target(pipe.model.config)).eval()
    pipe.save_pretrained(tmp_path / "p")
    loaded = vgen.load(tmp_path / "p")
    assert isinstance(loaded.draft_head, DraftHead)
    out = loaded(class_ids=[1], seed=0, sampler="sjd", drafter="auto", window=4)
    assert out.stats.details["drafter"] == "head"
    assert torch.equal(out.tokens, loaded(class_ids=[1], seed=0, sampler="sjd", drafter="head", window=4).tokens)


def test_embedded_defaults_resolve_by_name_and_folders_by_path(tiny_pipeline_dir):
    assert "shapes-c2i" in available_models()
    assert pipeline_folder("shapes-c2i").name == "shapes-c2i"
    assert pipeline_folder(tiny_pipeline_dir) == tiny_pipeline_dir
    assert isinstance(vgen.load("shapes-c2i"), ImagePipeline)


def test_names_and_folders_that_are_not_pipelines_fail_specifically(tmp_path):
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        vgen.load("nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="not a vgen pipeline folder"):
        vgen.load(tmp_path / "empty")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "pipeline.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="bad .*pipeline.json"):
        vgen.load(tmp_path / "bad")


def test_llamagens_t2i_checkpoints_load_as_a_prompt_pipeline(tmp_path, monkeypatch):
    """Files named and laid out as LlamaGen's t2i release (GPT under ``model``, VQ under ``model``), with GPT-XL and
    VQ-16 shrunk to tiny sizes: the image size comes from the file name, and the pipeline takes T5 features."""
    from vgen.models import llamagen
    from vgen.tokenizers.vq import VQ_CONFIGS, VQConfig, VQModel

    monkeypatch.setitem(llamagen.GPT_SIZES, "GPT-XL", dict(n_layer=1, n_head=2, dim=32))
    tiny_vq = VQConfig(codebook_size=16384, ch=8, ch_mult=(1, 1, 1, 1, 1), num_res_blocks=1, z_channels=8,
                       norm_groups=4)
    monkeypatch.setitem(VQ_CONFIGS, "VQ-16", tiny_vq)
    torch.manual_seed(0)
    gpt = llamagen.LlamaGenGPT(llamagen.llamagen_t2i_config_for(256, caption_dim=16))
    torch.save({"model": gpt.state_dict()}, tmp_path / "t2i_XL_stage1_256.pt")
    torch.save({"model": VQModel(tiny_vq).state_dict()}, tmp_path / "vq_ds16_t2i.pt")
    pipe = vgen.pipelines.load_llamagen_t2i(tmp_path / "t2i_XL_stage1_256.pt", tmp_path / "vq_ds16_t2i.pt",
                                           caption_dim=16)
    assert pipe.text_conditional and pipe.info.image_size == 256 and pipe.model.prefix_len == 120
    assert pipe.info.defaults == {"cfg_scale": 7.5, "top_k": 1000}
    assert all(torch.equal(v, gpt.state_dict()[k]) for k, v in pipe.model.state_dict().items())
    out = pipe(prompt_embeds=torch.randn(1, 120, 16), prompt_attention_mask=torch.arange(120)[None] < 9)
    assert out.tokens.shape == (1, 256) and out.images[0].size == (256, 256)
    (tmp_path / "t2i_XL_stage1_256.pt").rename(tmp_path / "mine.pt")
    with pytest.raises(ValueError, match="cannot tell the image size of mine.pt: pass image_size"):
        vgen.pipelines.load_llamagen_t2i(tmp_path / "mine.pt", tmp_path / "vq_ds16_t2i.pt")
