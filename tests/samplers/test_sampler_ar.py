"""ARSampler against a naive loop that reruns ``model.forward`` on the whole prefix for every token.

The reference spells out LlamaGen's generate() semantics by hand (CFG batch [cond; null] fed the same token,
guidance only above scale 1, cfg_interval counted over decode steps, one multinomial draw per step), so the
sampler's KV-cache loop, CFG batching and interval bookkeeping are all checked token for token. The static-shape
step behind the CUDA-graph compile modes is checked eagerly (logits against ``decode``, tokens against the naive
loop); one slow test compiles the default step and checks it against the eager one.
"""

import json
import re
import weakref
from collections.abc import Callable

import pytest
import torch
from torch._dynamo.utils import counters

from vgen.models.llamagen import GPTConfig
from vgen.samplers import ARSampler, SamplingParams, compiling, get_sampler
from vgen.samplers import ar as ar_module
from vgen.samplers.compiling import static_cache

CLASSES = torch.tensor([0, 4, 2])


def naive_generate(model, class_ids: torch.Tensor, params: SamplingParams, draw: Callable,
                   seed: int = 0) -> torch.Tensor:
    """No cache: step i reruns the whole sequence [class, tokens < i] and samples token i from its end with ``draw``
    (the ``reference_draw`` fixture)."""
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
            token = draw(logits, params, generator)  # processors checked against LlamaGen in test_sampler_logits.py
            seq = torch.cat([seq, token[:, None]], dim=1)
    return seq


def test_kv_cache_sampling_equals_the_naive_loop(tiny_gpt, run_sampler, reference_draw, sampling_params) -> None:
    out = run_sampler("ar", tiny_gpt, CLASSES, sampling_params, seed=7)
    assert out.tokens.shape == (3, 16) and out.tokens.dtype == torch.long
    assert torch.equal(out.tokens, naive_generate(tiny_gpt, CLASSES, sampling_params, reference_draw, seed=7))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cfg_scale_up_to_one_is_plain_conditional_sampling(tiny_gpt, run_sampler, reference_draw,
                                                           temperature: float) -> None:
    def tokens(scale: float) -> torch.Tensor:
        return run_sampler("ar", tiny_gpt, CLASSES, SamplingParams(temperature=temperature, cfg_scale=scale)).tokens

    plain = naive_generate(tiny_gpt, CLASSES, SamplingParams(temperature=temperature), reference_draw)
    assert all(torch.equal(tokens(scale), plain) for scale in (0.0, 0.5, 1.0))
    assert not torch.equal(tokens(4.0), plain)


@pytest.mark.parametrize("interval", [0, 3, 14])
def test_cfg_interval_switches_guidance_off_after_the_right_token(tiny_gpt, run_sampler, reference_draw,
                                                                  interval: int) -> None:
    params = SamplingParams(temperature=0.0, cfg_scale=4.0, cfg_interval=interval)
    tokens = run_sampler("ar", tiny_gpt, CLASSES, params).tokens
    assert torch.equal(tokens, naive_generate(tiny_gpt, CLASSES, params, reference_draw))
    # greedy: tokens 0 .. interval + 1 are those of always-on guidance; later ones differ (for this model)
    always = run_sampler("ar", tiny_gpt, CLASSES, SamplingParams(temperature=0.0, cfg_scale=4.0)).tokens
    assert torch.equal(tokens[:, :interval + 2], always[:, :interval + 2])
    assert interval + 2 >= tokens.shape[1] or not torch.equal(tokens, always)


def test_cfg_interval_beyond_the_image_equals_always_on(tiny_gpt, run_sampler) -> None:
    always = run_sampler("ar", tiny_gpt, CLASSES, SamplingParams(cfg_scale=4.0)).tokens
    beyond = run_sampler("ar", tiny_gpt, CLASSES, SamplingParams(cfg_scale=4.0, cfg_interval=15)).tokens
    assert torch.equal(beyond, always)


def test_one_cached_decode_per_token_and_both_cfg_halves_get_the_same_token(tiny_gpt, run_sampler,
                                                                           monkeypatch) -> None:
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
    out = run_sampler("ar", tiny_gpt, CLASSES, SamplingParams(cfg_scale=4.0))
    assert len(prefills) == 1 and torch.equal(prefills[0], torch.tensor([0, 4, 2, 5, 5, 5]))
    assert len(decodes) == 15
    for t, (fed, cached) in enumerate(decodes, start=1):
        assert fed.shape == (6, 1) and cached == t  # class position + tokens 0 .. t - 2: nothing recomputed
        assert torch.equal(fed[:3], fed[3:]) and torch.equal(fed[:3, 0], out.tokens[:, t - 1])


def test_same_seed_same_tokens_and_different_seeds_differ(tiny_gpt, run_sampler) -> None:
    def tokens(seed: int) -> torch.Tensor:
        return run_sampler("ar", tiny_gpt, CLASSES, SamplingParams(cfg_scale=2.0), seed=seed).tokens

    assert torch.equal(tokens(1), tokens(1)) and not torch.equal(tokens(1), tokens(2))


def test_without_a_generator_the_global_seed_decides(tiny_gpt) -> None:
    torch.manual_seed(5)
    first = ARSampler().sample(tiny_gpt, CLASSES, SamplingParams()).tokens
    torch.manual_seed(5)
    assert torch.equal(ARSampler().sample(tiny_gpt, CLASSES, SamplingParams()).tokens, first)


def test_stats_count_one_forward_pass_per_token(tiny_gpt, run_sampler) -> None:
    stats = run_sampler("ar", tiny_gpt, CLASSES, SamplingParams(cfg_scale=4.0)).stats
    assert (stats.sampler, stats.forward_passes, stats.draft_forward_passes) == ("ar", 16, 0)
    assert (stats.tokens, stats.batch_size, stats.tokens_per_forward) == (48, 3, 1.0)
    assert stats.accepted_lengths == [] and stats.wall_time_s > 0
    assert torch.equal(stats.accept_step, torch.arange(1, 17).expand(3, 16))
    d = json.loads(json.dumps(stats.to_dict()))
    assert d["forward_passes"] == 16 and d["tokens"] == 48 and d["sampler"] == "ar"


def test_progress_bar_reports_every_token(tiny_gpt, run_sampler, capsys) -> None:
    run_sampler("ar", tiny_gpt, CLASSES[:1], SamplingParams())
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


@pytest.mark.parametrize("compile,mode", [(False, None), (True, "default"), ("default", "default"),
                                          ("reduce-overhead", "reduce-overhead"), ("max-autotune", "max-autotune")])
def test_compile_takes_a_bool_or_a_torch_compile_mode(compile, mode) -> None:
    assert ARSampler(compile=compile).compile_mode == mode
    assert ARSampler.from_dict(ARSampler(compile=compile).to_dict()) == ARSampler(compile=compile)


def test_an_unknown_compile_mode_raises() -> None:
    with pytest.raises(ValueError, match=re.escape("compile must be a bool, got 'fast' (or one of torch.compile's "
                                                   "modes ['default', 'reduce-overhead', 'max-autotune', ")):
        ARSampler(compile="fast")


@torch.no_grad()
def test_static_decode_step_equals_decode_and_respects_crop(tiny_gpt) -> None:
    """``decode_step`` (position as a tensor, attention over the whole cache under a mask) gives ``decode``'s
    logits at every position, also after a crop left stale keys behind the new position."""
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, tiny_gpt.vocab_size, (3, 15), generator=g)
    eager, static = tiny_gpt.new_cache(3), tiny_gpt.new_cache(3)
    tiny_gpt.prefill(CLASSES, eager)
    tiny_gpt.prefill(CLASSES, static)
    tiny_gpt.decode(tokens[:, :9], static)  # keys that the crop below turns stale
    static.crop(1)
    for t in range(15):
        expected = tiny_gpt.decode(tokens[:, t:t + 1], eager)[:, -1]
        got = tiny_gpt.decode_step(tokens[:, t:t + 1], torch.tensor([static.length]), static)
        static.advance(1)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert static.length == eager.length == 16
    torch.testing.assert_close(static.keys[1], eager.keys[1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["greedy-cfg", "filtered-cfg", "sampled"])
def test_cuda_graph_modes_run_the_static_step_on_a_reused_cache(tiny_gpt, monkeypatch, reference_draw, sampling_table,
                                                               name: str) -> None:
    """The sampler's static-step bookkeeping (slot tensor, advance, one cache kept per model and cropped for the
    next call), run eagerly: compiling is the only difference from ``compile="reduce-overhead"``."""
    monkeypatch.setattr(ar_module, "compiled_step", lambda mode: ar_module._decode_step)
    monkeypatch.setattr(compiling, "_STATIC_CACHES", weakref.WeakKeyDictionary())
    sampler = ARSampler(compile="reduce-overhead")
    params = sampling_table[name]
    naive = naive_generate(tiny_gpt, CLASSES, params, reference_draw, seed=7)
    first = sampler.sample(tiny_gpt, CLASSES, params, generator=torch.Generator().manual_seed(7)).tokens
    cache = static_cache(tiny_gpt)
    again = sampler.sample(tiny_gpt, CLASSES, params, generator=torch.Generator().manual_seed(7)).tokens
    assert torch.equal(first, naive) and torch.equal(again, naive)
    assert static_cache(tiny_gpt) is cache and cache.length == 16  # reused, not reallocated
    sampler.sample(tiny_gpt, CLASSES[:1], params)  # another batch size gets its own cache
    assert static_cache(tiny_gpt) is not cache


@pytest.mark.slow
@torch.no_grad()
def test_compiled_decode_step_compiles_once_and_matches_eager(tiny_gpt_factory) -> None:
    """compile=True: one graph for every cache length and batch size, logits equal to eager decoding's."""
    model = tiny_gpt_factory(GPTConfig(vocab_size=32, dim=32, n_layer=1, n_head=2, num_classes=2, block_size=9))
    step = ar_module.compiled_step("default")
    counters.clear()
    tokens = torch.randint(0, 32, (4, 8), generator=torch.Generator().manual_seed(0))
    compiled, eager = model.new_cache(4), model.new_cache(4)
    model.prefill(torch.tensor([0, 1, 2, 2]), compiled)
    model.prefill(torch.tensor([0, 1, 2, 2]), eager)
    for t in range(8):
        fed = tokens[:, t:t + 1].contiguous()  # as the sampler feeds them
        torch.testing.assert_close(step(model, fed, compiled), model.decode(fed, eager)[:, -1], atol=1e-5, rtol=0)
    params = SamplingParams(temperature=0.0, cfg_scale=2.0)
    got = get_sampler("ar", compile=True).sample(model, torch.tensor([0, 1]), params).tokens
    assert torch.equal(got, ARSampler().sample(model, torch.tensor([0, 1]), params).tokens)
    assert counters["stats"]["unique_graphs"] == 1
