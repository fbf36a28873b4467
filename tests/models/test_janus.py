"""Janus-Pro as a vgen backbone equals ``transformers``' own image generation on a tiny random checkpoint: the prompt
rows and their null form, the logits of every step (conditional and unconditional rows, fp32 rounding), greedy
tokens through vgen's ``ar`` sampler with guidance at Janus' default scale, the per-row and static-shape decode
paths, and the VQ decoding; bad folders and bad conditions are refused with one-line errors."""

from __future__ import annotations

import json

import pytest
import torch

from vgen.models.conditioning import PrefixCondition, cat_conditions
from vgen.samplers import SamplingParams, get_sampler

transformers = pytest.importorskip("transformers", reason="Janus needs transformers (pip install -e '.[t2i]')")

from vgen.models.janus import JanusT2I, JanusT2IConfig, LoadedJanus, janus_condition, load_janus  # noqa: E402

PROMPTS = ["a red cat", "a big blue dog on the moon under the rain"]  # prompts of different lengths in one batch


@pytest.fixture(scope="module")
def janus(tiny_janus_dir) -> LoadedJanus:
    return load_janus(tiny_janus_dir)


@pytest.fixture(scope="module")
def hf_model(tiny_janus_dir):
    return transformers.JanusForConditionalGeneration.from_pretrained(tiny_janus_dir, local_files_only=True).eval()


class Recorder:
    """A logits processor that keeps the scores ``generate`` hands it: the [cond; null] rows, before guidance."""

    def __init__(self) -> None:
        self.scores: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.scores.append(scores.clone())
        return scores


def hf_generate(hf_model, processor) -> tuple[torch.Tensor, list[torch.Tensor], dict]:
    """Greedy ``generate(generation_mode="image")`` on PROMPTS as transformers' docs run it, with the raw scores of
    every step and the processor's inputs."""
    texts = [processor.apply_chat_template([{"role": "user", "content": [{"type": "text", "text": p}]}],
                                           add_generation_prompt=True) for p in PROMPTS]
    inputs = processor(text=texts, generation_mode="image", padding=True, return_tensors="pt")
    recorder = Recorder()
    tokens = hf_model.generate(**inputs, generation_mode="image", do_sample=False,
                               logits_processor=transformers.LogitsProcessorList([recorder]))
    return tokens, recorder.scores, inputs


def test_the_prompt_rows_and_their_null_form_are_generates(janus, hf_model) -> None:
    _, _, inputs = hf_generate(hf_model, janus.processor)
    cond = janus.condition(PROMPTS)
    assert torch.equal(cond.values, inputs["input_ids"]) and torch.equal(cond.mask, inputs["attention_mask"].bool())
    assert cond.length == int(cond.mask.sum(1).max()) and not cond.mask[0, 0]  # left-padded to the longest
    tokenizer = janus.processor.tokenizer
    boi, bos, pad = (tokenizer.convert_tokens_to_ids(t) for t in ("<begin_of_image>", "<bos>", "<pad>"))
    assert (cond.values[:, -1] == boi).all()
    assert [int(row[m][0]) for row, m in zip(cond.values, cond.mask, strict=True)] == [bos, bos]
    null = janus.model.null_condition(cond)
    expected = inputs["input_ids"].masked_fill((inputs["input_ids"] != bos) & (inputs["input_ids"] != boi), pad)
    assert torch.equal(null.values, expected) and torch.equal(null.mask, cond.mask)
    assert janus.model.config.cfg_scale == 5.0 and janus.model.grid == (4, 4) and janus.model.vocab_size == 64


def test_every_step_and_greedy_tokens_equal_transformers_generate(janus, hf_model) -> None:
    hf_tokens, hf_scores, _ = hf_generate(hf_model, janus.processor)
    model, cond = janus.model, janus.condition(PROMPTS)
    assert len(hf_scores) == model.num_tokens == 16
    cache = model.new_cache(4)
    logits = model.prefill(cat_conditions([cond, model.null_condition(cond)]), cache)
    for t in range(model.num_tokens):
        torch.testing.assert_close(logits, hf_scores[t], rtol=0, atol=1e-4)
        if t + 1 < model.num_tokens:
            last = hf_tokens[:, t:t + 1]
            logits = model.decode(torch.cat([last, last]), cache)[:, -1]
    assert hf_scores[0].std() > 0.3  # informative logits, not a flat law that any order would match
    out = get_sampler("ar").sample(model, cond, SamplingParams(temperature=0.0, cfg_scale=model.config.cfg_scale))
    assert torch.equal(out.tokens, hf_tokens)


def test_a_pipelines_logits_are_generates_scores_of_every_step(tiny_janus_dir, janus, hf_model) -> None:
    """``pipe.logits(..., unconditional=True)`` teacher-forced on generate's own tokens: the [cond; null] rows
    ``generate`` hands its logits processors at every step (what a user checking a port compares)."""
    from vgen.pipelines import load

    pipe = load(tiny_janus_dir)
    hf_tokens, hf_scores, _ = hf_generate(hf_model, janus.processor)
    both = pipe.logits(prompt=PROMPTS, tokens=hf_tokens, unconditional=True)
    assert both.shape == (4, 16, 64)
    torch.testing.assert_close(both, torch.stack(hf_scores, dim=1), rtol=0, atol=1e-4)
    torch.testing.assert_close(pipe.logits(prompt=PROMPTS, tokens=hf_tokens), both[:2])


def test_per_row_and_static_shape_decoding_equal_appending(janus) -> None:
    model, cond = janus.model, janus.condition(PROMPTS)
    batch = cat_conditions([cond, model.null_condition(cond)])
    tokens = torch.randint(0, model.vocab_size, (4, 6), generator=torch.Generator().manual_seed(0))
    appended = model.new_cache(4)
    first = model.prefill(batch, appended)
    expected = model.decode(tokens, appended)
    rows = model.new_cache(4, extra=3)
    torch.testing.assert_close(model.prefill(batch, rows), first)
    # rows written in two passes of different per-row lengths, each row from its own start
    torch.testing.assert_close(model.decode_rows(tokens[:, :2], torch.ones(4, dtype=torch.long), rows),
                               expected[:, :2], rtol=0, atol=1e-5)
    torch.testing.assert_close(model.decode_rows(tokens[:, 2:], torch.full((4,), 3), rows), expected[:, 2:],
                               rtol=0, atol=1e-5)
    static = model.new_cache(4)
    model.prefill(batch, static)
    for t in range(tokens.shape[1]):
        step = model.decode_step(tokens[:, t:t + 1], torch.tensor([1 + t]), static)
        static.advance(1)
        torch.testing.assert_close(step, expected[:, t], rtol=0, atol=1e-5)


def test_the_vq_tokenizer_decodes_as_transformers_and_gives_its_normalised_codebook(janus, hf_model) -> None:
    codes = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    images = janus.tokenizer.decode_code(codes, janus.model.grid)
    with torch.no_grad():
        expected = hf_model.decode_image_tokens(codes).permute(0, 3, 1, 2)
    torch.testing.assert_close(images, expected)
    book = janus.tokenizer.codebook()
    assert book.shape == (64, 8)
    torch.testing.assert_close(book.norm(dim=-1), torch.ones(64))
    with pytest.raises(ValueError, match=r"codes must lie in \[0, 64\)"):
        janus.tokenizer.decode_code(codes + 64)


def test_bad_conditions_are_refused_in_one_line(janus) -> None:
    model = janus.model
    for bad, message in [(torch.tensor([1, 2]), "text-conditioned: give a prompt, not class ids"),
                         (PrefixCondition(torch.randn(1, 3, 4), torch.ones(1, 3, dtype=torch.bool)), "token ids"),
                         (PrefixCondition(torch.full((1, 3), 500), torch.ones(1, 3, dtype=torch.bool)),
                          r"must lie in \[0, 128\)"),
                         (PrefixCondition(torch.ones(1, 300, dtype=torch.long), torch.ones(1, 300, dtype=torch.bool)),
                          "longer than this model's limit of 256")]:
        with pytest.raises(ValueError, match=message) as info:
            get_sampler("ar").sample(model, bad, SamplingParams())
        assert "\n" not in str(info.value)
    for prompts, message in [([], "non-empty list of prompts"), ("a cat", "non-empty list of prompts"),
                             (["a cat", " "], "prompt 1 is empty")]:
        with pytest.raises(ValueError, match=message):
            janus.condition(prompts)
    with pytest.raises(ValueError, match=r"prompt 1 takes 14 tokens with the chat template; this model takes at most "
                                         r"10 \(max_prompt_tokens\): shorten it"):
        janus_condition(janus.processor, PROMPTS, max_prompt_tokens=10)


def test_missing_and_wrong_folders_are_refused_in_one_line(tmp_path, tiny_janus_dir) -> None:
    cases = {"missing": (tmp_path / "nowhere", "does not exist; put a Janus-Pro checkpoint in transformers' layout "
                                               "there, e.g. `huggingface-cli download deepseek-community/Janus-Pro-1B"),
             "empty": (tmp_path / "empty", "is not a Janus checkpoint \\(no config.json\\)"),
             "llama": (tmp_path / "llama", "holds a 'llama' model, not Janus"),
             "no tokenizer": (tmp_path / "no-tok", "has a Janus model but no tokenizer")}
    (tmp_path / "empty").mkdir()
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "no-tok").mkdir()
    (tmp_path / "no-tok" / "config.json").write_text((tiny_janus_dir / "config.json").read_text())
    for folder, message in cases.values():
        with pytest.raises(ValueError, match=message) as info:
            load_janus(folder)
        assert "\n" not in str(info.value)


def test_the_loaded_backbone_is_in_eval_mode_and_shares_the_checkpoints_weights(janus, hf_model) -> None:
    model = janus.model
    assert isinstance(model, JanusT2I) and not model.training and model.token_order == "raster"
    torch.testing.assert_close(model.tok_embeddings.weight, hf_model.model.generation_embeddings.weight)
    torch.testing.assert_close(model.text_embeddings.weight, hf_model.model.language_model.embed_tokens.weight)
    assert not any(p.is_meta for p in model.parameters())


def test_a_config_without_the_prompt_tokens_is_refused() -> None:
    with pytest.raises(ValueError, match="needs boi_token_id and pad_token_id"):
        JanusT2IConfig()
    assert JanusT2IConfig(boi_token_id=5, pad_token_id=0).num_tokens == 576  # Janus-Pro's 24 x 24 grid
