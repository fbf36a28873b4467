"""Loading pipelines: a saved folder loads back equal (with its drafter), embedded defaults load by name, and a
name or folder that is not a pipeline fails with a specific error."""

from __future__ import annotations

import inspect
import json

import numpy as np
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
    with pytest.raises(CheckpointError, match="not a vgen pipeline folder .*, nor a LlamaGen-T2I one "
                                              r"\(no llamagen_t2i.json\) or a released Janus-Pro, Emu3, "
                                              "Lumina-mGPT, Anole one"):
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


@pytest.mark.parametrize("loader", ["load_llamagen", "load_llamagen_t2i"])
def test_the_llamagen_loaders_take_every_argument_after_the_two_files_by_keyword(loader):
    parameters = list(inspect.signature(getattr(vgen.pipelines, loader)).parameters.values())
    assert [p.name for p in parameters[:2]] == ["gpt_ckpt", "vq_ckpt"]
    assert {p.kind for p in parameters[2:]} == {inspect.Parameter.KEYWORD_ONLY}
    with pytest.raises(TypeError, match="positional"):
        getattr(vgen.pipelines, loader)("gpt.pt", "vq.pt", "GPT-B", 256)


def test_a_checkpoint_given_to_the_other_llamagen_loader_names_the_right_one(llamagen_t2i_release, tmp_path):
    from vgen.models.llamagen import LlamaGenGPT, llamagen_config_for

    _, t2i_file, vq_file = llamagen_t2i_release(16)
    with pytest.raises(CheckpointError) as caught:
        vgen.pipelines.load_llamagen(t2i_file, vq_file, gpt_model="GPT-XL")
    assert str(caught.value) == (f"GPT checkpoint {t2i_file} is a LlamaGen text-to-image model (caption projection "
                                 f"cls_embedding.cap_proj): load it with load_llamagen_t2i (`vgen sample --t5-path`), "
                                 f"or name its files in a folder with `vgen t2i-config`")
    c2i_file = tmp_path / "c2i_XL_256.pt"
    torch.save({"model": LlamaGenGPT(llamagen_config_for("GPT-XL", 256)).state_dict()}, c2i_file)
    with pytest.raises(CheckpointError, match=r"^GPT checkpoint .*c2i_XL_256.pt is a LlamaGen class-conditional model "
                                              r"\(class table cls_embedding.embedding_table\): load it with "
                                              r"load_llamagen$"):
        vgen.pipelines.load_llamagen_t2i(c2i_file, vq_file, image_size=256)
    assert vgen.pipelines.load_llamagen(c2i_file, vq_file, gpt_model="GPT-XL").info.image_size == 256


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


def test_a_janus_pipeline_takes_its_own_prompt_token_ids_and_refuses_embeddings_in_one_line(tiny_janus_dir):
    from vgen.models.janus import janus_condition, load_janus

    pipe = vgen.load(tiny_janus_dir)
    prompts = ["a red cat", "a big house under the moon"]
    ids = janus_condition(load_janus(tiny_janus_dir).processor, prompts)  # the chat template's rows
    by_prompt = pipe(prompt=prompts, seed=3)
    by_ids = pipe(prompt_ids=ids.values, prompt_attention_mask=ids.mask.long(), seed=3)
    assert torch.equal(by_ids.tokens, by_prompt.tokens) and by_ids.prompts == []
    one = ids.values[1:, int((~ids.mask[1]).sum()):]  # an unpadded row needs no mask
    assert torch.equal(pipe(prompt_ids=one, temperature=0.0).tokens,
                       pipe(prompt=prompts[1:], temperature=0.0).tokens)
    for kwargs, message in [
            (dict(prompt_embeds=torch.zeros(1, 3, 8)), "is conditioned on prompt token ids, not embeddings: give "
                                                      "prompt= or prompt_ids= \\(with prompt_attention_mask=\\)"),
            (dict(prompt_ids=ids.values.float()), "prompt_ids must be integer token ids"),
            (dict(prompt_ids=ids.values, prompt_attention_mask=ids.mask.flip(1)), "must be left-padded"),
            (dict(prompt_ids=ids.values, prompt_attention_mask=ids.mask[:, 1:]), "prompt_ids' shape"),
            (dict(prompt_ids=ids.values + 1000), "must lie in \\[0, 128\\)"),
            (dict(prompt=prompts, prompt_ids=ids.values), "give prompt or prompt_ids, not both")]:
        with pytest.raises(ValueError, match=message) as caught:
            pipe(**kwargs)
        assert "\n" not in str(caught.value)


def test_a_llamagen_t2i_pipeline_refuses_prompt_ids(llamagen_t2i_release):
    _, gpt_file, vq_file = llamagen_t2i_release(16)
    pipe = vgen.pipelines.load_llamagen_t2i(gpt_file, vq_file, caption_dim=16)
    with pytest.raises(ValueError, match="is conditioned on text-encoder features, not token ids: give prompt= or "
                                         "prompt_embeds="):
        pipe(prompt_ids=torch.ones(1, 3, dtype=torch.long))


def test_a_llamagen_t2i_folder_loads_through_vgen_load_and_can_move(llamagen_t2i_release, tiny_t5_dir, tmp_path):
    """Files inside the folder are recorded relative to it, others absolute; ``vgen.load`` gives the pipeline
    ``load_llamagen_t2i`` gives for the same files."""
    import shutil

    from vgen.pipelines import LLAMAGEN_T2I_CONFIG, write_llamagen_t2i_config

    folder = tmp_path / "llamagen-t2i"
    gpt, gpt_file, vq_file = llamagen_t2i_release(32, folder)  # the tiny T5's width
    assert write_llamagen_t2i_config(folder, gpt_file, vq_file, t5_path=tiny_t5_dir, caption_dim=32) == folder
    recorded = json.loads((folder / LLAMAGEN_T2I_CONFIG).read_text())
    assert recorded == {"gpt_ckpt": "t2i_XL_stage1_256.pt", "vq_ckpt": "vq_ds16_t2i.pt", "image_size": 256,
                        "t5_path": str(tiny_t5_dir.absolute()), "gpt_model": "GPT-XL", "vq_model": "VQ-16",
                        "codebook_size": 16384, "codebook_embed_dim": 8, "caption_dim": 32,
                        "defaults": {"cfg_scale": 7.5, "top_k": 1000}}
    direct = vgen.pipelines.load_llamagen_t2i(gpt_file, vq_file, caption_dim=32, t5_path=tiny_t5_dir)
    moved = shutil.move(folder, tmp_path / "moved")
    pipe = vgen.load(moved)
    assert pipe.text_conditional and pipe.info.defaults == direct.info.defaults and pipe.info.image_size == 256
    assert all(torch.equal(v, gpt.state_dict()[k]) for k, v in pipe.model.state_dict().items())
    prompts = ["a red square", "a cat sat on the mat"]
    loaded_cond, direct_cond = pipe.prompt_encoder(prompts), direct.prompt_encoder(prompts)
    assert torch.equal(loaded_cond.values, direct_cond.values) and torch.equal(loaded_cond.mask, direct_cond.mask)
    assert torch.equal(pipe(prompt=prompts[:1], seed=3).tokens, direct(prompt=prompts[:1], seed=3).tokens)


def test_a_llamagen_t2i_folder_records_its_image_size_and_sampling_defaults(llamagen_t2i_release, tmp_path):
    from vgen.pipelines import write_llamagen_t2i_config

    _, gpt_file, vq_file = llamagen_t2i_release(16)
    mine = gpt_file.rename(tmp_path / "mine.pt")
    with pytest.raises(ValueError, match="cannot tell the image size of mine.pt: pass image_size"):
        write_llamagen_t2i_config(tmp_path / "f", mine, vq_file, caption_dim=16)
    defaults = {"cfg_scale": 3.0, "temperature": 0.9}
    write_llamagen_t2i_config(tmp_path / "f", mine, vq_file, image_size=256, caption_dim=16, defaults=defaults)
    pipe = vgen.load(tmp_path / "f")  # no T5: it takes T5 features
    assert pipe.info.defaults == defaults and pipe.info.image_size == 256
    out = pipe(prompt_embeds=torch.randn(1, 120, 16), prompt_attention_mask=torch.arange(120)[None] >= 100)
    assert out.tokens.shape == (1, 256)
    with pytest.raises(ValueError, match="has no text encoder loaded"):
        pipe(prompt="a red square")


@pytest.mark.parametrize(("edit", "message"), [
    (dict(vq_ckpt="gone.pt"), r"llamagen_t2i.json names vq_ckpt 'gone.pt', but .*gone.pt is not a file"),
    (dict(t5_path="nowhere"), r"names t5_path 'nowhere', but .*nowhere is not a folder"),
    (dict(t5_path="."), r"has no config.json"),  # the folder itself: a T5 folder of the wrong kind
    (dict(gpt="t2i_XL_stage1_256.pt"), r"bad .*llamagen_t2i.json: unknown keys \['gpt'\]"),
    (dict(image_size="256"), r"bad .*: image_size must be int, got '256'"),
    (dict(gpt_model="GPT-Q"), r"bad .*: unknown GPT model 'GPT-Q'"),
    (dict(defaults={"top_p": 0}), r"bad .*: top_p must be in \(0, 1\]"),
    (dict(defaults={"window": 4}), r"bad .*: defaults has unknown sampling settings \['window'\]"),
])
def test_a_llamagen_t2i_config_that_is_wrong_fails_in_one_line(llamagen_t2i_release, tmp_path, edit, message):
    from vgen.pipelines import LLAMAGEN_T2I_CONFIG, write_llamagen_t2i_config

    _, gpt_file, vq_file = llamagen_t2i_release(16)
    write_llamagen_t2i_config(tmp_path, gpt_file, vq_file, caption_dim=16)
    config = tmp_path / LLAMAGEN_T2I_CONFIG
    config.write_text(json.dumps({**json.loads(config.read_text()), **edit}))
    with pytest.raises((CheckpointError, ValueError, FileNotFoundError), match=message) as error:
        vgen.load(tmp_path)
    assert "\n" not in str(error.value)


def test_a_llamagen_t2i_config_that_is_not_a_json_object_or_lacks_a_file_is_refused(tmp_path):
    from vgen.pipelines import LLAMAGEN_T2I_CONFIG

    for text, message in (("{not json", "bad .*llamagen_t2i.json: Expecting property name"),
                          ("[]", "bad .*: expected a JSON object, got list"),
                          ('{"gpt_ckpt": "a.pt"}', r"bad .*: missing keys \['vq_ckpt', 'image_size'\]")):
        (tmp_path / LLAMAGEN_T2I_CONFIG).write_text(text)
        with pytest.raises(CheckpointError, match=message):
            vgen.load(tmp_path)


def test_writing_a_llamagen_t2i_config_checks_the_files_before_writing(llamagen_t2i_release, tiny_janus_dir,
                                                                      tmp_path):
    from vgen.pipelines import write_llamagen_t2i_config

    _, gpt_file, vq_file = llamagen_t2i_release(16)
    with pytest.raises(CheckpointError, match="VQ checkpoint not found: .*missing.pt"):
        write_llamagen_t2i_config(tmp_path / "f", gpt_file, tmp_path / "missing.pt")
    with pytest.raises(ValueError, match="holds a 'janus' model, not a T5 one"):
        write_llamagen_t2i_config(tmp_path / "f", gpt_file, vq_file, t5_path=tiny_janus_dir)
    with pytest.raises(ValueError, match="unknown VQ model 'VQ-32'"):
        write_llamagen_t2i_config(tmp_path / "f", gpt_file, vq_file, vq_model="VQ-32")
    assert not (tmp_path / "f").exists()


def test_load_sets_the_threads_asked_for_and_leaves_them_unasked(tiny_pipeline_dir, monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setattr(torch, "set_num_threads", lambda n: pytest.fail(f"set to {n} unasked"))
    vgen.load(tiny_pipeline_dir)
    monkeypatch.undo()
    try:
        vgen.load(tiny_pipeline_dir, threads=1)
        assert torch.get_num_threads() == 1
        with pytest.raises(ValueError, match="threads must be an integer >= 1 or 'auto', got 0"):
            vgen.load(tiny_pipeline_dir, threads=0)
    finally:
        torch.set_num_threads(before)


def test_a_lumina_folder_is_a_prompt_pipeline_with_the_inference_solvers_defaults_at_the_size_asked(tiny_lumina_dir):
    from vgen.models.chameleon import load_lumina
    from vgen.pipelines.load import is_model_folder, load_lumina_pipeline
    from vgen.samplers import ARSampler, SamplingParams

    assert is_model_folder(tiny_lumina_dir)
    with pytest.raises(ValueError, match=r"has no <reserved08824> \(needed for 768-px images\)"):
        vgen.load(tiny_lumina_dir)  # the released default size; the tiny tokenizer has sizes up to 96 px
    pipe = load_lumina_pipeline(tiny_lumina_dir, image_size=32)
    assert pipe.info.defaults == {"cfg_scale": 3.0, "top_k": 2000} and pipe.info.image_size == 32
    assert pipe.model.grid == (2, 2) and not pipe.takes_negative_prompt
    # prompts get what its 128 positions leave beside 2 rows of 2 codes, each with its row end, and <eoss>
    assert pipe.model.config.max_prompt_tokens == 128 - 2 * 3 - 1
    prompts = ["a red star", "a big blue cat on the moon"]
    out = pipe(prompt=prompts, temperature=0.0)
    loaded = load_lumina(tiny_lumina_dir, image_size=32)
    direct = ARSampler().sample(loaded.model, loaded.condition(prompts),
                                SamplingParams(cfg_scale=3.0, top_k=2000, temperature=0.0))
    assert torch.equal(out.tokens, direct.tokens) and out.images[0].size == (32, 32)
    with pytest.raises(ValueError, match="takes no negative_prompt"):
        pipe(prompt=prompts, negative_prompt="blurry")


def test_an_emu3_folder_is_a_prompt_pipeline_guided_against_the_docs_negative_prompt_or_the_one_given(tiny_emu3_dir):
    from vgen.models.emu3 import NEGATIVE_PROMPT, LoadedEmu3
    from vgen.pipelines.load import is_model_folder, load_emu3_pipeline
    from vgen.samplers import ARSampler, SamplingParams

    assert is_model_folder(tiny_emu3_dir)
    pipe = load_emu3_pipeline(tiny_emu3_dir, image_size=24)  # 3 x 3 codes of 8 px
    # the tiny folder's generation config sets no guidance: the original code's CFG 3 and top-k 2048
    assert pipe.info.defaults == {"cfg_scale": 3.0, "top_k": 2048} and pipe.info.image_size == 24
    assert pipe.takes_negative_prompt and pipe.model.grid == (3, 3)
    loaded, prompts = pipe.prompt_encoder.__self__, ["a red star", "a big blue dog on the moon"]
    assert isinstance(loaded, LoadedEmu3)  # the family's own prompt rows (tests/models/test_emu3.py)
    params = SamplingParams(cfg_scale=3.0, top_k=2048, temperature=0.0)
    for negative in (NEGATIVE_PROMPT, "lowres, blurry"):
        given = {} if negative == NEGATIVE_PROMPT else {"negative_prompt": negative}
        out = pipe(prompt=prompts, temperature=0.0, **given)
        direct = ARSampler().sample(pipe.model, loaded.condition(prompts, negative), params)
        assert torch.equal(out.tokens, direct.tokens) and out.images[0].size == (24, 24)
    # the negative prompt is what the guidance rows run: the conditional rows stay, the null rows change
    docs = pipe.logits(prompt=prompts, tokens=out.tokens, unconditional=True)
    own = pipe.logits(prompt=prompts, tokens=out.tokens, unconditional=True, negative_prompt="lowres, blurry")
    torch.testing.assert_close(docs[:2], own[:2], rtol=1e-4, atol=1e-5)  # batched with other padding: rounding
    assert (docs[2:] - own[2:]).abs().max() > 0.1
    with pytest.raises(ValueError, match="image_size 30 is not a positive multiple of Emu3's 8 pixels a code"):
        load_emu3_pipeline(tiny_emu3_dir, image_size=30)


def test_an_anole_folder_is_a_prompt_pipeline_with_anoles_sampling_settings(tiny_anole_dir):
    from vgen.pipelines.load import is_model_folder, load_anole_pipeline

    assert is_model_folder(tiny_anole_dir)
    pipe = load_anole_pipeline(tiny_anole_dir, image_size=32)
    assert pipe.info.defaults == {"cfg_scale": 3.0, "temperature": 0.7, "top_p": 0.9}
    assert pipe.info.image_size == 32 and pipe.model.grid == (2, 2) and not pipe.takes_negative_prompt
    out = pipe(prompt=["a red star", "a big blue cat on the moon"], sampler="mcsjd", seed=0)
    assert out.tokens.shape == (2, 4) and out.images[1].size == (32, 32)


def test_the_acceptance_map_of_a_model_with_row_ends_draws_its_codes_alone(tiny_lumina_dir):
    from vgen.pipelines.load import load_lumina_pipeline
    from vgen.visualize import acceptance_map, colormap

    pipe = load_lumina_pipeline(tiny_lumina_dir, image_size=64)  # 4 x 4 codes, a new-line token after each row
    out = pipe(prompt=["a red star", "a big blue cat on the moon"], sampler="mcsjd", seed=0)
    steps = out.stats.accept_step
    assert steps.shape == (2, 16) and out.stats.tokens == 32  # the row ends are neither drawn, counted nor mapped
    cell, last = 8, int(steps.max())
    picture = np.asarray(acceptance_map(steps[1], pipe.model.grid, 4 * cell, last))
    for code, step in enumerate(steps[1].tolist()):  # code (r, c) of the raster is cell (r, c) of the map
        r, c = divmod(code, 4)
        expected = colormap(np.array((step - 1) / max(last - 1, 1)))
        assert (picture[r * cell + cell // 2, c * cell + cell // 2] == expected).all()
