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


@pytest.mark.parametrize("value, error, message", [
    (None, TypeError, "^vgen.load's name_or_path must be a str or Path, got NoneType$"),
    (3, TypeError, "got int$"),
    (b"shapes-c2i", TypeError, "got bytes$"),
    ("", ValueError, "^vgen.load's name_or_path is an empty string$"),
])
def test_a_name_or_path_of_another_type_is_refused_by_name(value, error, message):
    with pytest.raises(error, match=message):
        vgen.load(value)


def test_every_model_folder_of_a_pipeline_is_held_to_max_params(tiny_pipeline_dir):
    with pytest.raises(CheckpointError, match=r"over the limit of 1,000: pass max_params=\d+ to load"):
        vgen.load(tiny_pipeline_dir, max_params=1000)


@pytest.fixture
def llamagen_t2i_release(tmp_path, monkeypatch):
    """Writes files named and laid out as LlamaGen's t2i release (GPT under ``model``, VQ under ``model``), with
    GPT-XL and VQ-16 shrunk to tiny sizes; returns a function of the caption dim giving the GPT and the two paths."""
    from vgen.models import llamagen
    from vgen.tokenizers.vq import VQ_CONFIGS, VQConfig, VQModel

    monkeypatch.setitem(llamagen.GPT_SIZES, "GPT-XL", dict(n_layer=1, n_head=2, dim=32))
    tiny_vq = VQConfig(codebook_size=16384, ch=8, ch_mult=(1, 1, 1, 1, 1), num_res_blocks=1, z_channels=8,
                       norm_groups=4)
    monkeypatch.setitem(VQ_CONFIGS, "VQ-16", tiny_vq)

    def write(caption_dim: int):
        torch.manual_seed(0)
        gpt = llamagen.LlamaGenGPT(llamagen.llamagen_t2i_config_for(256, caption_dim=caption_dim))
        torch.save({"model": gpt.state_dict()}, tmp_path / "t2i_XL_stage1_256.pt")
        torch.save({"model": VQModel(tiny_vq).state_dict()}, tmp_path / "vq_ds16_t2i.pt")
        return gpt, tmp_path / "t2i_XL_stage1_256.pt", tmp_path / "vq_ds16_t2i.pt"

    return write


def test_llamagens_t2i_checkpoints_load_as_a_prompt_pipeline(llamagen_t2i_release, tmp_path):
    """The image size comes from the released file name, and the pipeline takes T5 features."""
    gpt, gpt_file, vq_file = llamagen_t2i_release(16)
    pipe = vgen.pipelines.load_llamagen_t2i(gpt_file, vq_file, caption_dim=16)
    assert pipe.text_conditional and pipe.info.image_size == 256 and pipe.model.prefix_len == 120
    assert pipe.info.defaults == {"cfg_scale": 7.5, "top_k": 1000}
    assert all(torch.equal(v, gpt.state_dict()[k]) for k, v in pipe.model.state_dict().items())
    out = pipe(prompt_embeds=torch.randn(1, 120, 16), prompt_attention_mask=torch.arange(120)[None] < 9)
    assert out.tokens.shape == (1, 256) and out.images[0].size == (256, 256)
    gpt_file.rename(tmp_path / "mine.pt")
    with pytest.raises(ValueError, match="cannot tell the image size of mine.pt: pass image_size"):
        vgen.pipelines.load_llamagen_t2i(tmp_path / "mine.pt", vq_file)


def test_with_a_t5_folder_a_llamagen_t2i_pipeline_takes_prompts_as_their_t5_features(llamagen_t2i_release,
                                                                                     tiny_t5_dir):
    from vgen.models.text_encoder import T5TextEncoder

    _, gpt_file, vq_file = llamagen_t2i_release(32)  # the tiny T5's width
    pipe = vgen.pipelines.load_llamagen_t2i(gpt_file, vq_file, caption_dim=32, t5_path=tiny_t5_dir)
    prompts = ["a red square", "a cat sat on the mat in front of the river"]
    embeds, mask = T5TextEncoder.from_pretrained(tiny_t5_dir).encode(prompts)
    out = pipe(prompt=prompts, num_images=3, seed=1)
    assert out.prompts == [prompts[0], prompts[1], prompts[0]] and out.class_ids == []
    given = pipe(prompt_embeds=embeds, prompt_attention_mask=mask, num_images=3, seed=1)
    assert torch.equal(out.tokens, given.tokens)
    with pytest.raises(ValueError, match="the prompt list is empty"):
        pipe(prompt=[])
    with pytest.raises(ValueError, match="give prompt or prompt_embeds, not both"):
        pipe(prompt=prompts, prompt_embeds=embeds)


def test_a_t5_of_another_width_is_refused_naming_both(llamagen_t2i_release, tiny_t5_dir):
    _, gpt_file, vq_file = llamagen_t2i_release(16)
    with pytest.raises(ValueError, match="gives 32-dim caption features but the model expects caption_dim=16"):
        vgen.pipelines.load_llamagen_t2i(gpt_file, vq_file, caption_dim=16, t5_path=tiny_t5_dir)


def test_without_a_text_encoder_a_prompt_is_refused(llamagen_t2i_release):
    _, gpt_file, vq_file = llamagen_t2i_release(16)
    pipe = vgen.pipelines.load_llamagen_t2i(gpt_file, vq_file, caption_dim=16)
    with pytest.raises(ValueError, match="has no text encoder loaded: load it with one .*--t5-path"):
        pipe(prompt="a red square")


def test_vgen_load_reads_a_janus_folder_as_a_prompt_pipeline(tiny_janus_dir):
    from vgen.models.janus import load_janus
    from vgen.samplers import ARSampler, SamplingParams

    pipe = vgen.load(tiny_janus_dir)
    assert pipe.text_conditional and pipe.info.defaults == {"cfg_scale": 5.0} and pipe.info.image_size == 8
    prompts = ["a red cat", "a big house under the moon"]
    out = pipe(prompt=prompts, temperature=0.0)
    loaded = load_janus(tiny_janus_dir)
    direct = ARSampler().sample(loaded.model.eval(), loaded.condition(prompts), SamplingParams(cfg_scale=5.0,
                                                                                              temperature=0.0))
    assert torch.equal(out.tokens, direct.tokens) and len(out.images) == 2 and out.images[0].size == (8, 8)
    with pytest.raises(ValueError, match="is a text-to-image model: give a prompt"):
        pipe([1])
