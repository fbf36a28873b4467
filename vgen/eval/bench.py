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

A text-to-image pipeline draws one image per prompt, in turn: the prompts of a prompt set
(:class:`~vgen.data.prompts.PromptSet`: a text file, MS-COCO captions, PartiPrompts, GenEval) when one is given.
vgen's own scenes model (:func:`is_scenes_model`) draws the held-out prompts of ``vgen.data.scenes``
(:func:`~vgen.data.scenes.evaluation_prompts`) by default; its real images are then the held-out scenes those prompts
describe, rendered, and its quality is the scene judge's accuracy per attribute (shape, colour, size, position,
background) and on all of them at once (``joint``: :func:`~vgen.eval.quality.attribute_accuracy`) in place of class
accuracy. Any other text model gets the columns that assume nothing of its domain:

- ``clip_score``: the CLIP score of each sample against its prompt, averaged (:mod:`vgen.eval.clip`), when a CLIP
  model is given;
- ``fid`` / ``kid`` against real images (``real``, e.g. COCO's) and ``fid_vs_ar``, in the feature set given
  (Inception-v3 for real photographs); without one, the Fréchet columns are left empty.

Every row also reports ``tokens_per_second`` (image tokens drawn per second of sampling) and the mean entropy (nats) and
median top-1 probability of the distributions its own tokens were drawn from (``mean_entropy_nats``,
``median_top1_prob``: :func:`~vgen.eval.quality.token_statistics`, teacher-forced). With ``by_category`` and a prompt
set that has categories (PartiPrompts' categories, GenEval's tags), ``categories`` breaks the rows down by category:
samples, tokens per forward (each sample's own) and CLIP score, so that where a lossy sampler loses shows.

With fewer samples than the features' dimensions (192 for images, 128 for clips) the distances are strongly biased
upward: compare the rows of one run.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

from vgen.data.clips import SPLIT_SEEDS as CLIP_SPLIT_SEEDS
from vgen.data.clips import ClipsConfig, render_clips
from vgen.data.prompts import PromptSet
from vgen.data.scenes import evaluation_prompts, render_scenes
from vgen.data.shapes import SPLIT_SEEDS as SHAPE_SPLIT_SEEDS
from vgen.data.shapes import ShapesConfig, render_batch
from vgen.eval.classifier import load_scene_judge, load_shapes_classifier
from vgen.eval.clip import ClipScorer, clip_mean
from vgen.eval.evaluate import measured
from vgen.eval.features import SHAPES_VIDEO, Extractor, is_stats_file, load_extractor, load_images
from vgen.eval.fid import (
    GaussianStats,
    check_comparable,
    frechet_distance,
    kernel_inception_distance,
    kid_subset_size_for,
)
from vgen.eval.quality import attribute_accuracy, class_accuracy, clip_class_accuracy, token_statistics
from vgen.eval.sample_many import SamplePlan, samples_of
from vgen.eval.videos import load_videos
from vgen.images import image_grid
from vgen.models.classifier import AttributeClassifier
from vgen.models.word_encoder import WordTextEncoder
from vgen.pipelines import ImagePipeline, default_sampler
from vgen.samplers import Sampler, SamplingParams, get_sampler
from vgen.samplers.options import declarations, parse_option
from vgen.visualize import scatter_plot

REFERENCE = "ar"
SAMPLING_FIELDS = declarations(SamplingParams)  # the keys a spec may set for its own row
PROMPT_SPLIT = "test"  # the scenes split whose held-out prompts (and their images) a text-to-image model is benched on
OUTPUTS = {"json": "bench.json", "markdown": "bench.md", "plot": "bench.png"}
VIDEO_FEATURES = (SHAPES_VIDEO, "i3d")  # feature sets of clips: their distances are FVD / KVD


def is_video(pipe: ImagePipeline) -> bool:
    """Whether ``pipe`` draws clips (a backbone over frames x rows x columns)."""
    return len(pipe.model.grid) == 3


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
    """Statistics of the real images in a feature set, their features when available (for KID), where they came
    from, and the extractor that made them (generated samples are measured with the same one)."""

    stats: GaussianStats
    features: np.ndarray | None
    source: str
    extractor: Extractor


def is_scenes_model(pipe: ImagePipeline) -> bool:
    """Whether ``pipe`` is a text model of vgen's scenes domain (its word-level text encoder reads scene captions):
    the one text model with held-out prompts, rendered real scenes and a judge of its own."""
    return pipe.text_conditional and isinstance(pipe.text_encoder, WordTextEncoder)


def domain_features(pipe: ImagePipeline) -> Extractor | None:
    """vgen's offline features for a model of its own domains: ``shapes-video`` for clips, ``shapes`` for images of
    a recorded ``vgen.data`` set or the scenes; None for a model of another domain."""
    if is_video(pipe):
        return load_extractor("shapes", "videos")
    if pipe.info.data is not None or is_scenes_model(pipe):
        return load_extractor("shapes", "images")
    return None


def real_reference(pipe: ImagePipeline, real: str | Path | None = None, num_real: int = 1024,
                   extractor: Extractor | None = None) -> RealReference:
    """``real`` (image or clip set, or stats file), else ``num_real`` rendered validation images (clips) of the
    pipeline's data, or for the scenes model the held-out scenes its benchmark prompts describe; in ``extractor``'s
    features (default: vgen's domain features, :func:`domain_features`)."""
    domain = domain_features(pipe)
    if real is None and domain is None:
        raise ValueError(f"model {pipe.info.name!r} records no vgen.data set to render real images from; give real "
                         f"images or statistics (--real)")
    extractor = extractor or domain
    if extractor is None:
        raise ValueError(f"model {pipe.info.name!r} is not of vgen's procedural domains: name the feature set for "
                         f"its FID (--features inception)")
    if real is not None:
        if is_stats_file(real):
            stats = GaussianStats.load(str(real))
            if stats.features and stats.features != extractor.name:
                raise ValueError(f"{real} holds statistics of {stats.features} features, not {extractor.name}")
            return RealReference(stats, None, str(real), extractor)
        feats, stats = measured(extractor, load_videos(real) if is_video(pipe) else load_images(real))
        return RealReference(stats, feats, str(real), extractor)
    if num_real < 2:
        raise ValueError(f"need at least 2 real samples, got {num_real}")
    if is_video(pipe):
        clips = ClipsConfig(num_frames=pipe.num_frames, frame_size=pipe.info.image_size)
        samples, _ = render_clips(CLIP_SPLIT_SEEDS["val"], 0, num_real, clips)
        source = (f"{num_real} rendered validation clips of vgen.data.clips ({clips.num_frames} frames of "
                  f"{clips.frame_size} px)")
    elif is_scenes_model(pipe):
        samples, _, _ = render_scenes(SHAPE_SPLIT_SEEDS[PROMPT_SPLIT], 0, num_real, pipe.info.image_size)
        source = (f"{num_real} rendered held-out scenes of vgen.data.scenes ({pipe.info.image_size} px; the first "
                  f"ones are those the prompts describe)")
    else:
        samples, _ = render_batch(SHAPE_SPLIT_SEEDS["val"], 0, num_real, ShapesConfig(**pipe.info.data))
        source = f"{num_real} rendered validation images of vgen.data.shapes ({json.dumps(pipe.info.data)})"
    feats, stats = measured(extractor, samples)
    return RealReference(stats, feats, source, extractor)


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

    def row_tokens_per_forward(self) -> list[float]:
        """Each sample's tokens per target pass it took, in sample order."""
        return [v for x in self.stats for v in x.row_tokens_per_forward]

    def row(self) -> dict:
        """The cost columns of the benchmark row, summed over batches."""
        s = self.stats
        lengths = [n for x in s for n in x.accepted_lengths]
        wall = sum(x.wall_time_s for x in s)
        return {"drafter": s[-1].details.get("drafter"), "forward_passes": sum(x.forward_passes for x in s),
                "wall_time_s": wall, "tokens_per_second": sum(x.tokens for x in s) / wall if wall > 0 else None,
                "tokens_per_forward": statistics.mean(self.row_tokens_per_forward()),
                "batch_tokens_per_forward": sum(x.tokens for x in s) / sum(x.forward_passes for x in s),
                "mean_accepted_length": statistics.mean(lengths) if lengths else 1.0, "compile_s": self.compile_s}


def draw_batch(pipe: ImagePipeline, sampler: Sampler, plan: SamplePlan, params: SamplingParams, k: int,
               num_samples: int):
    """The pipeline's output for batch ``k`` of ``plan`` (cut short at ``num_samples``), drawn as one batch."""
    indices = plan.batch_indices(k, num_samples)
    return pipe(**plan.inputs(indices), sampler=sampler, seed=plan.batch_seed(k), batch_size=len(indices),
                **params.to_dict())


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


def draw_token_statistics(pipe: ImagePipeline, draw: Draw, plan: SamplePlan,
                          params: SamplingParams) -> dict | None:
    """Mean entropy (nats) and median top-1 probability of the distributions a row drew its tokens from (``plan``
    says each sample's class or prompt): how spread out the model's predictions are sets how far a speculative
    sampler can go, so every table prints them beside its speed-ups. None for a model of continuous tokens."""
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


@dataclass
class Conditions:
    """What every row draws and how its samples are judged: the plan of a seed (classes in turn, or prompts in
    turn), a description for the setup line, and the domain's judge of a row's samples (class or attribute
    accuracy), if any."""

    plan_of: Callable[[int], SamplePlan]
    drawn: str
    judge: Callable[[np.ndarray], dict]


def bench_conditions(pipe: ImagePipeline, num_samples: int, seed: int, batch_size: int, prompts: PromptSet | None,
                     judge: AttributeClassifier | None) -> Conditions:
    """Classes in turn for a class model; a prompt set's prompts in turn for a text model, or the scenes model's
    held-out prompts judged per attribute (``judge``, default the shipped scene judge) when no set is given."""
    if not pipe.text_conditional:
        if prompts is not None:
            raise ValueError(f"{pipe.info.name} is class-conditional: it draws classes, not a prompt set")
        classes = tuple(range(pipe.num_classes))
        labels = SamplePlan(seed, batch_size, classes, balanced=True).labels(range(num_samples))
        return Conditions(lambda plan_seed: SamplePlan(plan_seed, batch_size, classes, balanced=True),
                          "classes in turn",
                          lambda samples: {"class_accuracy": domain_class_accuracy(pipe, samples, labels),
                                           "attribute_accuracy": None})
    if prompts is not None:
        drawn = f"the {len(prompts)} prompts of {Path(prompts.source).name}, {prompts.format} format, in turn"
        return Conditions(lambda plan_seed: SamplePlan(plan_seed, batch_size, prompts=prompts.prompts), drawn,
                          lambda samples: {"class_accuracy": None, "attribute_accuracy": None})
    if not is_scenes_model(pipe):
        raise ValueError(f"{pipe.info.name} is a text-to-image model: give it a prompt set (vgen bench --prompts "
                         f"FILE: a text file, COCO captions, PartiPrompts or GenEval)")
    held_out, attributes = evaluation_prompts(num_samples, PROMPT_SPLIT)
    judge = judge or load_scene_judge()  # before sampling: a missing judge fails at once
    return Conditions(lambda plan_seed: SamplePlan(plan_seed, batch_size, prompts=tuple(held_out)),
                      "one per held-out scene prompt",
                      lambda samples: {"class_accuracy": None,
                                       "attribute_accuracy": attribute_accuracy(judge, samples, attributes)})


def run_bench(pipe: ImagePipeline, specs: Sequence[SamplerSpec], num_samples: int, seed: int = 0,
              batch_size: int = 8, params: SamplingParams | None = None, real: RealReference | None = None,
              progress: bool = False, reference_pipe: ImagePipeline | None = None,
              judge: AttributeClassifier | None = None, reference_spec: SamplerSpec | None = None,
              prompts: PromptSet | None = None, clip: ClipScorer | None = None,
              extractor: Extractor | None = None, by_category: bool = False, num_real: int = 1024) -> dict:
    """Measure every sampler of ``specs`` (vanilla AR added first when missing) on the same images; returns
    ``{"setup": ..., "results": [one row per sampler]}`` (and ``categories`` with ``by_category``) ready for JSON.

    With ``reference_pipe`` the reference row is another model of the same classes and image size drawn with its
    own default sampler (next-token AR for NAR, say), so the ratios compare two backbones on the same data; with
    ``reference_spec`` it is that sampler on ``pipe`` (the fastest plain setting, say), not the default one. A
    text-to-image model draws ``prompts`` in turn, or for the scenes model the first ``num_samples`` held-out
    prompts, judged by ``judge`` (default: the shipped scene judge). ``clip`` adds the CLIP score. The Fréchet
    distances are in ``real``'s features, else ``extractor``'s, else vgen's domain features; a model of another
    domain with neither gets none. Without ``real``, a model of vgen's domains is measured against ``num_real``
    rendered validation images (clips, held-out scenes).
    """
    if num_samples < 2:
        raise ValueError(f"need at least 2 samples per sampler for FID, got {num_samples}")
    if reference_pipe is not None and reference_spec is not None:
        raise ValueError("the reference row is another model's or another sampler's, not both")
    if by_category and (prompts is None or prompts.categories is None):
        raise ValueError("a breakdown by category needs a prompt set with categories (PartiPrompts or GenEval)")
    if reference_pipe is None:
        specs, reference = with_reference(list(specs), default_sampler(pipe.model), reference_spec)
    else:
        check_reference_model(pipe, reference_pipe)
        name = default_sampler(reference_pipe.model)
        reference = f"{name} ({reference_pipe.info.name})"
        specs = [SamplerSpec(reference, name), *specs]
    params = params or SamplingParams(**pipe.info.defaults)
    conditions = bench_conditions(pipe, num_samples, seed, batch_size, prompts, judge)
    if real is None and (not pipe.text_conditional or is_scenes_model(pipe)):  # a domain of vgen's: render it
        real = real_reference(pipe, num_real=num_real, extractor=extractor)
    extractor = real.extractor if real is not None else extractor
    rows, stats_of, per_sample = [], {}, {}
    start = time.perf_counter()
    runs = [(reference_pipe if reference_pipe is not None and spec.label == reference else pipe, spec.sampler(),
             conditions.plan_of(seed if spec.seed is None else spec.seed), replace(params, **spec.sampling))
            for spec in specs]
    draws = draw_interleaved(runs, num_samples, progress)
    for spec, (run_pipe, _, plan, run_params), d in zip(specs, runs, draws):
        samples = np.stack(d.samples)
        row = {"label": spec.label, "sampler": spec.name, "options": spec.options, "seed": plan.seed,
               "sampling": spec.sampling, **d.row(), "fid": None, "kid": None, "fid_vs_ar": None,
               **token_figures(draw_token_statistics(run_pipe, d, plan, run_params)),
               "clip_score": None, **conditions.judge(samples)}
        if extractor is not None:
            feats, stats_of[spec.label] = measured(extractor, samples)
            if real is not None:
                check_comparable(real.stats, stats_of[spec.label])
                row["fid"] = frechet_distance(real.stats, stats_of[spec.label]).fid
                if real.features is not None:
                    row["kid"] = kernel_inception_distance(real.features, feats, subset_size=kid_subset_size_for(
                        min(len(real.features), len(feats))))[0]
        scores = None
        if clip is not None:
            scores = clip.scores(samples, [plan.prompts[j] for j in d.labels])
            row["clip_score"] = clip_mean(scores)
        per_sample[spec.label] = {"labels": d.labels, "tokens_per_forward": d.row_tokens_per_forward(),
                                  "clip_score": scores}
        rows.append(row)
    reference_run = next(i for i, spec in enumerate(specs) if spec.label == reference)  # rows follow specs
    base = rows[reference_run]
    for row in rows:
        row["step_compression"] = base["forward_passes"] / row["forward_passes"]
        row["latency_ratio"] = base["wall_time_s"] / row["wall_time_s"]
        if row is not base and stats_of:
            row["fid_vs_ar"] = frechet_distance(stats_of[reference], stats_of[row["label"]]).fid
    setup = {"model": pipe.info.name,
             "reference_model": None if reference_pipe is None else reference_pipe.info.name,
             "conditioning": "prompts" if pipe.text_conditional else "classes", "drawn": conditions.drawn,
             "prompt_set": None if prompts is None else {"source": prompts.source, "format": prompts.format,
                                                         "count": len(prompts)},
             "num_samples": num_samples, "batch_size": batch_size, "seed": seed,
             "sampling": params.to_dict(), "reference": reference,
             "real": None if real is None else real.source, "real_count": None if real is None else real.stats.count,
             "features": None if extractor is None else extractor.name,
             "clip": None if clip is None else str(clip.folder),
             "device": str(pipe.device),
             "dtype": str(next(pipe.model.parameters()).dtype).removeprefix("torch."),
             "threads": torch.get_num_threads(),
             "torch": torch.__version__,
             "reference_token_statistics": None if base["mean_entropy_nats"] is None else {
                 "mean_entropy_nats": base["mean_entropy_nats"], "median_top1_prob": base["median_top1_prob"],
                 "tokens_measured": base["tokens_measured"]},
             "total_time_s": time.perf_counter() - start}
    result = {"setup": setup, "results": rows}
    if by_category:
        result["categories"] = category_breakdown(prompts, per_sample)
    return result


def token_figures(figures: dict | None) -> dict:
    """A row's token-statistics columns (None for a model of continuous tokens)."""
    keys = ("mean_entropy_nats", "median_top1_prob", "tokens_measured")
    return {key: None if figures is None else figures[key] for key in keys}


def category_breakdown(prompts: PromptSet, per_sample: dict[str, dict]) -> dict[str, dict[str, dict]]:
    """By category of the prompt set, then by row: the samples drawn, their mean tokens per forward (each sample's
    own) and mean CLIP score (None without a CLIP model)."""
    breakdown: dict[str, dict[str, dict]] = {}
    for category in dict.fromkeys(prompts.categories):
        breakdown[category] = {}
        for label, sample in per_sample.items():
            mine = [i for i, j in enumerate(sample["labels"]) if prompts.categories[j] == category]
            if not mine:
                continue
            scores = sample["clip_score"]
            breakdown[category][label] = {
                "samples": len(mine),
                "tokens_per_forward": statistics.mean(sample["tokens_per_forward"][i] for i in mine),
                "clip_score": None if scores is None else clip_mean(scores[mine])}
    return {category: rows for category, rows in breakdown.items() if rows}


def distance_names(setup: dict) -> tuple[str, str]:
    """("FID", "KID") for images, ("FVD", "KVD") for clips."""
    return ("FVD", "KVD") if setup["features"] in VIDEO_FEATURES else ("FID", "KID")


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def quality_figures(row: dict) -> dict[str, float | None]:
    """A row's domain quality columns: ``class accuracy``, a text-to-image model's accuracy per attribute and
    ``joint`` where the scene judge read it, or nothing for a model of another domain."""
    if row["attribute_accuracy"] is not None:
        return dict(row["attribute_accuracy"])
    if row["class_accuracy"] is not None:
        return {"class accuracy": row["class_accuracy"]}
    return {}


@dataclass(frozen=True)
class Column:
    """A table column: its header, the row key it shows (None: every row has it) and how a row's cell reads."""

    header: str
    key: str | None
    cell: Callable[[dict], str]


def row_name(row: dict) -> str:
    """A row's label, with the sampling settings it sets over the run's: ``t05 (temperature 0.5)``."""
    own = row.get("sampling") or {}
    return row["label"] + (f" ({', '.join(f'{k} {v}' for k, v in own.items())})" if own else "")


COLUMN_SPECS = (
    Column("sampler", None, row_name),
    Column("drafter", None, lambda r: r["drafter"] or "-"),
    Column("forward passes", None, lambda r: str(r["forward_passes"])),
    Column("step compression", None, lambda r: f"{r['step_compression']:.2f}x"),
    Column("wall time (s)", None, lambda r: f"{r['wall_time_s']:.2f}"),
    Column("latency ratio", None, lambda r: f"{r['latency_ratio']:.2f}x"),
    Column("tokens / s", "tokens_per_second", lambda r: _fmt(r["tokens_per_second"], ".0f")),
    Column("tokens / forward", None, lambda r: f"{r['tokens_per_forward']:.2f}"),
    Column("entropy (nats)", "mean_entropy_nats", lambda r: _fmt(r["mean_entropy_nats"], ".2f")),
    Column("top-1", "median_top1_prob", lambda r: _fmt(r["median_top1_prob"], ".2f")),
    Column("FID vs real", "fid", lambda r: _fmt(r["fid"], ".2f")),
    Column("KID vs real", "kid", lambda r: _fmt(r["kid"], ".4f")),
    Column("FID vs AR", "fid_vs_ar", lambda r: _fmt(r["fid_vs_ar"], ".2f")),
    Column("CLIP score", "clip_score", lambda r: _fmt(r["clip_score"], ".2f")),
)
COLUMNS = tuple(c.header for c in COLUMN_SPECS)


def table_columns(result: dict) -> list[Column]:
    """The table's columns: those of :data:`COLUMN_SPECS` that some row has a figure for (FVD / KVD for clips),
    then the domain's quality columns (class accuracy, or one per attribute)."""
    rows = result["results"]
    fd, kd = distance_names(result["setup"])
    columns = [replace(c, header=c.header.replace("FID", fd).replace("KID", kd)) for c in COLUMN_SPECS
               if c.key is None or any(r.get(c.key) is not None for r in rows)]
    for name in quality_figures(rows[0]):
        columns.append(Column(name, None, lambda r, name=name: _fmt(
            None if quality_figures(r).get(name) is None else 100 * quality_figures(r)[name], ".1f", "%")))
    return columns


def bench_table(result: dict) -> str:
    """The results as a Markdown table, one row per sampler in run order."""
    columns = table_columns(result)
    lines = ["| " + " | ".join(c.header for c in columns) + " |", "|---" * len(columns) + "|"]
    lines += ["| " + " | ".join(c.cell(r) for c in columns) + " |" for r in result["results"]]
    return "\n".join(lines)


def category_table(result: dict) -> str:
    """The breakdown by category as Markdown: a line per category, a column per row, of the samples' tokens per
    forward; where a CLIP model scored them, a second table of the CLIP score with its change against the
    reference row."""
    reference, labels = result["setup"]["reference"], [r["label"] for r in result["results"]]
    categories = result["categories"]

    def table(title: str, cell) -> str:
        lines = [f"| {title} | samples | " + " | ".join(labels) + " |", "|---" * (len(labels) + 2) + "|"]
        for category, rows in categories.items():
            cells = [cell(rows, label) if label in rows else "-" for label in labels]
            lines.append(f"| {category} | {rows[labels[0]]['samples']} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    tables = [table("tokens / forward by category", lambda rows, label: f"{rows[label]['tokens_per_forward']:.2f}")]
    if result["setup"]["clip"] is not None:
        def clip_cell(rows: dict, label: str) -> str:
            score, base = rows[label]["clip_score"], rows.get(reference, {}).get("clip_score")
            return f"{score:.2f}" + ("" if label == reference or base is None else f" ({score - base:+.2f})")
        tables.append(table("CLIP score by category", clip_cell))
    return "\n\n".join(tables)


def setup_line(result: dict) -> str:
    s, p = result["setup"], result["setup"]["sampling"]
    judged = "; accuracy per attribute from the scene judge" if s["drawn"] == "one per held-out scene prompt" else ""
    distances = "no Fréchet distances (no feature set)" if s["features"] is None else (
        f"{'/'.join(distance_names(s))} in {s['features']} features" + (
            f" against {s['real']} ({s['real_count']} samples)" if s["real"] else " between samplers only"))
    clip = f"; CLIP score with {s['clip']}" if s["clip"] else ""
    return (f"{s['model']}, {s['num_samples']} samples per sampler ({s['drawn']}), batch {s['batch_size']}, "
            f"seed {s['seed']}, CFG {p['cfg_scale']}, temperature {p['temperature']}, top-k {p['top_k']}, "
            f"top-p {p['top_p']} (unless a row sets its own); {s['device']} {s['dtype']}, {s['threads']} thread(s); "
            f"{distances}{clip}{judged}; ratios against `{s['reference']}`"
            f"{token_clause(s['reference_token_statistics'])}; {s['total_time_s']:.0f} s in all.")


def token_clause(figures: dict | None) -> str:
    """", whose next-token distributions ..." for the setup line, or nothing for a model of continuous tokens."""
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
    """The samplers' quality over their speed, one labelled point per sampler, the ratios against the reference
    row: FID (FVD) against real samples over step compression and over latency ratio (the CLIP score where there
    is no FID, the latency ratio over step compression where there is neither); then the CLIP score and, where the
    samples were judged, class accuracy (joint attribute accuracy) over latency ratio."""
    rows, fd, ref = result["results"], distance_names(result["setup"])[0], result["setup"]["reference"]
    speed = (("step_compression", f"step compression vs {ref} (x)", "forward passes"),
             ("latency_ratio", f"latency ratio vs {ref} (x)", "wall time"))
    has_fid = all(r["fid"] is not None for r in rows)
    has_clip = all(r["clip_score"] is not None for r in rows)
    if has_fid or has_clip:
        key, ylabel = ("fid", f"{fd} vs real (lower is better)") if has_fid else ("clip_score", "CLIP score")
        panels = [scatter_plot([(r["label"], r[x], r[key]) for r in rows], xlabel, ylabel, title)
                  for x, xlabel, title in speed]
    else:
        panels = [scatter_plot([(r["label"], r["step_compression"], r["latency_ratio"]) for r in rows],
                               speed[0][1], speed[1][1], "speed")]
    if has_fid and has_clip:
        panels.append(scatter_plot([(r["label"], r["latency_ratio"], r["clip_score"]) for r in rows], speed[1][1],
                                   "CLIP score (higher is better)", "text alignment"))
    if all(accuracy_of(r) is not None for r in rows):
        prompts = result["setup"]["conditioning"] == "prompts"
        panels.append(scatter_plot([(r["label"], r["latency_ratio"], 100 * accuracy_of(r)) for r in rows],
                                   speed[1][1], f"{'all attributes right' if prompts else 'class accuracy'} (%)",
                                   "accuracy"))
    return image_grid(panels, len(panels))


def write_outputs(result: dict, out_dir: str | Path) -> dict[str, Path]:
    """``bench.json``, ``bench.md`` (setup line, table and any breakdown by category) and ``bench.png`` (the plot)
    in ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {kind: out_dir / name for kind, name in OUTPUTS.items()}
    paths["json"].write_text(json.dumps(result, indent=1) + "\n")
    text = f"{setup_line(result)}\n\n{bench_table(result)}\n"
    if "categories" in result:
        text += f"\n{category_table(result)}\n"
    paths["markdown"].write_text(text)
    speed_quality_plot(result).save(paths["plot"])
    return paths
