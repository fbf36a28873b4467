"""Speed x quality of every requested sampler on one model, in one run (what ``vgen bench`` prints).

Every sampler draws the same images: ``num_samples`` of them, classes in turn, in batches seeded as
:class:`~vgen.eval.sample_many.SamplePlan` seeds them (so vanilla AR's images are the first ``num_samples`` of
``vgen sample-many --balanced`` with the same seed and batch size). Per sampler, relative to vanilla AR in the same
run (DESIGN.md's units):

- ``forward_passes`` (target-model calls, each serving a whole batch) and ``step_compression`` = AR's / the
  sampler's; ``wall_time_s`` (sampling only; a sampler that compiles first draws its first batches untimed,
  ``compile_s``) and ``latency_ratio`` = AR's / the sampler's. The samplers take
  turns batch by batch, so a change in background load reaches all of them alike;
- ``tokens_per_forward``: a row's tokens per target pass it took, averaged over rows; ``batch_tokens_per_forward``:
  a batch's tokens per batched target pass (a batch runs until its slowest row is done);
- ``fid``, ``kid``: in vgen's offline ``shapes`` features against real images (the validation split of the
  ``vgen.data.shapes`` set the pipeline records, rendered; or ``real``: a folder, ``.npz``, ``.npy`` or stats
  file); ``fid_vs_ar``: against vanilla AR's images (a lossless sampler stays at the level of two AR runs);
- ``class_accuracy``: the shipped shapes classifier's, for models trained on ``vgen.data.shapes``.

A video pipeline draws clips instead: the Fréchet distances are then FVD in vgen's ``shapes-video`` features
(the shipped video feature network) against rendered validation clips of the moving-shapes data, and the class
accuracy is the per-frame classifier's clip accuracy (:func:`~vgen.eval.quality.clip_class_accuracy`).

A text-to-image pipeline draws one image per held-out prompt of ``vgen.data.scenes``
(:func:`~vgen.data.scenes.evaluation_prompts`) instead of classes in turn; the real images are the held-out scenes
those prompts describe, rendered, and its quality is the scene judge's accuracy per attribute (shape, colour, size,
position, background) and on all of them at once (``joint``: :func:`~vgen.eval.quality.attribute_accuracy`) in
place of class accuracy.

With fewer samples than the features' dimensions (192 for images, 128 for clips) the distances are strongly biased
upward: compare the rows of one run.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

from vgen.data.clips import SPLIT_SEEDS as CLIP_SPLIT_SEEDS
from vgen.data.clips import ClipsConfig, render_clips
from vgen.data.scenes import evaluation_prompts, render_scenes
from vgen.data.shapes import SPLIT_SEEDS as SHAPE_SPLIT_SEEDS
from vgen.data.shapes import ShapesConfig, render_batch
from vgen.eval.classifier import load_scene_judge, load_shapes_classifier
from vgen.eval.features import is_stats_file, load_images, shapes_features, shapes_video_features
from vgen.eval.fid import GaussianStats, frechet_distance, kernel_inception_distance, kid_subset_size_for
from vgen.eval.quality import attribute_accuracy, class_accuracy, clip_class_accuracy, token_statistics
from vgen.eval.sample_many import SamplePlan, samples_of
from vgen.eval.videos import load_videos
from vgen.images import image_grid
from vgen.models.classifier import AttributeClassifier
from vgen.pipelines import ImagePipeline, default_sampler
from vgen.samplers import Sampler, SamplingParams, get_sampler
from vgen.samplers.options import declarations, parse_option
from vgen.visualize import scatter_plot

REFERENCE = "ar"
SAMPLING_FIELDS = declarations(SamplingParams)  # the keys a spec may set for its own row
PROMPT_SPLIT = "test"  # the scenes split whose held-out prompts (and their images) a text-to-image model is benched on
OUTPUTS = {"json": "bench.json", "markdown": "bench.md", "plot": "bench.png"}
COLUMNS = ("sampler", "drafter", "forward passes", "step compression", "wall time (s)", "latency ratio",
           "tokens / forward", "FID vs real", "KID vs real", "FID vs AR", "class accuracy")


def is_video(pipe: ImagePipeline) -> bool:
    """Whether ``pipe`` draws clips (a backbone over frames x rows x columns)."""
    return len(pipe.model.grid) == 3


def features_of(samples: np.ndarray) -> np.ndarray:
    """vgen's offline domain features of uint8 images [N, H, W, 3] (``shapes``) or clips [N, T, H, W, 3]
    (``shapes-video``)."""
    return shapes_video_features(samples) if samples.ndim == 5 else shapes_features(samples)


@dataclass(frozen=True)
class SamplerSpec:
    """One row of the benchmark: a label, a registered sampler with field overrides, optionally its own seed
    (``ar-reseed=ar:seed=1``: vanilla AR on other seeds, the noise floor of the quality columns) and its own
    sampling settings (``t07=continuous-ar:temperature=0.7``: :class:`SamplingParams` fields over the run's)."""

    label: str
    name: str
    options: dict = field(default_factory=dict)
    seed: int | None = None
    sampling: dict = field(default_factory=dict)

    def sampler(self) -> Sampler:
        return get_sampler(self.name, **self.options)


def parse_sampler_spec(spec: str) -> SamplerSpec:
    """``name``, ``name:key=value,...`` or ``label=name:key=value,...`` (e.g. ``sjd8=sjd:window=8``); each value is
    read as its declared field type (:func:`~vgen.samplers.options.parse_option`), ``seed`` as an integer; a
    :class:`SamplingParams` field that the sampler does not declare (``temperature``, ``cfg_scale``, ...) sets the
    row's sampling. Checked against the registry and the fields' valid values (a ValueError naming the spec)."""
    label, sep, rest = spec.partition("=")
    if not sep or ":" in label:
        label, rest = spec, spec
    name, _, opts = rest.partition(":")
    try:
        declared = declarations(type(get_sampler(name)))
        options, sampling = {}, {}
        for item in filter(None, opts.split(",")):
            key, eq, value = item.partition("=")
            if not eq or not key:
                raise ValueError(f"bad sampler option {item!r}: expected key=value")
            if key not in declared and key in SAMPLING_FIELDS:
                sampling[key] = parse_option(key, value, SAMPLING_FIELDS[key].kind)
                continue
            kind = int if key == "seed" else declared[key].kind if key in declared else str
            options[key] = parse_option(key, value, kind)  # an unknown key is refused by the sampler below
        seed = options.pop("seed", None)
        parsed = SamplerSpec(label, name, options, seed, sampling)
        parsed.sampler()
        SamplingParams(**sampling)
    except ValueError as e:
        raise ValueError(f"sampler {spec!r}: {e}") from None
    return parsed


def parse_sampler_list(items: Sequence[str]) -> list[SamplerSpec]:
    """Specs from command-line items, each a comma-separated list of names (``ar,sjd,gsd``) or one spec with
    options (``sjd8=sjd:window=8,draft_init=vertical``, whose commas separate options)."""
    specs = []
    for item in items:
        parts = [item] if ":" in item else [p for p in item.split(",") if p]
        specs += [parse_sampler_spec(p) for p in parts]
    if not specs:
        raise ValueError("no samplers given")
    labels = [s.label for s in specs]
    repeated = sorted({x for x in labels if labels.count(x) > 1})
    if repeated:
        raise ValueError(f"sampler labels must be unique; repeated: {', '.join(repeated)} (name them: label=name)")
    return specs


def with_reference(specs: list[SamplerSpec], reference: str = REFERENCE,
                   chosen: SamplerSpec | None = None) -> tuple[list[SamplerSpec], str]:
    """The specs, with the plain one-token-per-pass sampler ``reference`` (vanilla AR, or ``continuous-ar`` for a
    continuous model) prepended when none is asked for, and the label of the reference row. A spec of that
    sampler with options or another seed is a row to compare, not the reference. A ``chosen`` spec (say
    ``continuous-ar`` with fewer head steps) is prepended as the reference instead."""
    if chosen is not None:
        if chosen.label in {s.label for s in specs}:
            raise ValueError(f"the reference row's label {chosen.label!r} is also a sampler row's; name it: "
                             f"label=name:key=value")
        return [chosen, *specs], chosen.label
    for s in specs:
        if s.name == reference and s.seed is None and not s.options and not s.sampling:
            return specs, s.label
    label = reference if reference not in {s.label for s in specs} else f"{reference}-reference"
    return [SamplerSpec(label, reference), *specs], label


@dataclass
class RealReference:
    """Statistics of the real images in the shapes features, their features when available (for KID), and where
    they came from."""

    stats: GaussianStats
    features: np.ndarray | None
    source: str


def real_reference(pipe: ImagePipeline, real: str | Path | None = None, num_real: int = 1024) -> RealReference:
    """``real`` (image or clip set, or stats file), else ``num_real`` rendered validation images (clips) of the
    pipeline's data, or for a text-to-image model the held-out scenes its benchmark prompts describe."""
    if real is not None:
        if is_stats_file(real):
            return RealReference(GaussianStats.load(str(real)), None, str(real))
        feats = features_of(load_videos(real) if is_video(pipe) else load_images(real))
        return RealReference(GaussianStats.of(feats), feats, str(real))
    if num_real < 2:
        raise ValueError(f"need at least 2 real samples, got {num_real}")
    if is_video(pipe):
        clips = ClipsConfig(num_frames=pipe.num_frames, frame_size=pipe.info.image_size)
        samples, _ = render_clips(CLIP_SPLIT_SEEDS["val"], 0, num_real, clips)
        source = (f"{num_real} rendered validation clips of vgen.data.clips ({clips.num_frames} frames of "
                  f"{clips.frame_size} px)")
    elif pipe.text_conditional:
        samples, _, _ = render_scenes(SHAPE_SPLIT_SEEDS[PROMPT_SPLIT], 0, num_real, pipe.info.image_size)
        source = (f"{num_real} rendered held-out scenes of vgen.data.scenes ({pipe.info.image_size} px; the first "
                  f"ones are those the prompts describe)")
    elif pipe.info.data is None:
        raise ValueError(f"model {pipe.info.name!r} records no vgen.data set to render real images from; give real "
                         f"images or statistics (--real)")
    else:
        samples, _ = render_batch(SHAPE_SPLIT_SEEDS["val"], 0, num_real, ShapesConfig(**pipe.info.data))
        source = f"{num_real} rendered validation images of vgen.data.shapes ({json.dumps(pipe.info.data)})"
    feats = features_of(samples)
    return RealReference(GaussianStats.of(feats), feats, source)


@dataclass
class Draw:
    """One sampler's images (uint8 [N, H, W, 3]) or clips ([N, T, H, W, 3]) and what drawing them cost, summed over
    batches."""

    samples: list[np.ndarray] = field(default_factory=list)
    tokens: list[torch.Tensor] = field(default_factory=list)  # each batch's token ids (latents for a continuous model)
    labels: list[int] = field(default_factory=list)  # class ids, or the numbers of the plan's prompts
    stats: list = field(default_factory=list)  # the SamplerStats of every batch
    compile_s: float | None = None  # a compiling sampler's untimed first batches (see draw_interleaved)

    def add(self, pipe: ImagePipeline, sampler: Sampler, plan: SamplePlan, params: SamplingParams, k: int,
            num_samples: int) -> None:
        """Draw batch ``k`` of ``plan`` (cut short at ``num_samples``) and keep its samples and stats."""
        out = draw_batch(pipe, sampler, plan, params, k, num_samples)
        self.samples += samples_of(out)
        self.tokens.append(out.tokens)
        self.labels += plan.labels(plan.batch_indices(k, num_samples))
        self.stats.append(out.stats)

    def warm_up(self, pipe: ImagePipeline, sampler: Sampler, plan: SamplePlan, params: SamplingParams,
                num_samples: int) -> None:
        """Draw, untimed and discarded, batch 0 and (when shorter) the last batch: the calls in which a compiling
        sampler compiles its graphs for each batch size it will meet. Their seconds are ``compile_s``."""
        last = plan.num_batches(num_samples) - 1
        sizes = {len(plan.batch_indices(k, num_samples)): k for k in (last, 0)}  # batch 0 wins a tie
        start = time.perf_counter()
        for k in sorted(sizes.values()):
            draw_batch(pipe, sampler, plan, params, k, num_samples)
        self.compile_s = time.perf_counter() - start

    def row(self) -> dict:
        """The cost columns of the benchmark row, summed over batches."""
        s = self.stats
        lengths = [n for x in s for n in x.accepted_lengths]
        rows = sum(x.batch_size for x in s)
        return {"drafter": s[-1].details.get("drafter"), "forward_passes": sum(x.forward_passes for x in s),
                "wall_time_s": sum(x.wall_time_s for x in s),
                "tokens_per_forward": sum(x.tokens_per_forward * x.batch_size for x in s) / rows,
                "batch_tokens_per_forward": sum(x.tokens for x in s) / sum(x.forward_passes for x in s),
                "mean_accepted_length": statistics.mean(lengths) if lengths else 1.0, "compile_s": self.compile_s}


def draw_batch(pipe: ImagePipeline, sampler: Sampler, plan: SamplePlan, params: SamplingParams, k: int,
               num_samples: int):
    """The pipeline's output for batch ``k`` of ``plan`` (cut short at ``num_samples``)."""
    indices = plan.batch_indices(k, num_samples)
    return pipe(**plan.inputs(indices), sampler=sampler, seed=plan.batch_seed(k), **params.to_dict())


def draw_interleaved(runs: Sequence[tuple[ImagePipeline, Sampler, SamplePlan, SamplingParams]], num_samples: int,
                     progress: bool = False) -> list[Draw]:
    """The first ``num_samples`` images (clips) of every ``(pipeline, sampler, plan, params)``, drawn batch by batch in
    turn (batch 0 of every sampler, then batch 1, ...), so that changes in background load reach every sampler's
    wall time alike instead of whichever ran during them. A sampler that compiles (its ``compile`` set) first warms
    up (:meth:`Draw.warm_up`), so that its wall time is sampling, not compilation."""
    draws = [Draw() for _ in runs]
    for run, d in zip(runs, draws):
        if getattr(run[1], "compile", False):
            d.warm_up(*run, num_samples)
    batches = runs[0][2].num_batches(num_samples)  # every plan has the same batch size
    with tqdm(total=batches * len(runs), desc="bench", unit="batch", disable=not progress) as bar:
        for k in range(batches):
            for run, d in zip(runs, draws):
                d.add(*run, k, num_samples)
                bar.update()
    return draws


def domain_class_accuracy(pipe: ImagePipeline, samples: np.ndarray, labels: Sequence[int]) -> float | None:
    """The shipped classifier's accuracy on images, or its clip accuracy on clips; None for a model of another
    domain (no vgen.data set recorded)."""
    if is_video(pipe):
        return clip_class_accuracy(samples, labels)["class_accuracy"]
    if pipe.info.data is None:
        return None
    pixels = torch.from_numpy(samples).permute(0, 3, 1, 2).float() / 127.5 - 1
    return class_accuracy(load_shapes_classifier(), pixels, labels)["class_accuracy"]


def reference_token_statistics(pipe: ImagePipeline, draw: Draw, plan: SamplePlan,
                               params: SamplingParams) -> dict | None:
    """Mean entropy (nats) and median top-1 probability of the distributions the reference row drew its tokens
    from (``plan`` says each sample's class or prompt): how spread out the model's predictions are sets how far a
    speculative sampler can go, so every table prints them beside its speed-ups. None for a model of continuous
    tokens."""
    tokens = torch.cat(draw.tokens)
    if tokens.is_floating_point():
        return None
    if plan.prompts:
        cond = pipe.prompt_encoder([plan.prompts[j] for j in draw.labels])
    else:
        cond = torch.tensor(draw.labels, device=pipe.device)
    figures = token_statistics(pipe.model, tokens.to(pipe.device), cond, params)
    return {key: figures[key] for key in ("mean_entropy_nats", "median_top1_prob", "tokens_measured")}


def check_reference_model(pipe: ImagePipeline, reference_pipe: ImagePipeline) -> None:
    """Refuse a reference model that does not draw what ``pipe`` draws: the same conditioning (prompts, or as many
    classes) at the same image size."""
    def draws(p: ImagePipeline) -> str:
        return f"{'prompts' if p.text_conditional else f'{p.num_classes} classes'} at {p.info.image_size} px"

    if draws(pipe) != draws(reference_pipe):
        raise ValueError(f"the reference model {reference_pipe.info.name!r} draws {draws(reference_pipe)} and "
                         f"{pipe.info.name!r} {draws(pipe)}: they cannot be compared")


def run_bench(pipe: ImagePipeline, specs: Sequence[SamplerSpec], num_samples: int, seed: int = 0,
              batch_size: int = 8, params: SamplingParams | None = None, real: RealReference | None = None,
              progress: bool = False, reference_pipe: ImagePipeline | None = None,
              judge: AttributeClassifier | None = None, reference_spec: SamplerSpec | None = None) -> dict:
    """Measure every sampler of ``specs`` (vanilla AR added first when missing) on the same images; returns
    ``{"setup": ..., "results": [one row per sampler]}`` ready for JSON.

    With ``reference_pipe`` the reference row is another model of the same classes and image size drawn with its
    own default sampler (next-token AR for NAR, say), so the ratios compare two backbones on the same data; with
    ``reference_spec`` it is that sampler on ``pipe`` (the fastest plain setting, say), not the default one. A
    text-to-image model draws the first ``num_samples`` held-out prompts, judged by ``judge`` (default: the
    shipped scene judge).
    """
    if num_samples < 2:
        raise ValueError(f"need at least 2 samples per sampler for FID, got {num_samples}")
    if reference_pipe is not None and reference_spec is not None:
        raise ValueError("the reference row is another model's or another sampler's, not both")
    if reference_pipe is None:
        specs, reference = with_reference(list(specs), default_sampler(pipe.model), reference_spec)
    else:
        check_reference_model(pipe, reference_pipe)
        name = default_sampler(reference_pipe.model)
        reference = f"{name} ({reference_pipe.info.name})"
        specs = [SamplerSpec(reference, name), *specs]
    params = params or SamplingParams(**pipe.info.defaults)
    real = real or real_reference(pipe)
    if pipe.text_conditional:
        prompts, attributes = evaluation_prompts(num_samples, PROMPT_SPLIT)
        judge = judge or load_scene_judge()  # before sampling: a missing judge fails at once

        def plan_of(plan_seed: int) -> SamplePlan:
            return SamplePlan(plan_seed, batch_size, prompts=tuple(prompts))

        def quality(samples: np.ndarray) -> dict:
            return {"class_accuracy": None, "attribute_accuracy": attribute_accuracy(judge, samples, attributes)}
    else:
        classes = tuple(range(pipe.num_classes))
        labels = SamplePlan(seed, batch_size, classes, balanced=True).labels(range(num_samples))

        def plan_of(plan_seed: int) -> SamplePlan:
            return SamplePlan(plan_seed, batch_size, classes, balanced=True)

        def quality(samples: np.ndarray) -> dict:
            return {"class_accuracy": domain_class_accuracy(pipe, samples, labels), "attribute_accuracy": None}
    rows, stats_of = [], {}
    start = time.perf_counter()
    runs = [(reference_pipe if reference_pipe is not None and spec.label == reference else pipe, spec.sampler(),
             plan_of(seed if spec.seed is None else spec.seed), replace(params, **spec.sampling)) for spec in specs]
    draws = draw_interleaved(runs, num_samples, progress)
    for spec, (_, _, plan, _), d in zip(specs, runs, draws):
        samples = np.stack(d.samples)
        feats = features_of(samples)
        stats = GaussianStats.of(feats)
        row = {"label": spec.label, "sampler": spec.name, "options": spec.options, "seed": plan.seed,
               "sampling": spec.sampling, **d.row(),
               "fid": frechet_distance(real.stats, stats).fid,
               "kid": None if real.features is None else kernel_inception_distance(
                   real.features, feats, subset_size=kid_subset_size_for(min(len(real.features), len(feats))))[0],
               "fid_vs_ar": None, **quality(samples)}
        stats_of[spec.label] = stats
        rows.append(row)
    reference_run = next(i for i, spec in enumerate(specs) if spec.label == reference)  # rows follow specs
    base = rows[reference_run]
    reference_pipe_used, _, reference_plan, reference_params = runs[reference_run]
    token_stats = reference_token_statistics(reference_pipe_used, draws[reference_run], reference_plan,
                                             reference_params)
    for row in rows:
        row["step_compression"] = base["forward_passes"] / row["forward_passes"]
        row["latency_ratio"] = base["wall_time_s"] / row["wall_time_s"]
        if row is not base:
            row["fid_vs_ar"] = frechet_distance(stats_of[reference], stats_of[row["label"]]).fid
    setup = {"model": pipe.info.name,
             "reference_model": None if reference_pipe is None else reference_pipe.info.name,
             "conditioning": "prompts" if pipe.text_conditional else "classes",
             "num_samples": num_samples, "batch_size": batch_size, "seed": seed,
             "sampling": params.to_dict(), "reference": reference, "real": real.source, "real_count": real.stats.count,
             "features": "shapes-video" if is_video(pipe) else "shapes", "device": str(pipe.device),
             "dtype": str(next(pipe.model.parameters()).dtype).removeprefix("torch."),
             "threads": torch.get_num_threads(),
             "torch": torch.__version__,
             "reference_token_statistics": token_stats,
             "total_time_s": time.perf_counter() - start}
    return {"setup": setup, "results": rows}


def distance_names(setup: dict) -> tuple[str, str]:
    """("FID", "KID") for images, ("FVD", "KVD") for clips."""
    return ("FVD", "KVD") if setup["features"] == "shapes-video" else ("FID", "KID")


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def quality_figures(row: dict) -> dict[str, float | None]:
    """A row's quality columns: ``class accuracy``, or a text-to-image model's accuracy per attribute and
    ``joint``."""
    if row["attribute_accuracy"] is not None:
        return dict(row["attribute_accuracy"])
    return {"class accuracy": row["class_accuracy"]}


def table_columns(result: dict) -> tuple[str, ...]:
    """The table's header: :data:`COLUMNS` (FVD / KVD for clips), the class accuracy replaced by one column per
    attribute for a text-to-image model."""
    fd, kd = distance_names(result["setup"])
    columns = tuple(c.replace("FID", fd).replace("KID", kd) for c in COLUMNS[:-1])
    return columns + tuple(quality_figures(result["results"][0]))


def row_name(row: dict) -> str:
    """A row's label, with the sampling settings it sets over the run's: ``t05 (temperature 0.5)``."""
    own = row.get("sampling") or {}
    return row["label"] + (f" ({', '.join(f'{k} {v}' for k, v in own.items())})" if own else "")


def bench_table(result: dict) -> str:
    """The results as a Markdown table, one row per sampler in run order."""
    columns = table_columns(result)
    lines = ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    for r in result["results"]:
        quality = " | ".join(_fmt(None if v is None else 100 * v, ".1f", "%") for v in quality_figures(r).values())
        lines.append(f"| {row_name(r)} | {r['drafter'] or '-'} | {r['forward_passes']} | "
                     f"{r['step_compression']:.2f}x | {r['wall_time_s']:.2f} | {r['latency_ratio']:.2f}x | "
                     f"{r['tokens_per_forward']:.2f} | {r['fid']:.2f} | {_fmt(r['kid'], '.4f')} | "
                     f"{_fmt(r['fid_vs_ar'], '.2f')} | {quality} |")
    return "\n".join(lines)


def setup_line(result: dict) -> str:
    s, p = result["setup"], result["setup"]["sampling"]
    prompts = s["conditioning"] == "prompts"
    drawn = "one per held-out scene prompt" if prompts else "classes in turn"
    judged = "; accuracy per attribute from the scene judge" if prompts else ""
    return (f"{s['model']}, {s['num_samples']} samples per sampler ({drawn}), batch {s['batch_size']}, "
            f"seed {s['seed']}, CFG {p['cfg_scale']}, temperature {p['temperature']}, top-k {p['top_k']}, "
            f"top-p {p['top_p']} (unless a row sets its own); {s['device']} {s['dtype']}, {s['threads']} thread(s); "
            f"{'/'.join(distance_names(s))} in {s['features']} features against {s['real']} ({s['real_count']} "
            f"samples){judged}; ratios against `{s['reference']}`{token_clause(s['reference_token_statistics'])}; "
            f"{s['total_time_s']:.0f} s in all.")


def token_clause(figures: dict | None) -> str:
    """", whose next-token distributions ..." for the setup line, or nothing for a continuous model."""
    if figures is None:
        return ""
    return (f", whose next-token distributions have mean entropy {figures['mean_entropy_nats']:.2f} nats and "
            f"median top-1 probability {figures['median_top1_prob']:.2f}")


def accuracy_of(row: dict) -> float | None:
    """A row's class accuracy, or for a text-to-image model the share of samples with every attribute right."""
    if row["class_accuracy"] is not None:
        return row["class_accuracy"]
    return None if row["attribute_accuracy"] is None else row["attribute_accuracy"]["joint"]


def speed_quality_plot(result: dict) -> Image.Image:
    """FID (FVD) against real samples over step compression and over latency ratio, and where the samples were
    judged, class accuracy (joint attribute accuracy) over latency ratio: one labelled point per sampler, the
    ratios against the reference row."""
    rows, fd, ref = result["results"], distance_names(result["setup"])[0], result["setup"]["reference"]
    panels = [scatter_plot([(r["label"], r[key], r["fid"]) for r in rows], xlabel, f"{fd} vs real (lower is better)",
                           title) for key, xlabel, title in (
        ("step_compression", f"step compression vs {ref} (x)", "forward passes"),
        ("latency_ratio", f"latency ratio vs {ref} (x)", "wall time"))]
    if all(accuracy_of(r) is not None for r in rows):
        prompts = result["setup"]["conditioning"] == "prompts"
        panels.append(scatter_plot([(r["label"], r["latency_ratio"], 100 * accuracy_of(r)) for r in rows],
                                   f"latency ratio vs {ref} (x)",
                                   f"{'all attributes right' if prompts else 'class accuracy'} (%)",
                                   "accuracy"))
    return image_grid(panels, len(panels))


def write_outputs(result: dict, out_dir: str | Path) -> dict[str, Path]:
    """``bench.json``, ``bench.md`` (setup line and table) and ``bench.png`` (the plot) in ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {kind: out_dir / name for kind, name in OUTPUTS.items()}
    paths["json"].write_text(json.dumps(result, indent=1) + "\n")
    paths["markdown"].write_text(f"{setup_line(result)}\n\n{bench_table(result)}\n")
    speed_quality_plot(result).save(paths["plot"])
    return paths
