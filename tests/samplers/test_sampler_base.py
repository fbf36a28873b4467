"""The sampler contract: SamplingParams validation and semantics, the registry, config round-trips, stats."""

import json
import re
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

import vgen.samplers.base as base
from vgen.kernels import SamplingSpec
from vgen.samplers import (
    ARSampler,
    SampleOutput,
    Sampler,
    SamplerStats,
    SamplingParams,
    available_samplers,
    get_sampler,
    register_sampler,
    samplers_taking,
)


@pytest.mark.parametrize("kwargs,message", [
    (dict(temperature=-0.5), "temperature must be in [0, 100] (0 = greedy), got -0.5"),
    (dict(temperature=float("nan")), "temperature must be a finite number in [0, 100] (0 = greedy), got nan"),
    (dict(cfg_scale=float("inf")), "cfg_scale must be a finite number in [0, 100.0] (guidance only above 1), got inf"),
    (dict(top_k=float("inf")), "top_k must be an integer in [0, 262144] (0 = off), got inf"),
    (dict(top_k=-1), "top_k must be an integer in [0, 262144] (0 = off), got -1"),
    (dict(top_k=1.5), "top_k must be an integer in [0, 262144] (0 = off), got 1.5"),
    (dict(top_p=0.0), "top_p must be in (0, 1] (1 = off), got 0.0"),
    (dict(top_p=1.01), "top_p must be in (0, 1] (1 = off), got 1.01"),
    (dict(cfg_scale=-1.0), "cfg_scale must be in [0, 100.0] (guidance only above 1), got -1.0"),
    (dict(cfg_scale=1e300), "cfg_scale must be in [0, 100.0] (guidance only above 1), got 1e+300"),
    (dict(cfg_interval=-2), "cfg_interval must be an integer in [-1, 65536] (-1 = guide every token), got -2"),
    (dict(cfg_interval=2.0), "cfg_interval must be an integer in [-1, 65536] (-1 = guide every token), got 2.0"),
])
def test_sampling_params_reject_bad_values(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        SamplingParams(**kwargs)


def test_sampling_params_round_trip_through_json() -> None:
    params = SamplingParams(temperature=0.9, top_k=100, top_p=0.95, cfg_scale=4.0, cfg_interval=10)
    assert SamplingParams.from_dict(json.loads(json.dumps(params.to_dict()))) == params
    with pytest.raises(ValueError, match=re.escape("unknown SamplingParams field(s) ['topk']")):
        SamplingParams.from_dict({"topk": 3})


def test_greedy_and_guided_flags_follow_llamagen() -> None:
    assert SamplingParams(temperature=0.0).greedy and not SamplingParams(temperature=1e-3).greedy
    guided = [SamplingParams(cfg_scale=s).guided for s in (0.0, 0.5, 1.0, 1.01, 4.0)]
    assert guided == [False, False, False, True, True]


def test_cfg_active_counts_decode_steps_like_llamagen() -> None:
    # LlamaGen: the prefill's token is always guided; decode step i (image token i + 1) not once i > interval
    def llamagen(interval: int, token: int) -> bool:
        return token == 0 or not (interval > -1 and token - 1 > interval)

    for interval in (-1, 0, 1, 5):
        params = SamplingParams(cfg_scale=2.0, cfg_interval=interval)
        expected = [llamagen(interval, t) for t in range(10)]
        assert [params.cfg_active(t) for t in range(10)] == expected
        assert params.cfg_active(torch.arange(10)).tolist() == expected
    unguided = SamplingParams(cfg_scale=1.0)
    assert not unguided.cfg_active(0) and not unguided.cfg_active(torch.arange(3)).any()


def test_the_guidance_schedule_is_the_scale_or_a_ramp_up_to_it() -> None:
    params = SamplingParams(cfg_scale=3.0)
    assert params.scheduled_cfg_scale("constant", 1, 4) == 3.0
    assert [params.scheduled_cfg_scale("linear", done, 4) for done in (1, 2, 4)] == [1.5, 2.0, 3.0]
    ramp = params.scheduled_cfg_scale("linear", torch.tensor([[1, 4]]), 4)
    assert torch.equal(ramp, torch.tensor([[1.5, 3.0]]))
    with pytest.raises(ValueError, match="cfg_schedule must be one of"):
        params.scheduled_cfg_scale("cosine", 1, 4)


def test_kernel_spec_carries_the_settings_and_flags() -> None:
    spec = SamplingParams(temperature=0.9, top_k=100, top_p=0.95, cfg_scale=4.0, cfg_interval=10).kernel_spec()
    assert spec == SamplingSpec(temperature=0.9, top_k=100, top_p=0.95, cfg_scale=4.0, guided=True, greedy=False)
    assert SamplingParams(temperature=0.0).kernel_spec() == SamplingSpec(temperature=0.0, greedy=True)


def test_registry_builds_samplers_from_names_mappings_and_instances() -> None:
    assert "ar" in available_samplers()
    assert get_sampler("ar") == ARSampler()
    assert get_sampler("ar", compile=True) == ARSampler(compile=True)
    assert get_sampler({"name": "ar", "compile": True}) == ARSampler(compile=True)
    sampler = ARSampler()
    assert get_sampler(sampler) is sampler
    assert get_sampler(sampler, compile=True) == ARSampler(compile=True)


def test_unknown_sampler_and_unknown_field_raise() -> None:
    with pytest.raises(ValueError, match=r"^unknown sampler 'x'; available: (.*, )?ar(, .*)?$"):
        get_sampler("x")
    message = "unknown sampler 'ar' field(s) ['draft_len']; expected some of ['compile']"
    with pytest.raises(ValueError, match=re.escape(message)):
        get_sampler("ar", draft_len=4)

    with pytest.raises(ValueError, match=re.escape("compile must be a bool, got 'yes'")):
        ARSampler(compile="yes")


def test_a_field_of_another_sampler_names_the_samplers_that_take_it() -> None:
    with pytest.raises(ValueError) as error:
        get_sampler("ar", lantern_delta=0.3, draft_len=4)
    message = str(error.value)
    assert message.startswith("unknown sampler 'ar' field(s) ['draft_len', 'lantern_delta']")
    takers = re.search(r"\(lantern_delta is an option of ([a-z, -]+)\)$", message).group(1).split(", ")
    assert takers == samplers_taking("lantern_delta") and "lantern" in takers and "ar" not in takers
    assert "draft_len is" not in message


def test_sampler_config_round_trips_through_json() -> None:
    d = json.loads(json.dumps(ARSampler(compile=True).to_dict()))
    assert d == {"name": "ar", "compile": True}
    assert Sampler.from_dict(d) == ARSampler.from_dict(d) == ARSampler(compile=True)
    with pytest.raises(ValueError, match=re.escape("config is for sampler 'sjd', not 'ar'")):
        ARSampler.from_dict({"name": "sjd"})


def test_register_sampler_adds_a_new_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))

    @register_sampler
    @dataclass(frozen=True)
    class Echo(Sampler):
        name: ClassVar[str] = "echo"
        width: int = 2

        def sample(self, model, class_ids, params, *, generator=None, progress=False) -> SampleOutput:
            raise NotImplementedError

    assert get_sampler("echo", width=3) == Echo(width=3)
    assert Sampler.from_dict({"name": "echo", "width": 5}) == Echo(width=5)
    assert "echo" in available_samplers()
    with pytest.raises(ValueError, match=re.escape("sampler name 'echo' is already taken by Echo")):
        register_sampler(type("Other", (Echo,), {}))
    with pytest.raises(ValueError, match=re.escape("Nameless needs a non-empty class attribute 'name'")):
        register_sampler(type("Nameless", (Sampler,), {}))


def test_stats_derive_rates_and_serialise_to_json() -> None:
    stats = SamplerStats(sampler="ar", forward_passes=16, tokens=64, wall_time_s=0.5, batch_size=4,
                         accept_step=torch.arange(1, 17).repeat(4, 1))
    assert stats.tokens_per_forward == 1.0 and stats.tokens_per_second == 128.0
    d = json.loads(json.dumps(stats.to_dict(per_token=True)))
    assert {"sampler", "forward_passes", "tokens", "wall_time_s", "tokens_per_forward"} <= set(d)
    assert d["accept_step"] == stats.accept_step.tolist() and d["accepted_lengths"] == []
    n = base.MAX_JSON_ELEMENTS + 1
    spec = SamplerStats(sampler="sjd", forward_passes=4, tokens=n, wall_time_s=0.1, accepted_lengths=[6, 4, 3, 3],
                        accept_step=torch.arange(n)[None] * 4 // n + 1)
    assert spec.tokens_per_forward == n / 4
    d = json.loads(json.dumps(spec.to_dict(per_token=True)))
    assert "accept_step" not in d and d["accepted_lengths"] == [6, 4, 3, 3]


def test_stats_summarise_without_their_per_token_arrays() -> None:
    """256 tokens of one image: the summary and the printed stats hold figures, not 256 steps; the steps stay on
    the object for the acceptance map."""
    stats = SamplerStats(sampler="sjd", forward_passes=64, tokens=256, wall_time_s=0.5, accepted_lengths=[4] * 64,
                         accept_step=torch.arange(256)[None] // 4 + 1)
    summary = stats.to_dict()
    assert "accept_step" not in summary and "accepted_lengths" not in summary
    assert summary["accepted_length_histogram"] == [0, 0, 0, 0, 64] and summary["tokens_per_forward"] == 4.0
    assert len(repr(stats)) < 400 and "accept_step" not in repr(stats) and "forward_passes=64" in repr(stats)
    assert stats.accept_step.shape == (1, 256)


def test_tokens_per_forward_averages_rows_and_the_batch_figure_counts_the_batch() -> None:
    """1,000 rows of 16 tokens: 999 done in 4 passes, one in 16 (the batch runs 16). A row averages 16 / 4 tokens
    a pass, all but the slow one; the batch draws 16,000 tokens in 16 batched passes."""
    done_at = torch.full((1000, 1), 4)
    done_at[-1] = 16
    accept_step = (torch.arange(16)[None] * done_at // 16 + 1)
    stats = SamplerStats(sampler="sjd", forward_passes=16, tokens=16_000, wall_time_s=1.0, batch_size=1000,
                         accept_step=accept_step)
    assert stats.tokens_per_forward == pytest.approx((999 * 16 / 4 + 16 / 16) / 1000)
    assert stats.batch_tokens_per_forward == 1000.0
    d = stats.to_dict()
    assert (d["tokens_per_forward"], d["batch_tokens_per_forward"]) == (stats.tokens_per_forward, 1000.0)
    plain = SamplerStats(sampler="ar", forward_passes=16, tokens=64, wall_time_s=1.0, batch_size=4)
    assert (plain.tokens_per_forward, plain.batch_tokens_per_forward) == (1.0, 4.0)  # every row took every pass


@pytest.mark.parametrize("kind", ["nar", "nbp"])
def test_a_parallel_sampler_counts_every_rows_tokens_on_the_bar_it_is_given(kind, tiny_nar_factory,
                                                                            tiny_nbp_factory) -> None:
    model = tiny_nar_factory((3, 3)) if kind == "nar" else tiny_nbp_factory((3, 3))
    bar = base.SharedBar(2 * 9, kind, show=False)
    get_sampler(kind).sample(model, torch.tensor([0, 1]), SamplingParams(), progress=bar)
    assert bar.n == 2 * 9
