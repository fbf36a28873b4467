"""``vgen bench``'s measurement: sampler specs, the AR reference, ratios that follow from the counts, quality
figures that equal an independent computation on the same images (class accuracy, or a text-to-image model's
accuracy per attribute on held-out prompts), and a table that is the JSON."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from vgen.data.scenes import evaluation_prompts, render_scenes
from vgen.data.shapes import SPLIT_SEEDS
from vgen.eval.bench import (
    COLUMNS,
    SamplerSpec,
    accuracy_of,
    bench_table,
    draw_interleaved,
    parse_sampler_list,
    parse_sampler_spec,
    real_reference,
    row_name,
    run_bench,
    speed_quality_plot,
    with_reference,
    write_outputs,
)
from vgen.eval.classifier import load_shapes_classifier
from vgen.eval.features import shapes_features
from vgen.eval.fid import GaussianStats, frechet_distance
from vgen.eval.quality import attribute_accuracy, class_accuracy, token_statistics
from vgen.eval.sample_many import SamplePlan, sample_many
from vgen.pipelines import load
from vgen.samplers import SamplingParams, get_sampler
from vgen.samplers import ar as ar_module

pytestmark = pytest.mark.filterwarnings("ignore:only .* samples for")  # tiny sets on purpose


@pytest.fixture(scope="module")
def pipe(tiny_shapes_pipeline_dir):
    return load(tiny_shapes_pipeline_dir)


@pytest.fixture(scope="module")
def real(pipe):
    return real_reference(pipe, num_real=48)


@pytest.fixture(scope="module")
def result(pipe, real):
    specs = parse_sampler_list(["ar,sjd", "loose=lantern:lantern_delta=0.5,drafter=jacobi"])
    return run_bench(pipe, specs, num_samples=6, seed=3, batch_size=3, real=real)


@pytest.mark.parametrize("text, expected", [
    ("sjd", SamplerSpec("sjd", "sjd")),
    ("sjd:window=8,draft_init=vertical", SamplerSpec("sjd:window=8,draft_init=vertical", "sjd",
                                                     {"window": 8, "draft_init": "vertical"})),
    ("loose=lantern:lantern_delta=2.0,lantern_mode=relative",
     SamplerSpec("loose", "lantern", {"lantern_delta": 2.0, "lantern_mode": "relative"})),
    ("ar-reseed=ar:seed=3", SamplerSpec("ar-reseed", "ar", {}, 3)),
    ("fast=ar:compile=true", SamplerSpec("fast", "ar", {"compile": True})),
    ("graphs=ar:compile=reduce-overhead", SamplerSpec("graphs", "ar", {"compile": "reduce-overhead"})),
    ("c=cspd:draft_length=8,prefill_ratio=0.1", SamplerSpec("c", "cspd", {"draft_length": 8, "prefill_ratio": 0.1})),
    ("plain=gsd", SamplerSpec("plain", "gsd")),
    ("cool=cspd:temperature=0.5,cfg_scale=4,draft_length=2",
     SamplerSpec("cool", "cspd", {"draft_length": 2}, sampling={"temperature": 0.5, "cfg_scale": 4.0})),
])
def test_specs_name_a_sampler_its_overrides_and_a_label(text, expected):
    assert parse_sampler_spec(text) == expected


@pytest.mark.parametrize("text, message", [
    ("nope", "unknown sampler 'nope'; available: ar, "),
    ("sjd:windoww=8", r"unknown sampler 'sjd' field\(s\) \['windoww'\]"),
    ("sjd:window", "sampler 'sjd:window': bad sampler option 'window': expected key=value"),
    ("sjd:window=-1", r"window must be an integer in \[0, 65536\]"),
    ("sjd:window=2.5", "sampler 'sjd:window=2.5': window must be a whole number, got 2.5"),
    ("lantern:lantern_delta=wide", "sampler 'lantern:lantern_delta=wide': lantern_delta must be a number, got 'wide'"),
    ("ar:compile=sometimes", "compile must be a bool, got 'sometimes'"),
    ("ar:seed=x", "sampler 'ar:seed=x': seed must be a number, got 'x'"),
    ("ar:seed=1.5", "seed must be a whole number"),
    ("ar:temperature=-1", r"sampler 'ar:temperature=-1': temperature must be in \[0, 100\] \(0 = greedy\), got -1.0"),
    ("ar:top_k=x", "sampler 'ar:top_k=x': top_k must be a"),
])
def test_bad_specs_are_named(text, message):
    with pytest.raises(ValueError, match=message):
        parse_sampler_spec(text)


def test_lists_take_comma_separated_names_and_whole_specs():
    specs = parse_sampler_list(["ar,sjd", "x=gsd:window=4,draft_init=left", "lantern"])
    assert [(s.label, s.name) for s in specs] == [("ar", "ar"), ("sjd", "sjd"), ("x", "gsd"), ("lantern", "lantern")]
    assert specs[2].options == {"window": 4, "draft_init": "left"}
    with pytest.raises(ValueError, match="labels must be unique; repeated: sjd"):
        parse_sampler_list(["sjd,ar,sjd"])
    with pytest.raises(ValueError, match="no samplers given"):
        parse_sampler_list([","])


def test_vanilla_ar_is_the_reference_and_is_added_when_missing():
    ar, sjd, reseeded = SamplerSpec("ar", "ar"), SamplerSpec("sjd", "sjd"), SamplerSpec("again", "ar", seed=1)
    assert with_reference([sjd, ar]) == ([sjd, ar], "ar")
    assert with_reference([sjd]) == ([ar, sjd], "ar")
    assert with_reference([reseeded]) == ([ar, reseeded], "ar")  # another seed cannot be the reference
    fewer = SamplerSpec("steps10", "continuous-ar", {"head_steps": 10})
    plain = SamplerSpec("continuous-ar", "continuous-ar")
    assert with_reference([fewer], "continuous-ar") == ([plain, fewer], "continuous-ar")  # nor other options
    cooler = SamplerSpec("t05", "ar", sampling={"temperature": 0.5})
    assert with_reference([cooler]) == ([ar, cooler], "ar")  # nor other sampling settings
    clash = SamplerSpec("ar", "sjd")
    assert with_reference([clash]) == ([SamplerSpec("ar-reference", "ar"), clash], "ar-reference")


def test_a_chosen_reference_is_prepended_and_must_not_reuse_a_label():
    sjd, fast = SamplerSpec("sjd", "sjd"), SamplerSpec("steps10", "continuous-ar", {"head_steps": 10})
    assert with_reference([sjd], "continuous-ar", fast) == ([fast, sjd], "steps10")
    with pytest.raises(ValueError, match="label 'sjd' is also a sampler row's"):
        with_reference([sjd], chosen=sjd)


def test_ratios_are_taken_against_a_chosen_reference_row(pipe, real):
    r = run_bench(pipe, [SamplerSpec("ar", "ar")], num_samples=6, seed=3, batch_size=3, real=real,
                  reference_spec=SamplerSpec("sjd-ref", "sjd"))
    rows = {row["label"]: row for row in r["results"]}
    assert list(rows) == ["sjd-ref", "ar"] and r["setup"]["reference"] == "sjd-ref"
    ref, ar = rows["sjd-ref"], rows["ar"]
    assert ref["step_compression"] == 1 and ref["fid_vs_ar"] is None and ar["fid_vs_ar"] is not None
    assert ar["step_compression"] == ref["forward_passes"] / ar["forward_passes"] < 1  # AR takes more passes
    assert ar["latency_ratio"] == ref["wall_time_s"] / ar["wall_time_s"]


def test_a_reference_row_comes_from_another_model_or_another_sampler_not_both(pipe, nar_pipe, real):
    with pytest.raises(ValueError, match="another model's or another sampler's, not both"):
        run_bench(nar_pipe, [SamplerSpec("nar", "nar")], 4, real=real, reference_pipe=pipe,
                  reference_spec=SamplerSpec("sjd", "sjd"))


def test_ratios_follow_from_the_counts(result):
    rows = {r["label"]: r for r in result["results"]}
    assert list(rows) == ["ar", "sjd", "loose"]
    ar = rows["ar"]
    assert ar["forward_passes"] == 2 * 16  # two batches, one pass per token of a 4 x 4 grid (prefill included)
    assert ar["step_compression"] == 1 and ar["latency_ratio"] == 1 and ar["tokens_per_forward"] == 1
    assert ar["fid_vs_ar"] is None and ar["mean_accepted_length"] == 1
    for r in rows.values():
        assert r["step_compression"] == ar["forward_passes"] / r["forward_passes"]
        assert r["latency_ratio"] == ar["wall_time_s"] / r["wall_time_s"]
        assert r["batch_tokens_per_forward"] == pytest.approx(6 * 16 / r["forward_passes"])
        assert r["tokens_per_forward"] >= r["batch_tokens_per_forward"] / 3  # a row is never slower than its batch
    assert rows["loose"]["step_compression"] > 1 and rows["loose"]["drafter"] == "jacobi"
    assert rows["sjd"]["fid_vs_ar"] >= 0 and rows["loose"]["fid_vs_ar"] >= 0
    assert result["setup"]["reference"] == "ar" and result["setup"]["real_count"] == 48


def test_quality_equals_an_independent_computation_on_sample_many_images(pipe, real, result, tmp_path):
    plan = SamplePlan(3, 3, (0, 1, 2), balanced=True)
    params = SamplingParams(**pipe.info.defaults)
    with np.load(sample_many(pipe, tmp_path / "ar", 6, plan, get_sampler("ar"), params, progress=False).npz) as f:
        images, labels = f["arr_0"], f["arr_1"]
    ar = result["results"][0]
    assert ar["fid"] == pytest.approx(frechet_distance(real.stats, GaussianStats.of(shapes_features(images))).fid)
    pixels = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1
    expected = class_accuracy(load_shapes_classifier(), pixels, labels.tolist())["class_accuracy"]
    assert ar["class_accuracy"] == expected and result["results"][1]["class_accuracy"] is not None


class Recording:
    """A pipeline that notes in ``calls`` which run called it for which batch seed."""

    def __init__(self, pipe, name: str, calls: list) -> None:
        self.pipe, self.name, self.calls, self.model = pipe, name, calls, pipe.model

    def __call__(self, *args, **kwargs):
        self.calls.append((self.name, kwargs["seed"]))
        return self.pipe(*args, **kwargs)


def test_samplers_take_turns_batch_by_batch(pipe):
    calls = []
    plan, params = SamplePlan(0, 2, (0, 1, 2), balanced=True), SamplingParams(**pipe.info.defaults)
    runs = [(Recording(pipe, "ar", calls), get_sampler("ar"), plan, params),
            (Recording(pipe, "sjd", calls), get_sampler("sjd"), plan, params)]
    draws = draw_interleaved(runs, 3)
    first, second = plan.batch_seed(0), plan.batch_seed(1)
    assert calls == [("ar", first), ("sjd", first), ("ar", second), ("sjd", second)]
    assert [len(d.samples) for d in draws] == [3, 3] and [len(d.stats) for d in draws] == [2, 2]


def test_a_compiling_sampler_first_draws_each_batch_size_untimed(pipe, monkeypatch):
    """Its first calls compile: batch 0 and the shorter last batch run once before the timed turns, and their
    seconds are ``compile_s``, not wall time."""
    monkeypatch.setattr(ar_module, "compiled_step", lambda mode: ar_module.decode_last)  # no real compilation
    calls = []
    plan, params = SamplePlan(0, 2, (0, 1, 2), balanced=True), SamplingParams(**pipe.info.defaults)
    runs = [(Recording(pipe, "eager", calls), get_sampler("ar"), plan, params),
            (Recording(pipe, "compiled", calls), get_sampler("ar", compile=True), plan, params)]
    draws = draw_interleaved(runs, 3)
    first, second = plan.batch_seed(0), plan.batch_seed(1)
    assert calls == [("compiled", first), ("compiled", second),
                     ("eager", first), ("compiled", first), ("eager", second), ("compiled", second)]
    assert draws[0].compile_s is None and draws[1].compile_s > 0
    assert [len(d.stats) for d in draws] == [2, 2] and draws[1].row()["compile_s"] == draws[1].compile_s


def test_a_lossless_sampler_under_greedy_decoding_draws_the_same_images(pipe, real):
    greedy = SamplingParams(**{**pipe.info.defaults, "temperature": 0.0})
    r = run_bench(pipe, [SamplerSpec("sjd", "sjd")], 4, 0, 2, greedy, real)["results"]
    assert r[0]["label"] == "ar" and r[1]["fid"] == pytest.approx(r[0]["fid"], abs=1e-9)
    assert r[1]["fid_vs_ar"] == pytest.approx(0, abs=1e-6) and r[1]["step_compression"] >= 1


def test_a_row_samples_with_its_own_settings(pipe, real):
    greedy = SamplerSpec("greedy", "ar", sampling={"temperature": 0.0})
    rows = run_bench(pipe, [greedy], 4, 0, 2, real=real)["results"]
    alone = run_bench(pipe, [SamplerSpec("ar", "ar")], 4, 0, 2,
                      SamplingParams(**{**pipe.info.defaults, "temperature": 0.0}), real)["results"][0]
    assert [r["sampling"] for r in rows] == [{}, {"temperature": 0.0}]
    assert [row_name(r) for r in rows] == ["ar", "greedy (temperature 0.0)"]
    assert rows[1]["fid"] == pytest.approx(alone["fid"], abs=1e-9) and rows[0]["fid"] != rows[1]["fid"]


def test_real_images_identical_to_ars_give_fid_zero_and_stats_files_give_no_kid(pipe, tmp_path):
    plan = SamplePlan(0, 2, (0, 1, 2), balanced=True)
    npz = sample_many(pipe, tmp_path / "ar", 4, plan, get_sampler("ar"), SamplingParams(**pipe.info.defaults),
                      progress=False).npz
    rows = run_bench(pipe, [SamplerSpec("ar", "ar")], 4, 0, 2, real=real_reference(pipe, npz))["results"]
    assert rows[0]["fid"] == pytest.approx(0, abs=1e-6) and isinstance(rows[0]["kid"], float)
    GaussianStats.of(shapes_features(np.load(npz)["arr_0"])).save(str(tmp_path / "stats.npz"))
    from_stats = real_reference(pipe, tmp_path / "stats.npz")
    assert from_stats.features is None and from_stats.stats.count == 4
    rows = run_bench(pipe, [SamplerSpec("ar", "ar")], 4, 0, 2, real=from_stats)["results"]
    assert rows[0]["fid"] == pytest.approx(0, abs=1e-6) and rows[0]["kid"] is None


def test_a_model_of_another_domain_needs_real_images_and_gets_no_class_accuracy(tiny_pipeline_dir, real):
    other = load(tiny_pipeline_dir)  # records no vgen.data set
    with pytest.raises(ValueError, match="model 'tiny' records no vgen.data set .* \\(--real\\)"):
        real_reference(other)
    result = run_bench(other, [SamplerSpec("ar", "ar")], 2, 0, 2, real=real)
    assert result["results"][0]["class_accuracy"] is None
    assert speed_quality_plot(result).size == (1040, 400)  # no accuracy panel without a judge of the samples


def test_the_table_is_the_json(result, tmp_path):
    paths = write_outputs(result, tmp_path / "out")
    assert json.loads(paths["json"].read_text()) == result
    lines = [line for line in paths["markdown"].read_text().splitlines() if line.startswith("|")]
    columns = tuple(c for c in COLUMNS if c != "CLIP score") + ("class accuracy",)  # no CLIP model was given
    assert lines[0] == "| " + " | ".join(columns) + " |" and len(lines) == 2 + len(result["results"])
    for line, r in zip(lines[2:], result["results"]):
        cells = dict(zip(columns, (c.strip() for c in line.strip("|").split("|"))))
        assert cells["sampler"] == r["label"] and int(cells["forward passes"]) == r["forward_passes"]
        assert cells["step compression"] == f"{r['step_compression']:.2f}x"
        assert cells["latency ratio"] == f"{r['latency_ratio']:.2f}x"
        assert cells["tokens / s"] == f"{r['tokens_per_second']:.0f}"
        assert float(cells["tokens / forward"]) == pytest.approx(r["tokens_per_forward"], abs=0.005)
        assert cells["entropy (nats)"] == f"{r['mean_entropy_nats']:.2f}"
        assert cells["top-1"] == f"{r['median_top1_prob']:.2f}"
        assert float(cells["FID vs real"]) == pytest.approx(r["fid"], abs=0.005)
        assert cells["FID vs AR"] == ("-" if r["fid_vs_ar"] is None else f"{r['fid_vs_ar']:.2f}")
        assert cells["class accuracy"] == f"{100 * r['class_accuracy']:.1f}%"
    assert bench_table(result) in paths["markdown"].read_text()
    assert Image.open(paths["plot"]).size == (1560, 400)  # FID over passes and time, accuracy over time


def test_every_row_carries_the_token_statistics_of_its_own_tokens_and_its_tokens_per_second(pipe, real):
    """Entropy and top-1 of the distributions each row drew from, teacher-forced on that row's own tokens with its
    own settings (here a greedy row beside the reference's sampling)."""
    greedy = SamplerSpec("greedy", "sjd", sampling={"temperature": 0.0})
    result = run_bench(pipe, [greedy], 4, 0, 2, real=real)
    plan = SamplePlan(0, 2, (0, 1, 2), balanced=True)
    for row, temperature in zip(result["results"], (None, 0.0)):
        params = SamplingParams(**{**pipe.info.defaults, **({} if temperature is None else
                                                            {"temperature": temperature})})
        drawn = [pipe(plan.labels(plan.batch_indices(k, 4)), sampler=row["sampler"], seed=plan.batch_seed(k),
                      **params.to_dict()) for k in range(2)]
        expected = token_statistics(pipe.model, torch.cat([d.tokens for d in drawn]),
                                    torch.tensor(plan.labels(range(4))), params)
        assert row["mean_entropy_nats"] == pytest.approx(expected["mean_entropy_nats"])
        assert row["median_top1_prob"] == pytest.approx(expected["median_top1_prob"])
        assert row["tokens_per_second"] == pytest.approx(4 * 16 / row["wall_time_s"])


def test_the_setup_carries_the_reference_rows_token_statistics(pipe, result, tmp_path):
    """Entropy and top-1 of the distributions AR drew its tokens from, recomputed here from AR's own tokens."""
    plan = SamplePlan(3, 3, (0, 1, 2), balanced=True)
    params = SamplingParams(**pipe.info.defaults)
    drawn = [pipe(plan.labels(plan.batch_indices(k, 6)), sampler="ar", seed=plan.batch_seed(k), **params.to_dict())
             for k in range(2)]
    expected = token_statistics(pipe.model, torch.cat([d.tokens for d in drawn]),
                                torch.tensor([c for k in range(2) for c in plan.labels(plan.batch_indices(k, 6))]),
                                params)
    figures = result["setup"]["reference_token_statistics"]
    assert figures["tokens_measured"] == 6 * 16
    assert figures["mean_entropy_nats"] == pytest.approx(expected["mean_entropy_nats"])
    assert figures["median_top1_prob"] == pytest.approx(expected["median_top1_prob"])
    header = write_outputs(result, tmp_path)["markdown"].read_text().splitlines()[0]
    assert (f"mean entropy {figures['mean_entropy_nats']:.2f} nats and median top-1 probability "
            f"{figures['median_top1_prob']:.2f}") in header


def test_a_continuous_model_is_measured_against_target_only_sampling(tiny_continuous_pipeline_dir, real):
    pipe = load(tiny_continuous_pipeline_dir)
    result = run_bench(pipe, [SamplerSpec("cspd", "cspd")], 2, 0, 2, real=real)
    rows = result["results"]
    assert [r["label"] for r in rows] == ["continuous-ar", "cspd"]
    assert rows[0]["step_compression"] == 1 and rows[1]["fid_vs_ar"] is not None
    assert result["setup"]["reference_token_statistics"] is None  # no next-token distributions to measure


@pytest.fixture
def nar_pipe(pipe, tiny_nar_factory):
    """A NAR model on the tiny pipeline's tokenizer, classes and data: another backbone on the same domain."""
    from vgen.pipelines import ImagePipeline

    return ImagePipeline(tiny_nar_factory((4, 4), vocab_size=32, num_classes=3), pipe.tokenizer, pipe.info)


def test_a_reference_model_draws_the_reference_row_with_its_own_sampler(pipe, nar_pipe, real, result):
    """NAR against next-token AR: the AR row is the other model's, the same images as its own benchmark."""
    r = run_bench(nar_pipe, [SamplerSpec("nar", "nar")], num_samples=6, seed=3, batch_size=3, real=real,
                  reference_pipe=pipe)
    rows = {row["label"]: row for row in r["results"]}
    reference = f"ar ({pipe.info.name})"
    assert list(rows) == [reference, "nar"] and r["setup"]["reference"] == reference
    assert r["setup"]["reference_model"] == pipe.info.name
    assert rows[reference]["forward_passes"] == 2 * 16 and rows["nar"]["forward_passes"] == 2 * (4 + 4 - 1)
    assert rows["nar"]["step_compression"] == 16 / 7
    assert rows[reference]["fid"] == pytest.approx(result["results"][0]["fid"])  # AR's images, as in its own run


def test_a_reference_model_of_other_classes_is_refused(pipe, real, tiny_nar_factory):
    from vgen.pipelines import ImagePipeline, PipelineInfo

    other = ImagePipeline(tiny_nar_factory((4, 4), vocab_size=32, num_classes=5), pipe.tokenizer,
                          PipelineInfo(name="five", image_size=16, class_names=list("abcde")))
    with pytest.raises(ValueError, match="the reference model 'five' draws 5 classes at 16 px"):
        run_bench(pipe, [SamplerSpec("ar", "ar")], 4, reference_pipe=other, real=real)


def test_a_video_model_is_measured_on_clips_by_fvd_and_clip_class_accuracy(tiny_video_ar_pipeline_dir, tmp_path):
    from vgen.data.clips import SPLIT_SEEDS, ClipsConfig, render_clips
    from vgen.eval.features import shapes_video_features
    from vgen.eval.quality import clip_class_accuracy

    video = load(tiny_video_ar_pipeline_dir)
    real = real_reference(video, num_real=6)
    clips, _ = render_clips(SPLIT_SEEDS["val"], 0, 6, ClipsConfig(num_frames=3, frame_size=16))
    assert real.stats.mu == pytest.approx(GaussianStats.of(shapes_video_features(clips)).mu)
    result = run_bench(video, [SamplerSpec("mcsjd", "mcsjd")], 4, 0, 2, real=real)
    assert result["setup"]["features"] == "shapes-video" and "rendered validation clips" in result["setup"]["real"]
    plan = SamplePlan(0, 2, (0, 1, 2), balanced=True)
    params = SamplingParams(**video.info.defaults)
    drawn = [video(plan.labels(plan.batch_indices(k, 4)), sampler="ar", seed=plan.batch_seed(k), **params.to_dict())
             for k in range(2)]
    videos = np.concatenate([d.videos for d in drawn])
    labels = [c for d in drawn for c in d.class_ids]
    ar, mcsjd = result["results"]
    assert ar["fid"] == pytest.approx(frechet_distance(real.stats, GaussianStats.of(shapes_video_features(videos))).fid)
    assert ar["class_accuracy"] == clip_class_accuracy(videos, labels)["class_accuracy"]
    assert ar["forward_passes"] == 2 * 48 and mcsjd["forward_passes"] < ar["forward_passes"]
    table = write_outputs(result, tmp_path)["markdown"].read_text()
    assert "| FVD vs real | KVD vs real | FVD vs AR |" in table and "FVD/KVD in shapes-video features" in table


# ---- a text-to-image model: held-out prompts, judged per attribute ------------------------------------------------

ATTRIBUTE_COLUMNS = ("shape", "colour", "size", "position", "background", "position_row", "position_column", "joint")


@pytest.fixture(scope="module")
def t2i(tiny_t2i_pipeline_dir):
    return load(tiny_t2i_pipeline_dir)


@pytest.fixture(scope="module")
def t2i_result(t2i, tiny_scene_judge):
    real = real_reference(t2i, num_real=8)
    return run_bench(t2i, [SamplerSpec("sjd", "sjd")], 4, 1, 2, real=real, judge=tiny_scene_judge), real


def test_a_text_model_draws_the_held_out_prompts_against_their_rendered_scenes(t2i, t2i_result, tmp_path):
    result, real = t2i_result
    scenes, _, _ = render_scenes(SPLIT_SEEDS["test"], 0, 8, 16)
    assert real.stats.mu == pytest.approx(GaussianStats.of(shapes_features(scenes)).mu)
    assert "rendered held-out scenes of vgen.data.scenes (16 px" in result["setup"]["real"]
    prompts, _ = evaluation_prompts(4)
    npz = sample_many(t2i, tmp_path / "ar", 4, SamplePlan(1, 2, prompts=tuple(prompts)), get_sampler("ar"),
                      SamplingParams(**t2i.info.defaults), progress=False).npz
    with np.load(npz) as f:
        images = f["arr_0"]
        assert f["prompts"].tolist() == prompts
    ar = result["results"][0]
    assert ar["label"] == "ar" and result["setup"]["conditioning"] == "prompts"
    assert ar["fid"] == pytest.approx(frechet_distance(real.stats, GaussianStats.of(shapes_features(images))).fid)


def test_a_text_models_quality_is_the_scene_judges_accuracy_per_attribute(t2i, t2i_result, tiny_scene_judge):
    result, _ = t2i_result
    prompts, attributes = evaluation_prompts(4)
    plan, params = SamplePlan(1, 2, prompts=tuple(prompts)), SamplingParams(**t2i.info.defaults)
    drawn = [t2i(**plan.inputs(plan.batch_indices(k, 4)), sampler="ar", seed=plan.batch_seed(k), **params.to_dict())
             for k in range(2)]
    images = np.stack([np.asarray(im) for d in drawn for im in d.images])
    ar, sjd = result["results"]
    assert ar["attribute_accuracy"] == attribute_accuracy(tiny_scene_judge, images, attributes)
    assert tuple(ar["attribute_accuracy"]) == ATTRIBUTE_COLUMNS and ar["class_accuracy"] is None
    assert tuple(sjd["attribute_accuracy"]) == ATTRIBUTE_COLUMNS
    expected = token_statistics(t2i.model, torch.cat([d.tokens for d in drawn]), t2i.prompt_encoder(prompts), params)
    figures = result["setup"]["reference_token_statistics"]
    assert figures["tokens_measured"] == 4 * 16
    assert figures["mean_entropy_nats"] == pytest.approx(expected["mean_entropy_nats"])


def test_a_text_models_table_has_one_column_per_attribute(t2i_result, tmp_path):
    result, _ = t2i_result
    text = write_outputs(result, tmp_path)["markdown"].read_text()
    header = text.splitlines()[0]
    assert "(one per held-out scene prompt)" in header and "accuracy per attribute from the scene judge" in header
    assert "mean entropy" in header
    lines = [line for line in text.splitlines() if line.startswith("|")]
    columns = COLUMNS[:-1] + ATTRIBUTE_COLUMNS
    assert lines[0] == "| " + " | ".join(columns) + " |"
    for line, r in zip(lines[2:], result["results"]):
        cells = dict(zip(columns, (c.strip() for c in line.strip("|").split("|"))))
        assert cells["sampler"] == r["label"]
        assert [cells[c] for c in ATTRIBUTE_COLUMNS] == [f"{100 * r['attribute_accuracy'][c]:.1f}%"
                                                         for c in ATTRIBUTE_COLUMNS]
        assert accuracy_of(r) == r["attribute_accuracy"]["joint"]  # the accuracy panel's figure
    assert Image.open(tmp_path / "bench.png").size == (1560, 400)


def test_a_reference_model_must_take_the_same_conditioning(pipe, t2i, real):
    with pytest.raises(ValueError, match="the reference model 'tiny-t2i' draws prompts at 16 px and 'tiny' 3 classes "
                                         "at 16 px: they cannot be compared"):
        run_bench(pipe, [SamplerSpec("ar", "ar")], 4, reference_pipe=t2i, real=real)


def test_a_missing_scene_judge_fails_before_any_sampling(t2i, t2i_result, monkeypatch):
    from vgen.eval import bench
    from vgen.hub import CheckpointError

    def missing():
        raise CheckpointError("no config.json in shapes-scene-judge")

    monkeypatch.setattr(bench, "load_scene_judge", missing)
    monkeypatch.setattr(bench, "draw_interleaved", lambda *a, **k: pytest.fail("sampled without a judge"))
    with pytest.raises(CheckpointError, match="shapes-scene-judge"):
        run_bench(t2i, [SamplerSpec("ar", "ar")], 2, real=t2i_result[1])


# ---- a text model of another domain: a prompt set, the CLIP score, no judge of its own ------------------------

PARTI = "Prompt\tCategory\tChallenge\tNote\na red cat\tAnimals\tBasic\t\na blue dog on the mat\tAnimals\tBasic\t\n" \
        "a map of the river\tArtifacts\tComplex\t\n"


@pytest.fixture
def llamagen_t2i(llamagen_t2i_folder):
    return load(llamagen_t2i_folder)


@pytest.fixture
def parti(tmp_path):
    from vgen.data.prompts import read_prompt_set

    (tmp_path / "parti.tsv").write_text(PARTI)
    return read_prompt_set(tmp_path / "parti.tsv")


def test_a_text_model_of_another_domain_draws_a_prompt_set_scored_by_clip(llamagen_t2i, parti, tiny_clip_dir,
                                                                          tmp_path):
    """The prompts in turn, the CLIP score of each row equal to CLIP's own on the same images, no Fréchet
    distance without a feature set, and the table and plot built of what there is."""
    from vgen.eval.clip import clip_mean, load_clip

    clip = load_clip(tiny_clip_dir)
    result = run_bench(llamagen_t2i, [SamplerSpec("sjd", "sjd")], 4, 0, 2, prompts=parti, clip=clip)
    plan, params = SamplePlan(0, 2, prompts=parti.prompts), SamplingParams(**llamagen_t2i.info.defaults)
    drawn = [llamagen_t2i(**plan.inputs(plan.batch_indices(k, 4)), sampler="ar", seed=plan.batch_seed(k),
                          **params.to_dict()) for k in range(2)]
    images = np.stack([np.asarray(im) for d in drawn for im in d.images])
    prompts = [parti.prompts[j] for j in plan.labels(range(4))]
    ar, sjd = result["results"]
    assert prompts[3] == prompts[0] and ar["clip_score"] == pytest.approx(clip_mean(clip.scores(images, prompts)))
    assert sjd["clip_score"] is not None and sjd["mean_entropy_nats"] > 0
    assert all(r[key] is None for r in (ar, sjd) for key in ("fid", "kid", "fid_vs_ar", "class_accuracy",
                                                              "attribute_accuracy"))
    setup = result["setup"]
    assert setup["features"] is None and setup["real"] is None and setup["clip"] == str(tiny_clip_dir)
    assert setup["prompt_set"] == {"source": str(tmp_path / "parti.tsv"), "format": "parti", "count": 3}
    paths = write_outputs(result, tmp_path / "out")
    text = paths["markdown"].read_text()
    assert "(the 3 prompts of parti.tsv, parti format, in turn)" in text and "no Fréchet distances" in text
    header = [line for line in text.splitlines() if line.startswith("|")][0]
    assert header == ("| sampler | drafter | forward passes | step compression | wall time (s) | latency ratio | "
                      "tokens / s | tokens / forward | entropy (nats) | top-1 | CLIP score |")
    assert Image.open(paths["plot"]).size == (1040, 400)  # the CLIP score over passes and over time


def test_a_feature_set_without_real_images_gives_the_distance_to_ars_samples(llamagen_t2i, parti):
    from vgen.eval.features import load_extractor

    rows = run_bench(llamagen_t2i, [SamplerSpec("sjd", "sjd")], 4, 0, 2, prompts=parti,
                     extractor=load_extractor("shapes"))["results"]
    assert rows[0]["fid"] is None and rows[0]["fid_vs_ar"] is None
    assert rows[1]["fid"] is None and rows[1]["fid_vs_ar"] >= 0


def test_the_breakdown_by_category_is_each_categorys_own_samples(llamagen_t2i, parti, tiny_clip_dir, tmp_path):
    from vgen.eval.clip import clip_mean, load_clip

    clip = load_clip(tiny_clip_dir)
    result = run_bench(llamagen_t2i, [SamplerSpec("sjd", "sjd")], 6, 0, 3, prompts=parti, clip=clip,
                       by_category=True)
    plan, params = SamplePlan(0, 3, prompts=parti.prompts), SamplingParams(**llamagen_t2i.info.defaults)
    drawn = [llamagen_t2i(**plan.inputs(plan.batch_indices(k, 6)), sampler="sjd", seed=plan.batch_seed(k),
                          **params.to_dict()) for k in range(2)]
    images = np.stack([np.asarray(im) for d in drawn for im in d.images])
    labels = plan.labels(range(6))
    scores = clip.scores(images, [parti.prompts[j] for j in labels])
    per_row = [v for d in drawn for v in d.stats.row_tokens_per_forward]
    categories = result["categories"]
    assert list(categories) == ["Animals", "Artifacts"] and list(categories["Animals"]) == ["ar", "sjd"]
    for category, count in (("Animals", 4), ("Artifacts", 2)):
        mine = [i for i, j in enumerate(labels) if parti.categories[j] == category]
        assert len(mine) == count and categories[category]["ar"]["tokens_per_forward"] == 1
        sjd = categories[category]["sjd"]
        assert sjd["samples"] == count and sjd["clip_score"] == pytest.approx(clip_mean(scores[mine]))
        assert sjd["tokens_per_forward"] == pytest.approx(np.mean([per_row[i] for i in mine]))
    text = write_outputs(result, tmp_path)["markdown"].read_text()
    assert "| tokens / forward by category | samples | ar | sjd |" in text
    assert "| CLIP score by category | samples | ar | sjd |" in text
    ar, sjd = categories["Animals"]["ar"]["clip_score"], categories["Animals"]["sjd"]["clip_score"]
    assert f"| Animals | 4 | {ar:.2f} | {sjd:.2f} ({sjd - ar:+.2f}) |" in text
    with pytest.raises(ValueError, match="a breakdown by category needs a prompt set with categories"):
        run_bench(llamagen_t2i, [], 2, prompts=replace(parti, categories=None), by_category=True)


def test_a_text_model_needs_a_prompt_set_and_a_class_model_refuses_one(llamagen_t2i, pipe, parti, real):
    with pytest.raises(ValueError, match="is a text-to-image model: give it a prompt set .*--prompts FILE"):
        run_bench(llamagen_t2i, [SamplerSpec("ar", "ar")], 2)
    with pytest.raises(ValueError, match="tiny is class-conditional: it draws classes, not a prompt set"):
        run_bench(pipe, [SamplerSpec("ar", "ar")], 2, prompts=parti, real=real)


def test_statistics_of_other_features_are_refused(pipe, tmp_path):
    GaussianStats(np.zeros(2), np.eye(2), 4, features="inception").save(str(tmp_path / "stats.npz"))
    with pytest.raises(ValueError, match="holds statistics of inception features, not shapes"):
        real_reference(pipe, tmp_path / "stats.npz")
