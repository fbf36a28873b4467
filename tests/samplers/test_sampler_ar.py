"""ARSampler against a naive loop that reruns ``model.forward`` on the whole prefix for every token.

The reference spells out LlamaGen's generate() semantics by hand (CFG batch [cond; null] fed the same token,
guidance only above scale 1, cfg_interval counted over decode steps, one multinomial draw per step), so the
sampler's KV-cache loop, CFG batching and interval bookkeeping are all checked token for token.
"""

import json
import re

import pytest
import torch

from vgen.models.llamagen import GPTConfig
from vgen.samplers import ARSampler, SamplingParams, build_processors, get_sampler

CLASSES = torch.tensor([0, 4, 2])


def naive_generate(model, class_ids: torch.Tensor, params: SamplingParams, seed: int = 0) -> torch.Tensor:
    """No cache: step i reruns the whole sequence [class, tokens < i] and samples token i from its end."""
    generator = torch.Generator().manual_seed(seed)
    guided = params.cfg_scale > 1.0
    cond = torch.cat([class_ids, torch.full_like(class_ids, model.num_classes)]) if guided else class_ids
    seq = torch.zeros(len(class_ids), 0, dtype=torch.long)
    with torch.no_grad():
        for i in range(model.num_tokens):
            logits = model(cond, torch.cat([seq, seq]) if guided else seq)[:, -1]
            if guided:
                cond_logits, uncond_logits = logits.chunk(2)
                decode_step = i - 1  # LlamaGen's loop index; the prefill (i = 0) is always guided
                if i > 0 and params.cfg_interval > -1 and decode_step > params.cfg_interval:
                    logits = cond_logits
                else:
                    logits = uncond_logits + (cond_logits - uncond_logits) * params.cfg_scale
            logits = build_processors(params)(logits)  # checked against LlamaGen in test_sampler_logits.py
            if params.temperature == 0:
                token = logits.argmax(-1)
            else:
                token = torch.multinomial(logits.softmax(-1), 1, generator=generator)[:, 0]
            seq = torch.cat([seq, token[:, None]], dim=1)
    return seq


def run(model, params: SamplingParams, seed: int = 0, classes: torch.Tensor = CLASSES):
    return ARSampler().sample(model, classes, params, generator=torch.Generator().manual_seed(seed))


PARAMS = {
    "greedy": SamplingParams(temperature=0.0),
    "greedy-cfg": SamplingParams(temperature=0.0, cfg_scale=4.0),
    "sampled": SamplingParams(),
    "sampled-cfg": SamplingParams(cfg_scale=4.0),
    "filtered-cfg": SamplingParams(temperature=0.8, top_k=20, top_p=0.9, cfg_scale=2.5),
    "interval": SamplingParams(temperature=1.2, cfg_scale=3.0, cfg_interval=5),
}


@pytest.mark.parametrize("name", list(PARAMS))
def test_kv_cache_sampling_equals_the_naive_loop(tiny_gpt, name: str) -> None:
    out = run(tiny_gpt, PARAMS[name], seed=7)
    assert out.tokens.shape == (3, 16) and out.tokens.dtype == torch.long
    assert torch.equal(out.tokens, naive_generate(tiny_gpt, CLASSES, PARAMS[name], seed=7))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cfg_scale_up_to_one_is_plain_conditional_sampling(tiny_gpt, temperature: float) -> None:
    def tokens(scale: float) -> torch.Tensor:
        return run(tiny_gpt, SamplingParams(temperature=temperature, cfg_scale=scale)).tokens

    plain = naive_generate(tiny_gpt, CLASSES, SamplingParams(temperature=temperature))
    assert all(torch.equal(tokens(scale), plain) for scale in (0.0, 0.5, 1.0))
    assert not torch.equal(tokens(4.0), plain)


@pytest.mark.parametrize("interval", [0, 3, 14])
def test_cfg_interval_switches_guidance_off_after_the_right_token(tiny_gpt, interval: int) -> None:
    params = SamplingParams(temperature=0.0, cfg_scale=4.0, cfg_interval=interval)
    tokens = run(tiny_gpt, params).tokens
    assert torch.equal(tokens, naive_generate(tiny_gpt, CLASSES, params))
    # greedy: tokens 0 .. interval + 1 are those of always-on guidance; later ones differ (for this model)
    always = run(tiny_gpt, SamplingParams(temperature=0.0, cfg_scale=4.0)).tokens
    assert torch.equal(tokens[:, :interval + 2], always[:, :interval + 2])
    assert interval + 2 >= tokens.shape[1] or not torch.equal(tokens, always)


def test_cfg_interval_beyond_the_image_equals_always_on(tiny_gpt) -> None:
    always = run(tiny_gpt, SamplingParams(cfg_scale=4.0)).tokens
    assert torch.equal(run(tiny_gpt, SamplingParams(cfg_scale=4.0, cfg_interval=15)).tokens, always)


def test_one_cached_decode_per_token_and_both_cfg_halves_get_the_same_token(tiny_gpt, monkeypatch) -> None:
    prefills, decodes = [], []
    prefill, decode = tiny_gpt.prefill, tiny_gpt.decode

    def spy_prefill(class_ids, cache):
        prefills.append(class_ids.clone())
        return prefill(class_ids, cache)

    def spy_decode(tokens, cache):
        decodes.append((tokens.clone(), cache.length))
        return decode(tokens, cache)

    monkeypatch.setattr(tiny_gpt, "prefill", spy_prefill)
    monkeypatch.setattr(tiny_gpt, "decode", spy_decode)
    out = run(tiny_gpt, SamplingParams(cfg_scale=4.0))
    assert len(prefills) == 1 and torch.equal(prefills[0], torch.tensor([0, 4, 2, 5, 5, 5]))
    assert len(decodes) == 15
    for t, (fed, cached) in enumerate(decodes, start=1):
        assert fed.shape == (6, 1) and cached == t  # class position + tokens 0 .. t - 2: nothing recomputed
        assert torch.equal(fed[:3], fed[3:]) and torch.equal(fed[:3, 0], out.tokens[:, t - 1])


def test_same_seed_same_tokens_and_different_seeds_differ(tiny_gpt) -> None:
    params = SamplingParams(cfg_scale=2.0)
    assert torch.equal(run(tiny_gpt, params, seed=1).tokens, run(tiny_gpt, params, seed=1).tokens)
    assert not torch.equal(run(tiny_gpt, params, seed=1).tokens, run(tiny_gpt, params, seed=2).tokens)


def test_without_a_generator_the_global_seed_decides(tiny_gpt) -> None:
    torch.manual_seed(5)
    first = ARSampler().sample(tiny_gpt, CLASSES, SamplingParams()).tokens
    torch.manual_seed(5)
    assert torch.equal(ARSampler().sample(tiny_gpt, CLASSES, SamplingParams()).tokens, first)


def test_stats_count_one_forward_pass_per_token(tiny_gpt) -> None:
    stats = run(tiny_gpt, SamplingParams(cfg_scale=4.0)).stats
    assert (stats.sampler, stats.forward_passes, stats.draft_forward_passes) == ("ar", 16, 0)
    assert (stats.tokens, stats.batch_size, stats.tokens_per_forward) == (48, 3, 1.0)
    assert stats.accepted_lengths == [] and stats.wall_time_s > 0
    assert torch.equal(stats.accept_step, torch.arange(1, 17).expand(3, 16))
    d = json.loads(json.dumps(stats.to_dict()))
    assert d["forward_passes"] == 16 and d["tokens"] == 48 and d["sampler"] == "ar"


def test_progress_bar_reports_every_token(tiny_gpt, capsys) -> None:
    run(tiny_gpt, SamplingParams(), classes=CLASSES[:1])
    assert capsys.readouterr().err == ""
    ARSampler().sample(tiny_gpt, CLASSES[:1], SamplingParams(), progress=True)
    assert "16/16" in capsys.readouterr().err


@pytest.mark.parametrize("class_ids,message", [
    (torch.tensor([0, 5]), "class id 5 is out of range for a model with 5 classes (valid: 0..4)"),
    (torch.tensor([-1]), "class id -1 is out of range for a model with 5 classes (valid: 0..4)"),
    (torch.tensor([[0, 1]]), "class_ids must be a 1-D integer tensor, got torch.int64 of shape (1, 2)"),
    (torch.tensor([0.0]), "class_ids must be a 1-D integer tensor, got torch.float32 of shape (1,)"),
])
def test_bad_class_ids_raise(tiny_gpt, class_ids: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ARSampler().sample(tiny_gpt, class_ids, SamplingParams())


def test_a_model_in_training_mode_is_refused(tiny_gpt) -> None:
    with pytest.raises(ValueError, match=re.escape("the model is in training mode")):
        ARSampler().sample(tiny_gpt.train(), CLASSES, SamplingParams())


@pytest.mark.slow
def test_compiled_decode_step_gives_the_same_tokens(tiny_gpt_factory) -> None:
    config = GPTConfig(vocab_size=32, dim=32, n_layer=1, n_head=2, num_classes=2, block_size=4)
    model = tiny_gpt_factory(config)
    params = SamplingParams(temperature=0.0, cfg_scale=2.0)
    compiled = get_sampler("ar", compile=True).sample(model, torch.tensor([0, 1]), params).tokens
    assert torch.equal(compiled, ARSampler().sample(model, torch.tensor([0, 1]), params).tokens)
