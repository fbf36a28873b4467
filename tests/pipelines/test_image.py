"""The image pipeline: images decoded from the sampled tokens, seeded determinism, the stored defaults, and
specific errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from vgen.models.conditioning import PrefixCondition
from vgen.models.llamagen import GPTConfig, LlamaGenGPT
from vgen.pipelines import ImagePipeline, PipelineInfo, load
from vgen.samplers import ARSampler, SamplingParams
from vgen.samplers.base import SharedBar
from vgen.tokenizers.vq import VQConfig, VQModel

TINY_VQ = VQConfig(codebook_size=32, ch=8, ch_mult=(1, 2, 2), num_res_blocks=1, z_channels=8, norm_groups=4)


def tiny_pipeline(num_classes: int = 3, block_size: int = 16) -> ImagePipeline:
    torch.manual_seed(0)
    gpt = LlamaGenGPT(GPTConfig(vocab_size=32, dim=32, n_layer=1, n_head=2, num_classes=num_classes,
                                block_size=block_size))
    with torch.no_grad():
        gpt.output.weight.normal_(std=0.5)
    info = PipelineInfo(name="tiny", image_size=16, class_names=["a", "b", "c"], defaults={"cfg_scale": 3.0})
    return ImagePipeline(gpt, VQModel(TINY_VQ), info)


def test_call_returns_pil_images_tokens_and_stats():
    out = tiny_pipeline()(class_ids=[1, 2], seed=0)
    assert [im.size for im in out.images] == [(16, 16), (16, 16)]
    assert out.tokens.shape == (2, 16) and out.class_ids == [1, 2]
    assert out.stats.sampler == "ar" and out.stats.forward_passes == 16 and out.stats.tokens == 32


def test_images_are_the_tokenizer_decoding_of_the_tokens():
    pipe = tiny_pipeline()
    out = pipe(class_ids=[0], seed=1)
    pixels = pipe.tokenizer.decode_code(out.tokens, (4, 4))
    expected = (pixels * 127.5 + 128).clamp(0, 255).to(torch.uint8)[0].permute(1, 2, 0)
    assert torch.equal(torch.from_numpy(np.array(out.images[0])), expected)


def test_pipeline_equals_the_sampler_with_the_stored_defaults():
    pipe = tiny_pipeline()
    out = pipe(class_ids=[0, 2], seed=7)
    ref = ARSampler().sample(pipe.model, torch.tensor([0, 2]), SamplingParams(cfg_scale=3.0),
                             generator=torch.Generator().manual_seed(7))
    assert torch.equal(out.tokens, ref.tokens)
    assert not torch.equal(pipe(class_ids=[0, 2], seed=7, cfg_scale=1.0).tokens, ref.tokens)


def test_same_seed_same_images_and_num_images_cycles_classes():
    pipe = tiny_pipeline()
    a, b = pipe([0, 1], seed=3, num_images=5), pipe([0, 1], seed=3, num_images=5)
    assert a.class_ids == [0, 1, 0, 1, 0]
    assert torch.equal(a.tokens, b.tokens)
    assert pipe(None, seed=0).class_ids == [0, 1, 2]  # default: every class once


def test_save_pretrained_writes_the_weights_in_the_dtype_asked_for(tmp_path):
    pipe = tiny_pipeline()
    pipe.save_pretrained(tmp_path / "p", dtype=torch.bfloat16)
    for part in ("gpt", "vq"):
        stored = load_file(tmp_path / "p" / part / "model.safetensors")
        assert {t.dtype for t in stored.values() if t.is_floating_point()} == {torch.bfloat16}
    loaded = load(tmp_path / "p")
    assert next(loaded.model.parameters()).dtype == torch.float32  # the weights load into fp32 models
    expected = {k: v.to(torch.bfloat16).float() for k, v in pipe.model.state_dict().items()}
    assert all(torch.equal(v, expected[k]) for k, v in loaded.model.state_dict().items() if v.is_floating_point())


def test_errors_are_specific():
    pipe = tiny_pipeline()
    with pytest.raises(ValueError, match="class id 3 is out of range for tiny with 3 classes"):
        pipe([3])
    with pytest.raises(ValueError, match="class_ids is empty"):
        pipe([])
    with pytest.raises(ValueError, match="does not match the model's 5x5 token grid"):
        ImagePipeline(LlamaGenGPT(GPTConfig(vocab_size=32, dim=32, n_layer=1, n_head=2, block_size=25)),
                      VQModel(TINY_VQ), PipelineInfo(name="x", image_size=16))
    with pytest.raises(ValueError, match="vocabulary 64 != tokenizer codebook 32"):
        ImagePipeline(LlamaGenGPT(GPTConfig(vocab_size=64, dim=32, n_layer=1, n_head=2, block_size=16)),
                      VQModel(TINY_VQ), PipelineInfo(name="x", image_size=16))


# ---- a text-to-image model: precomputed prompt embeddings (diffusers' prompt_embeds / prompt_attention_mask) ----
T2I_GPT = GPTConfig(vocab_size=32, dim=32, n_layer=1, n_head=2, block_size=16, model_type="t2i", caption_dim=8,
                    cls_token_num=6)


def tiny_t2i_pipeline() -> ImagePipeline:
    torch.manual_seed(0)
    gpt = LlamaGenGPT(T2I_GPT)
    with torch.no_grad():
        gpt.output.weight.normal_(std=0.5)
    return ImagePipeline(gpt, VQModel(TINY_VQ), PipelineInfo(name="tiny-t2i", image_size=16,
                                                             defaults={"cfg_scale": 3.0}))


def right_padded_prompts() -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts of 2 and 5 tokens in T5's layout: real tokens first, then padding (noise here), 7 positions."""
    embeds = torch.randn(2, 7, 8, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1, 1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0]])
    return embeds, mask


def test_prompt_embeds_are_left_padded_to_the_caption_length_and_sampled():
    pipe = tiny_t2i_pipeline()
    embeds, mask = right_padded_prompts()
    out = pipe(prompt_embeds=embeds, prompt_attention_mask=mask, seed=4)
    assert [im.size for im in out.images] == [(16, 16), (16, 16)] and out.class_ids == []
    # LlamaGen's left padding: the real tokens in order at the end of the 6 caption positions, zeros before
    values = torch.zeros(2, 6, 8)
    values[0, 4:], values[1, 1:] = embeds[0, :2], embeds[1, :5]
    cond = PrefixCondition(values, torch.tensor([[0, 0, 0, 0, 1, 1], [0, 1, 1, 1, 1, 1]]).bool())
    ref = ARSampler().sample(pipe.model, cond, SamplingParams(cfg_scale=3.0),
                             generator=torch.Generator().manual_seed(4))
    assert torch.equal(out.tokens, ref.tokens)
    greedy = pipe(prompt_embeds=embeds, prompt_attention_mask=mask, temperature=0.0).tokens
    # fewer padding positions, a bool mask, and the prompts repeated in turn: the same conditions
    again = pipe(prompt_embeds=embeds[:, :5], prompt_attention_mask=mask[:, :5].bool(), temperature=0.0,
                 num_images=3).tokens
    assert torch.equal(again, greedy[[0, 1, 0]])


def test_prompts_and_class_ids_go_to_the_models_that_take_them():
    t2i, embeds = tiny_t2i_pipeline(), right_padded_prompts()[0]
    with pytest.raises(ValueError, match="tiny-t2i is a text-to-image model: give a prompt"):
        t2i([0])
    with pytest.raises(ValueError, match="tiny is class-conditional: give class ids, not a prompt"):
        tiny_pipeline()(prompt_embeds=embeds)
    with pytest.raises(ValueError, match="give class ids or a prompt, not both"):
        t2i([0], prompt_embeds=embeds)
    with pytest.raises(ValueError, match="prompt_attention_mask was given without prompt_embeds"):
        t2i(prompt_attention_mask=torch.ones(2, 7))
    with pytest.raises(ValueError, match="a prompt of 7 tokens is longer than the model's 6 caption positions"):
        t2i(prompt_embeds=embeds)
    with pytest.raises(ValueError, match="a row of prompt_attention_mask has none"):
        t2i(prompt_embeds=embeds, prompt_attention_mask=torch.zeros(2, 7))
    with pytest.raises(ValueError, match="does not fit prompt_embeds of shape \\(2, 7, 8\\)"):
        t2i(prompt_embeds=embeds, prompt_attention_mask=torch.ones(2, 6))
    with pytest.raises(ValueError, match="dimension 5 do not fit this model's caption_dim 8"):
        t2i(prompt_embeds=torch.randn(1, 3, 5))


def test_a_t2i_pipeline_saves_and_loads(tmp_path):
    pipe = tiny_t2i_pipeline()
    embeds, mask = right_padded_prompts()
    loaded = load(pipe.save_pretrained(tmp_path / "t2i"))
    assert loaded.model.config == T2I_GPT
    assert torch.equal(loaded(prompt_embeds=embeds, prompt_attention_mask=mask).tokens,
                       pipe(prompt_embeds=embeds, prompt_attention_mask=mask).tokens)


# ---- large requests: drawn in chunks of batch_size, what a call returns bounded ------------------------------------
def drawn_batches(monkeypatch) -> list[int]:
    """The rows of every batch the AR sampler is asked to draw from here on."""
    sizes, sample = [], ARSampler.sample

    def spy(self, model, cond, *args, **kwargs):
        sizes.append(len(cond))
        return sample(self, model, cond, *args, **kwargs)

    monkeypatch.setattr(ARSampler, "sample", spy)
    return sizes


def test_a_request_larger_than_batch_size_is_drawn_chunk_by_chunk_from_one_generator(monkeypatch):
    pipe, classes = tiny_pipeline(), [0, 1, 2, 0, 1]
    batches = drawn_batches(monkeypatch)
    out = pipe(classes, seed=5, batch_size=2)
    assert batches == [2, 2, 1] and out.class_ids == classes and len(out.images) == 5
    generator = torch.Generator().manual_seed(5)
    chunks = [pipe(classes[i:i + 2], generator=generator) for i in (0, 2, 4)]
    assert torch.equal(out.tokens, torch.cat([c.tokens for c in chunks]))
    assert [np.array(im).tolist() for im in out.images] == [np.array(im).tolist() for c in chunks for im in c.images]
    stats = out.stats  # the chunks' figures added up: 3 chunks of 16 passes, 80 tokens, 5 rows
    assert (stats.forward_passes, stats.tokens, stats.batch_size, stats.details["chunks"]) == (48, 80, 5, 3)
    assert stats.accept_step.shape == (5, 16) and stats.tokens_per_forward == 1.0
    assert stats.batch_tokens_per_forward == 80 / 48
    assert stats.wall_time_s == pytest.approx(sum(c.stats.wall_time_s for c in chunks), rel=1.0)


def test_a_request_of_at_most_batch_size_is_one_batch_as_the_sampler_draws_it(monkeypatch):
    pipe, classes = tiny_pipeline(), [2, 0, 1, 1]
    ref = ARSampler().sample(pipe.model, torch.tensor(classes), SamplingParams(cfg_scale=3.0),
                             generator=torch.Generator().manual_seed(9))
    batches = drawn_batches(monkeypatch)
    for size in (None, 4, 100):  # the pipeline's default (64) and any batch_size the request fits in
        out = pipe(classes, seed=9, batch_size=size)
        assert torch.equal(out.tokens, ref.tokens) and "chunks" not in out.stats.details
    assert batches == [4, 4, 4]
    pipe.batch_size = 3  # the pipeline's own default, overridden per call
    assert pipe(classes, seed=9).stats.details["chunks"] == 2 and batches[-2:] == [3, 1]
    assert torch.equal(pipe.sample_tokens(classes, seed=9, batch_size=3)[0].tokens, pipe(classes, seed=9).tokens)


def test_prompts_are_encoded_chunk_by_chunk(tiny_t2i_pipeline_dir, monkeypatch):
    pipe = load(tiny_t2i_pipeline_dir)
    encode, encoded = pipe.prompt_encoder, []

    def spy(prompts):
        encoded.append(list(prompts))
        return encode(prompts)

    monkeypatch.setattr(pipe, "prompt_encoder", spy)
    prompts = ["a red star", "a blue ring", "a green heart", "a red star", "a white moon"]
    out = pipe(prompt=prompts, seed=1, batch_size=2)
    assert encoded == [prompts[0:2], prompts[2:4], prompts[4:]] and out.prompts == prompts
    generator = torch.Generator().manual_seed(1)
    chunks = [pipe(prompt=prompts[i:i + 2], generator=generator).tokens for i in (0, 2, 4)]
    assert torch.equal(out.tokens, torch.cat(chunks))
    encoded.clear()  # prompts that fit in a chunk, repeated to many images: encoded once, together
    assert pipe(prompt=["a red star", "a blue ring"], num_images=5, batch_size=2).prompts == prompts[:2] * 2 + [
        "a red star"]
    assert encoded == [prompts[:2]]


def test_embeddings_and_the_video_pipeline_are_drawn_in_chunks_too(tiny_video_pipeline_dir, monkeypatch):
    t2i, (embeds, mask) = tiny_t2i_pipeline(), right_padded_prompts()
    generator = torch.Generator().manual_seed(2)
    chunks = [t2i(prompt_embeds=embeds[rows], prompt_attention_mask=mask[rows], generator=generator).tokens
              for rows in ([0, 1], [0])]
    out = t2i(prompt_embeds=embeds, prompt_attention_mask=mask, num_images=3, seed=2, batch_size=2)
    assert torch.equal(out.tokens, torch.cat(chunks))
    video = load(tiny_video_pipeline_dir)
    clips = video([0, 1, 2], seed=4, batch_size=2)
    generator = torch.Generator().manual_seed(4)
    expected = [video(ids, generator=generator) for ids in ([0, 1], [2])]
    assert torch.equal(clips.tokens, torch.cat([e.tokens for e in expected]))
    assert np.array_equal(clips.videos, np.concatenate([e.videos for e in expected]))
    assert clips.stats.forward_passes == sum(e.stats.forward_passes for e in expected)
    assert clips.stats.details["chunks"] == 2 and clips.stats.accept_step.shape[0] == 3


def test_a_request_whose_images_cannot_fit_in_memory_is_refused_before_drawing(tiny_video_pipeline_dir, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("sampling started")

    monkeypatch.setattr(ARSampler, "sample", never)
    pipe = load("shapes-c2i")  # 64 x 64 px: 12 KiB an image, a million of them 11.4 GiB
    with pytest.raises(ValueError, match=r"^1000000 images of 64x64 pixels take 11.4 GiB, more than the 4 GiB one call "
                                         r"returns \(MAX_OUTPUT_BYTES\): draw them to disk in batches with `vgen "
                                         r"sample-many`$"):
        pipe(class_ids=[0] * 10**6)
    with pytest.raises(ValueError, match="`vgen sample-many`"):
        pipe(class_ids=[0], num_images=10**7)
    with pytest.raises(ValueError, match="`vgen sample-many`"):
        load("shapes-t2i")(prompt=["a red star"], num_images=10**6)
    with pytest.raises(ValueError, match="clips of 16x16 pixels take .*`vgen sample-many`"):
        load(tiny_video_pipeline_dir)(class_ids=[0], num_videos=2 * 10**6)


@pytest.mark.parametrize("batch_size", [0, -1, 1.5, "2", True, 10**30])
def test_a_bad_batch_size_is_refused_by_name(batch_size):
    with pytest.raises(ValueError, match="^batch_size must be an integer"):
        tiny_pipeline()([0], batch_size=batch_size)
    with pytest.raises(ValueError, match="^batch_size must be an integer"):
        ImagePipeline(tiny_pipeline().model, VQModel(TINY_VQ), PipelineInfo(name="x", image_size=16),
                      batch_size=batch_size)


# ---- logits(): the backbone's per-step logits for a condition, teacher-forced ----------------------------------
def test_logits_are_the_backbones_teacher_forced_next_token_logits_with_the_null_rows_for_cfg():
    pipe = tiny_pipeline()
    classes, tokens = torch.tensor([0, 2]), torch.randint(0, 32, (2, 16), generator=torch.Generator().manual_seed(0))
    logits = pipe.logits(class_ids=[0, "c"], tokens=tokens)
    assert logits.shape == (2, 16, 32) and logits.dtype == torch.float32
    torch.testing.assert_close(logits, pipe.model(classes, tokens[:, :-1]), rtol=0, atol=1e-5)
    both = pipe.logits(class_ids=[0, 2], tokens=tokens[:, :5], unconditional=True)  # [cond; null], a prefix
    torch.testing.assert_close(both[:2], logits[:, :5], rtol=0, atol=1e-5)
    torch.testing.assert_close(both[2:], pipe.model(pipe.model.null_condition(classes), tokens[:, :4]), rtol=0,
                               atol=1e-5)
    # an AR step's logits: greedy AR, guided at scale 3, takes the argmax of u + 3 (c - u) at every step
    greedy = pipe(class_ids=[0, 2], temperature=0.0).tokens
    both = pipe.logits(class_ids=[0, 2], tokens=greedy, unconditional=True)
    assert torch.equal((both[2:] + 3.0 * (both[:2] - both[2:])).argmax(-1), greedy)


def test_logits_of_a_text_model_take_its_prompt_embeddings():
    pipe, (embeds, mask) = tiny_t2i_pipeline(), right_padded_prompts()
    tokens = pipe(prompt_embeds=embeds, prompt_attention_mask=mask, temperature=0.0, cfg_scale=1.0).tokens
    logits = pipe.logits(prompt_embeds=embeds, prompt_attention_mask=mask, tokens=tokens)
    assert torch.equal(logits.argmax(-1), tokens)  # unguided greedy AR picks each step's argmax
    cond = PrefixCondition.from_padded(embeds, mask, 6)
    torch.testing.assert_close(logits, pipe.model(cond, tokens[:, :-1]), rtol=0, atol=1e-5)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(class_ids=[0, 1], tokens=torch.zeros(3, 4, dtype=torch.long)), r"tokens must be integer codes \[2, 1..16\]"),
    (dict(class_ids=[0], tokens=torch.zeros(1, 17, dtype=torch.long)), "tokens must be integer codes"),
    (dict(class_ids=[0], tokens=torch.zeros(1, 4)), "tokens must be integer codes"),
    (dict(class_ids=[0], tokens=[[1, 2]]), "tokens must be integer codes"),
    (dict(class_ids=[0], tokens=torch.full((1, 4), 32)), r"tokens must lie in \[0, 32\)"),
    (dict(class_ids=[5], tokens=torch.zeros(1, 4, dtype=torch.long)), "class id 5 is out of range"),
])
def test_bad_logits_requests_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny_pipeline().logits(**kwargs)


def test_logits_are_for_next_token_models(tiny_continuous_pipeline_dir):
    with pytest.raises(ValueError, match="does not draw one codebook token per step"):
        load(tiny_continuous_pipeline_dir).logits(class_ids=[0], tokens=torch.zeros(1, 4, dtype=torch.long))


def test_a_negative_prompt_reaches_the_prompt_encoder_of_every_chunk_of_a_model_that_takes_one(tiny_t2i_pipeline_dir):
    base, calls = load(tiny_t2i_pipeline_dir), []

    def encode(prompts, negative_prompt=None):
        calls.append((list(prompts), negative_prompt))
        return base.prompt_encoder(prompts)

    pipe = ImagePipeline(base.model, base.tokenizer, base.info, prompt_encoder=encode, takes_negative_prompt=True)
    req = pipe.request(None, ["a red star", "a blue ring", "a white moon"], None, None, None, batch_size=2,
                       negative_prompt="blurry")
    for rows in req.chunks():
        req.condition(rows)
    assert calls == [(["a red star", "a blue ring"], "blurry"), (["a white moon"], "blurry")]
    calls.clear()
    pipe.request(None, "a red star", None, None, None).condition(range(1))  # none: the encoder's own default
    assert calls == [(["a red star"], None)]
    with pytest.raises(ValueError, match="negative_prompt is empty"):
        pipe(prompt="a red star", negative_prompt=" ")
    with pytest.raises(ValueError, match="negative_prompt goes with prompt=, not prompt_embeds"):
        pipe(prompt_embeds=torch.zeros(1, 2, base.model.config.caption_dim), negative_prompt="blurry")
    with pytest.raises(ValueError, match="takes_negative_prompt needs the prompt_encoder"):
        ImagePipeline(base.model, base.tokenizer, base.info, takes_negative_prompt=True)


@pytest.mark.parametrize("kind", ["class", "text"])
def test_a_negative_prompt_is_refused_in_one_line_by_a_model_whose_guidance_takes_none(kind, tiny_t2i_pipeline_dir):
    pipe, condition = ((tiny_pipeline(), {"class_ids": [0]}) if kind == "class" else
                       (load(tiny_t2i_pipeline_dir), {"prompt": "a red star"}))
    with pytest.raises(ValueError, match=r"takes no negative_prompt: its guidance runs against the .* own "
                                         r"unconditional rows$"):
        pipe(negative_prompt="blurry", **condition)
    with pytest.raises(ValueError, match="takes no negative_prompt"):
        pipe.logits(tokens=torch.zeros(1, 4, dtype=torch.long), negative_prompt="blurry", **condition)


@pytest.mark.parametrize(("pipeline", "sampler", "options"), [
    ("tiny_pipeline_dir", "ar", {}), ("tiny_pipeline_dir", "mcsjd", {}),
    ("tiny_continuous_pipeline_dir", "continuous-ar", {"head_steps": 2}),
    ("tiny_continuous_pipeline_dir", "cspd", {"head_steps": 2})])
def test_a_request_counts_every_images_tokens_on_one_bar_whatever_the_sampler(pipeline, sampler, options, request,
                                                                              monkeypatch):
    import vgen.pipelines.image as image

    bars = []
    monkeypatch.setattr(image, "SharedBar", lambda *args: bars.append(SharedBar(*args)) or bars[-1])
    pipe = load(request.getfixturevalue(pipeline))
    pipe([0, 1, 2], sampler=sampler, batch_size=2, progress=True, **options)  # two chunks: 2 images, then 1
    (bar,) = bars
    assert bar.total == bar.n == bar.bar.n == 3 * pipe.model.num_tokens


def test_a_request_refused_by_its_sampler_shows_no_bar(tiny_pipeline_dir, capsys):
    with pytest.raises(ValueError, match="sampler 'cspd' does not fit"):
        load(tiny_pipeline_dir)([0, 1, 2], sampler="cspd", batch_size=2, progress=True)
    assert capsys.readouterr().err == ""
