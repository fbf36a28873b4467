"""NARSampler against a naive loop with no cache: step s reruns the full forward under the proximity mask on
the grid drawn so far (undrawn cells hold a placeholder, which the mask hides), takes the logits of every cell at
distance s, guides, processes and draws them in one multinomial call, as the sampler contract says. The tokens
must agree exactly, so the cache, the step bookkeeping, CFG batching and the interval are all checked; the stats
must count the forward passes the model really ran (H + W - 1, T + H + W - 2).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch

from vgen.samplers import ARSampler, NARSampler, SamplingParams, available_samplers, get_sampler
from vgen.samplers.speculative import SJD

CLASSES = torch.tensor([0, 4, 2])


def distances(grid: tuple[int, ...], image_first: bool = False) -> torch.Tensor:
    """Coordinate sums; with frame 0 first, the later frames' raised by H + W - 2."""
    lift = grid[1] + grid[2] - 2 if image_first else 0
    return torch.tensor([sum(c) + (lift if c[0] > 0 else 0) for c in itertools.product(*(range(n) for n in grid))])


def naive_generate(model, class_ids: torch.Tensor, params: SamplingParams, draw: Callable,
                   seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    guided = params.cfg_scale > 1.0
    cond = torch.cat([class_ids, torch.full_like(class_ids, model.num_classes)]) if guided else class_ids
    dist = distances(model.grid, model.config.image_first)
    seq = torch.full((len(class_ids), model.num_tokens), 7)  # placeholder for cells not drawn yet
    drawn = 0
    with torch.no_grad():
        for s in range(int(dist.max()) + 1):
            cells = dist == s
            logits = model(cond, torch.cat([seq, seq]) if guided else seq)[:, cells]
            if guided:
                c, u = logits.chunk(2)
                # guided while the index of the step's first token is <= cfg_interval + 1 (as AR's token index)
                on = params.cfg_interval < 0 or drawn <= params.cfg_interval + 1
                logits = u + (c - u) * params.cfg_scale if on else c
            seq[:, cells] = draw(logits, params, generator)
            drawn += int(cells.sum())
    return seq


@pytest.mark.parametrize(("grid", "image_first"), [((3, 3), False), ((2, 4), False), ((2, 2, 2), False),
                                                   ((3, 2, 3), True)])
def test_tokens_equal_the_uncached_full_forward_loop(tiny_nar_factory, run_sampler, reference_draw, sampling_params,
                                                     grid: tuple[int, ...], image_first: bool) -> None:
    model = tiny_nar_factory(grid, image_first=image_first)
    out = run_sampler("nar", model, CLASSES, sampling_params, seed=11)
    assert torch.equal(out.tokens, naive_generate(model, CLASSES, sampling_params, reference_draw, seed=11))


def test_the_interval_switches_guidance_off_for_later_steps(tiny_nar_factory, run_sampler) -> None:
    """Guidance on everywhere, off after the first steps, and off everywhere but the prefill differ."""
    model = tiny_nar_factory((3, 3))
    base = dict(temperature=0.0, cfg_scale=8.0)
    outs = [run_sampler("nar", model, CLASSES, SamplingParams(**base, cfg_interval=k)).tokens for k in (-1, 2, 0)]
    assert not torch.equal(outs[0], outs[1]) and not torch.equal(outs[1], outs[2])


@pytest.mark.parametrize(("grid", "image_first", "passes"), [((3, 3), False, 5), ((2, 5), False, 6),
                                                             ((4, 4), False, 7), ((2, 2, 2), False, 4),
                                                             ((2, 3, 4), False, 7), ((2, 3, 4), True, 12)])
def test_forward_passes_are_counted_from_the_model_calls(tiny_nar_factory, grid: tuple[int, ...], image_first: bool,
                                                         passes: int, run_sampler, monkeypatch) -> None:
    model = tiny_nar_factory(grid, image_first=image_first)
    calls = []
    for method in ("prefill", "decode"):
        real = getattr(model, method)
        monkeypatch.setattr(model, method, lambda *a, _real=real, _m=method, **k: calls.append(_m) or _real(*a, **k))
    out = run_sampler("nar", model, CLASSES, SamplingParams(cfg_scale=2.0))
    assert len(calls) == out.stats.forward_passes == passes
    assert calls[0] == "prefill" and calls.count("prefill") == 1
    n = model.num_tokens
    assert out.stats.tokens == len(CLASSES) * n and out.stats.batch_size == len(CLASSES)
    assert out.stats.tokens_per_forward == pytest.approx(n / passes)
    assert out.stats.wall_time_s > 0 and out.stats.details == {"grid": list(grid)}
    # the pass that produced each cell: its distance from the origin + 1
    assert torch.equal(out.stats.accept_step, (distances(grid, image_first) + 1).repeat(len(CLASSES), 1))
    assert out.tokens.shape == (len(CLASSES), n) and out.tokens.min() >= 0 and out.tokens.max() < model.vocab_size


def test_same_seed_same_tokens_other_seed_other_tokens(tiny_nar_factory, run_sampler) -> None:
    model = tiny_nar_factory((4, 4))
    params = SamplingParams(cfg_scale=2.0, top_k=30)
    a, b, c = (run_sampler("nar", model, CLASSES, params, seed=seed) for seed in (5, 5, 6))
    assert torch.equal(a.tokens, b.tokens)
    assert not torch.equal(a.tokens, c.tokens)
    assert len({tuple(r) for r in a.tokens.tolist()}) == len(CLASSES)  # batch rows are not copies


def test_registered_and_round_trips() -> None:
    sampler = get_sampler("nar")
    assert isinstance(sampler, NARSampler)
    assert get_sampler(sampler.to_dict()) == sampler and sampler.to_dict() == {"name": "nar"}
    assert available_samplers("next-neighbour") == ["nar"]
    assert "nar" in available_samplers() and "nar" not in available_samplers("raster")


def test_nar_sampler_refuses_a_raster_model(tiny_gpt) -> None:
    with pytest.raises(ValueError, match=r"sampler 'nar' does not fit LlamaGenGPT \(raster tokens\); samplers "
                                         r"that do: ar, gsd, "):
        NARSampler().sample(tiny_gpt, torch.tensor([0]), SamplingParams())


@pytest.mark.parametrize("sampler", [ARSampler(), SJD()])
def test_raster_samplers_refuse_a_nar_model(tiny_nar_factory, sampler) -> None:
    with pytest.raises(ValueError, match=f"sampler '{sampler.name}' does not fit NARTransformer \\(next-neighbour "
                                         f"tokens\\); samplers that do: nar$"):
        sampler.sample(tiny_nar_factory((3, 3)), torch.tensor([0]), SamplingParams())


@pytest.mark.parametrize(("class_ids", "match"), [(torch.tensor([0, 5]), "class id 5 is out of range for a model with "
                                                                         r"5 classes \(valid: 0\.\.4\)"),
                                                  (torch.tensor([-1]), "class id -1 is out of range"),
                                                  (torch.tensor([[0]]), "class_ids must be a 1-D integer tensor"),
                                                  (torch.tensor([0.0]), "class_ids must be a 1-D integer tensor")])
def test_bad_class_ids_are_refused(tiny_nar_factory, class_ids: torch.Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        NARSampler().sample(tiny_nar_factory((2, 2)), class_ids, SamplingParams())


def test_a_model_in_training_mode_is_refused(tiny_nar_factory) -> None:
    with pytest.raises(ValueError, match="training mode"):
        NARSampler().sample(tiny_nar_factory((2, 2)).train(), torch.tensor([0]), SamplingParams())
