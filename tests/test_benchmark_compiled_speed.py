"""benchmarks/compiled_speed.py: one run times every method eager and compiled on the same weights and seeds, and
reads every ratio against compiled vanilla AR."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from vgen.eval.bench import SamplerSpec
from vgen.samplers import SamplingParams
from vgen.samplers import ar as ar_module
from vgen.samplers.speculative import sampler as sampler_module


def test_one_run_times_every_method_against_compiled_ar(benchmark_module, monkeypatch, tmp_path) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "benchmarks"))  # it imports its sibling scripts
    speed = benchmark_module("compiled_speed")
    # compiling for real is what the samplers' slow tests check: here the compiled rows run their forms eagerly
    monkeypatch.setattr(ar_module, "compiled_step", lambda mode: ar_module.decode_last)
    monkeypatch.setattr(sampler_module, "compile_step", lambda step, mode, config=None: step)
    monkeypatch.setattr(sys, "argv", ["compiled_speed.py", "--gpt-model", "tiny", "--tokens", "16", "--batch-sizes",
                                      "1", "2", "--samplers", "mcsjd", "lantern4=lantern:window=4", "--repeats", "2",
                                      "--profile", "mcsjd", "--out", str(tmp_path)])
    built = []
    get_sampler = speed.get_sampler
    monkeypatch.setattr(speed, "get_sampler", lambda name, **kw: built.append((name, kw)) or get_sampler(name, **kw))
    speed.main()
    assert ("lantern", {"compile": "default", "window": 4}) in built  # the spec's option reaches the sampler
    result = json.loads((tmp_path / "compiled_speed.json").read_text())
    assert [r["batch"] for r in result["results"]] == [1, 2]
    for r in result["results"]:
        rows = r["rows"]
        assert list(rows) == ["ar", "ar, compiled", "mcsjd", "mcsjd, compiled", "lantern4", "lantern4, compiled"]
        assert rows["ar"]["forward_passes"] == rows["ar, compiled"]["forward_passes"] == 16
        for name in ("mcsjd", "lantern4"):  # the same seeds draw the same tokens in the same passes
            assert rows[name]["forward_passes"] == rows[f"{name}, compiled"]["forward_passes"] <= 16
        reference = rows["ar, compiled"]["median_s"]
        for row in rows.values():
            assert row["vs_compiled_ar"] == reference / row["median_s"]
            assert min(row["seconds"]) <= row["median_s"] <= max(row["seconds"]) and len(row["seconds"]) == 2
            paired = [a / b for a, b in zip(rows["ar, compiled"]["seconds"], row["seconds"])]  # round by round
            assert row["vs_compiled_ar_paired"] == {"median": sum(paired) / 2, "low": min(paired),
                                                    "high": max(paired)}
        assert 0 < r["token_statistics"]["median_top1_prob"] <= 1 and r["window_cost_eager"] > 0
    assert result["setup"]["compile"] == "default"
    profile = result["profile"]
    assert profile["sampler"] == "mcsjd, compiled" and len(profile["ops"]) == 10
    assert 0 < sum(op["ms_per_pass"] for op in profile["ops"]) <= 1.01 * profile["ms_per_pass"]
    table = (tmp_path / "compiled_speed.md").read_text()
    assert "| lantern4, compiled |" in table and "Where a pass of `mcsjd, compiled` goes" in table
    assert Image.open(tmp_path / "compiled_speed.png").size[0] > 500


def test_a_sampler_spec_may_not_change_seeds_or_sampling(benchmark_module, monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "benchmarks"))
    speed = benchmark_module("compiled_speed")
    monkeypatch.setattr(sys, "argv", ["compiled_speed.py", "--gpt-model", "tiny", "--tokens", "16", "--samplers",
                                      "hot=mcsjd:temperature=2", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        speed.main()
    assert "give sampler options only" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_a_pipelines_draft_head_reaches_the_samplers(benchmark_module, monkeypatch) -> None:
    """``speculative:drafter=head`` (and ``auto``) time the head the pipeline ships, as ``vgen sample`` runs it."""
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "benchmarks"))
    speed = benchmark_module("compiled_speed")
    seen = {}

    class Recorder:
        def sample(self, model, classes, params, **inputs):
            seen.update(inputs)
            return SimpleNamespace(tokens=torch.zeros(1, 4, dtype=torch.long), stats=SimpleNamespace(forward_passes=2))

    monkeypatch.setattr(speed, "get_sampler", lambda name, **options: Recorder())
    pipe = SimpleNamespace(model=None, tokenizer=None, device=torch.device("cpu"), draft_head="the head")
    run = speed.vgen_method(pipe, SamplerSpec("head", "speculative", {"drafter": "head"}), False,
                            torch.zeros(1, dtype=torch.long), SamplingParams())
    assert run(0)[1] == 2 and seen["draft_head"] == "the head"
