"""Many samples for evaluation: sharded over processes (``torchrun``), resumable, packed as an ADM-style ``.npz``.

Every embedded model kind is drawn this way: class-conditional images (next-token AR, NAR, continuous tokens),
clips of a video model, the images of a text-to-image model for a list of prompts (a caption set), and clips of a
fixed length streamed by a block-diffusion model (:class:`StreamClips`: its stream settings stand where a token
model's sampler and sampling settings do). A video token model draws clips longer than its window window by window
(:class:`LongClips`).

**What each sample is.** Sample ``i`` of a run of ``N`` is a pure function of ``i`` and the run's settings, whatever
the number of processes. Samples are made in batches of ``batch_size`` consecutive indices, the last one cut short
at ``N``: batch ``k`` (indices ``k*B .. min(k*B+B, N)-1``) is drawn with a ``torch.Generator`` seeded with a 32-bit
mix of ``(seed, k)`` (:meth:`SamplePlan.batch_seed`). Its labels are, per index, ``class_ids[i % C]`` with
``balanced`` (classes in turn, so every prefix of the run is balanced to within one sample per class) and otherwise
a uniform draw from ``class_ids`` seeded by ``(seed, i)``. A text-to-image run takes a list of prompts instead, or
a :class:`~vgen.data.prompts.PromptSet` read from a prompt file (COCO captions, PartiPrompts, GenEval, plain text;
a seeded subset of it): sample ``i`` gets prompt ``i % P`` (the prompts in turn, so a run of ``N = P`` draws one
image per prompt). A short last batch draws other noise than the full batch would, so its samples also depend on
``N``; every other sample does not. LlamaGen's ``sample_c2i_ddp.py`` seeds
each *rank* instead (``global_seed * world_size + rank``) and draws labels and noise from that per-rank stream, so
its samples change with the number of GPUs; vgen derives the stream from the global seed and the batch instead, so
the packed ``.npz`` is the same for any number of processes, given the same batch size, settings, weights and
deterministic kernels (CPU; one GPU model).

**Sharding.** Batch ``k`` belongs to rank ``k % world_size``. Every rank writes ``{index:06d}.png`` into the output
folder (a clip as its frames stacked top to bottom), and rank 0 packs the ``N`` samples after a barrier into an
``.npz`` with ``arr_0`` (uint8 [N, H, W, 3], clips [N, T, H, W, 3]) and ``arr_1`` (int64 labels [N]; the positional
names guided-diffusion's ``image_sample.py`` writes for class-conditional samples). For prompts, ``arr_1`` holds each
sample's prompt number (its place in the list) and ``prompts`` (a unicode array [N]) the prompt itself; a prompt
set adds, per sample, ``ids`` (the source's id of its prompt: COCO image id, PartiPrompts row, GenEval or text line)
and, where the set has them, ``categories`` (PartiPrompts' Category, GenEval's tag) and ``challenges``
(PartiPrompts' Challenge), all unicode arrays [N].

**Resuming.** Every file is written under a temporary ``.part`` name and renamed (the ``.part`` is removed when the
write fails), so a file that exists is whole unless the disk lost it. Each PNG carries a text chunk naming the run
(a hash of its settings) and the batch that drew it. A rerun keeps every batch whose PNGs all read back whole and
carry this run and this batch, and redraws the others (identically, by the rule above, and naming any damaged PNG),
so an interrupted run continues without duplicated or lost samples, and a larger ``--num-samples`` extends a
finished run to what a fresh run of that size packs. The folder's ``sample_many.json`` records the settings (its
``settings``: a fingerprint of the weights and, for prompts, their number and hash, and for a prompt set its format,
subset size and subset seed) and ``num_samples``; a rerun with other settings (another prompt list, set or subset
included) is refused. For a prompt set it also records, under ``prompt_set``, the file read (``source``), its
``format``, ``subset`` and ``subset_seed``, and ``prompts``: per prompt, in the run's order (prompt number ``j`` is
entry ``j``), its ``prompt``, ``id`` and, where the set has them, ``category`` and ``challenge``. The file read is
not part of the settings: a prompt file moved elsewhere resumes. When that record is missing or damaged, the folder
is taken up again only if every PNG in it carries this run's hash.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
import torch.distributed as dist
from PIL import Image
from PIL.PngImagePlugin import PngInfo
from tqdm.auto import tqdm

from vgen.data.prompts import PromptSet
from vgen.pipelines import ImagePipeline, PipelineOutput, StreamOutput, StreamPipeline, VideoOutput, VideoPipeline
from vgen.pipelines.inputs import check_count
from vgen.samplers import Sampler, SamplingParams
from vgen.samplers.streaming import StreamConfig

MAX_SEED = 2**31
MANIFEST = "sample_many.json"
PNG_RECORD = "vgen-sample-many"  # the PNG text chunk naming the run and the batch that drew the sample


@dataclass(frozen=True)
class SamplePlan:
    """Which noise seed and label each sample index gets (see the module docstring): a class id from
    ``class_ids``, or for a text-to-image model the number of its prompt in ``prompts``. A ``prompt_set`` gives the
    prompts (``prompts`` then holds its prompts) and its ids, categories and source, which go into the packed file
    and the manifest."""

    seed: int
    batch_size: int
    class_ids: tuple[int, ...] = ()
    balanced: bool = False
    prompts: tuple[str, ...] = ()
    prompt_set: PromptSet | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "class_ids", tuple(int(c) for c in self.class_ids))
        prompts = tuple(self.prompts)
        if self.prompt_set is not None:
            if prompts and prompts != self.prompt_set.prompts:
                raise ValueError("give prompts or a prompt set, not both")
            prompts = self.prompt_set.prompts
        object.__setattr__(self, "prompts", prompts)
        if not 0 <= self.seed < MAX_SEED:
            raise ValueError(f"seed must be in [0, 2**31), got {self.seed}")
        if self.batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {self.batch_size}")
        if self.prompts and self.class_ids:
            raise ValueError("give class ids or prompts, not both")
        if self.prompts and self.balanced:
            raise ValueError("balanced is for class ids: prompts always go in turn")
        if not self.class_ids and not self.prompts:
            raise ValueError("no class ids (or prompts) to draw labels from")
        if not all(isinstance(p, str) and p.strip() for p in self.prompts):
            raise ValueError("every prompt must be a non-empty string")

    def num_batches(self, num_samples: int) -> int:
        return math.ceil(num_samples / self.batch_size)

    def batch_indices(self, k: int, num_samples: int) -> range:
        """The indices of batch ``k`` of a run of ``num_samples`` (the last batch may be short)."""
        return range(k * self.batch_size, min((k + 1) * self.batch_size, num_samples))

    def batch_seed(self, k: int) -> int:
        """A 32-bit seed mixed from (seed, batch) by numpy's SeedSequence: torch's CPU generator keeps only the
        low 32 bits of a seed, so a plain ``seed * 2**32 + k`` would give every global seed the same images."""
        return int(np.random.SeedSequence([self.seed, k]).generate_state(1)[0])

    def labels(self, indices: Iterable[int]) -> list[int]:
        """The class id of each index, or the number of its prompt."""
        if self.prompts:
            return [i % len(self.prompts) for i in indices]
        c = self.class_ids
        if self.balanced:
            return [c[i % len(c)] for i in indices]
        return [c[int(np.random.default_rng([self.seed, i]).integers(len(c)))] for i in indices]

    def inputs(self, indices: Iterable[int]) -> dict:
        """The pipeline's condition arguments for these indices: ``class_ids=``, or ``prompt=``."""
        labels = self.labels(indices)
        return {"prompt": [self.prompts[j] for j in labels]} if self.prompts else {"class_ids": labels}

    def to_dict(self) -> dict:
        """The plan as a run's settings record it: prompts by their number and hash (a caption set can be long), a
        prompt set also by its format and the subset drawn from its file."""
        if self.prompts:
            digest = hashlib.sha256(json.dumps(self.prompts).encode()).hexdigest()
            record = {"count": len(self.prompts), "sha256": digest}
            if self.prompt_set is not None:
                ps = self.prompt_set
                record |= {"format": ps.format, "subset": ps.subset_size, "subset_seed": ps.subset_seed}
            return {"seed": self.seed, "batch_size": self.batch_size, "prompts": record}
        return {"seed": self.seed, "batch_size": self.batch_size, "class_ids": list(self.class_ids),
                "balanced": self.balanced}


@dataclass(frozen=True)
class StreamClips:
    """How a streaming (block-diffusion) pipeline draws a run's samples: clips of ``num_frames`` frames, streamed
    with ``config`` (denoising steps, guidance, context)."""

    config: StreamConfig
    num_frames: int

    def __post_init__(self) -> None:
        check_count("num_frames", self.num_frames)


@dataclass(frozen=True)
class LongClips:
    """How a video token pipeline draws clips longer than its window: ``num_frames`` frames, window by window, each
    window continuing the last ``window_context`` frames (None: half the window), every window with ``params``."""

    params: SamplingParams
    num_frames: int
    window_context: int | None = None

    def __post_init__(self) -> None:
        check_count("num_frames", self.num_frames)


Drawing = SamplingParams | StreamClips | LongClips


@dataclass(frozen=True)
class Distributed:
    """This process's place in a ``torchrun`` job (rank 0 of 1 when run directly) and the device it samples on."""

    rank: int = 0
    world_size: int = 1
    device: str = "cpu"

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def sum(self, values: Sequence[int]) -> list[int]:
        """Element-wise sum over ranks."""
        t = torch.tensor(list(values), dtype=torch.int64, device=self.device)
        if self.active:
            dist.all_reduce(t)
        return [int(v) for v in t.tolist()]

    def close(self) -> None:
        if self.active and dist.is_initialized():
            dist.destroy_process_group()


def init_distributed(device: str = "cpu") -> Distributed:
    """Join the ``torchrun`` job described by the environment (gloo on CPU, NCCL on CUDA, one GPU per local rank);
    without ``torchrun`` (no ``WORLD_SIZE`` or 1), a single process on ``device``."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Distributed(device=device)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda"):
        torch.cuda.set_device(local_rank)
        device, backend = f"cuda:{local_rank}", "nccl"
    else:
        backend = "gloo"
    dist.init_process_group(backend)
    return Distributed(rank, world, device)


def weights_fingerprint(pipe: ImagePipeline | StreamPipeline) -> str:
    """SHA-256 over every tensor of the backbone, tokenizer, draft head and text encoder (names, dtypes and
    bytes)."""
    digest = hashlib.sha256()
    drafter = getattr(pipe, "draft_head", None)  # a streaming pipeline has none
    for prefix, module in (("gpt", pipe.model), ("vq", pipe.tokenizer), ("drafter", drafter),
                           ("text_encoder", getattr(pipe, "text_encoder", None))):
        if module is None:
            continue
        for name, tensor in module.state_dict().items():
            digest.update(f"{prefix}.{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
            digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def check_conditioning(pipe: ImagePipeline | StreamPipeline, plan: SamplePlan) -> None:
    """Refuse prompts for a class model and class ids for a text-to-image model; check the class ids."""
    text_conditional = getattr(pipe, "text_conditional", False)  # a streaming pipeline is class-conditional
    if text_conditional and not plan.prompts:
        raise ValueError(f"{pipe.info.name} is a text-to-image model: give it prompts (vgen sample-many "
                         f"--prompts), not class ids")
    if plan.prompts and not text_conditional:
        raise ValueError(f"{pipe.info.name} is class-conditional: give it class ids, not prompts")
    pipe.check_class_ids(plan.class_ids)


def run_settings(pipe: ImagePipeline | StreamPipeline, plan: SamplePlan, sampler: Sampler | None,
                 params: Drawing) -> dict:
    """Everything that decides the images (and so must not change when a run is resumed)."""
    if isinstance(params, StreamClips):
        drawing = {"stream": asdict(params.config)}
    elif isinstance(params, LongClips):
        drawing = {"sampler": sampler.to_dict(), "sampling": params.params.to_dict(),
                   "window_context": params.window_context}
    else:
        drawing = {"sampler": sampler.to_dict(), "sampling": params.to_dict()}
    return {"model": pipe.info.name, "image_size": pipe.info.image_size, "frames": num_frames(pipe, params),
            "weights_sha256": weights_fingerprint(pipe),
            "dtype": str(next(pipe.model.parameters()).dtype).removeprefix("torch."), "plan": plan.to_dict(),
            **drawing}


def run_id(settings: dict) -> str:
    """A hash of a run's settings: what each of its PNGs carries to say which run drew it."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def num_frames(pipe: ImagePipeline | StreamPipeline, params: Drawing) -> int | None:
    """Frames per sample of a video pipeline, of its long clips or of streamed clips; None for an image pipeline."""
    if isinstance(params, (StreamClips, LongClips)):
        return params.num_frames
    return getattr(pipe, "num_frames", None)


def check_drawing(pipe: ImagePipeline | StreamPipeline, sampler: Sampler | None,
                  params: Drawing) -> None:
    """Refuse a drawing that does not fit the pipeline: a streaming pipeline streams :class:`StreamClips` (with no
    sampler) whose settings fit the model; a token pipeline takes a sampler and :class:`SamplingParams`, a video
    token pipeline also :class:`LongClips` that its sampler can draw."""
    if isinstance(pipe, StreamPipeline):
        if sampler is not None or not isinstance(params, StreamClips):
            raise TypeError(f"{pipe.info.name} streams clips: give StreamClips and no sampler")
        params.config.policy(pipe.frames_per_block, pipe.model.config.train_frames)
    elif isinstance(params, LongClips) and isinstance(pipe, VideoPipeline) and sampler is not None:
        pipe.check_window_context(params.window_context, params.num_frames, sampler)
    elif sampler is None or not isinstance(params, SamplingParams):
        raise TypeError(f"{pipe.info.name} samples tokens: give a sampler and SamplingParams (a video model also "
                        f"LongClips)")


def draw_batch(pipe: ImagePipeline | StreamPipeline, plan: SamplePlan, k: int, indices: range,
               sampler: Sampler | None, params: Drawing) -> PipelineOutput | StreamOutput:
    """Batch ``k`` (its ``indices``): its class ids or prompts, drawn with its seed as one batch (not in the
    pipeline's smaller chunks, which would draw other noise)."""
    inputs, seed = {**plan.inputs(indices), "batch_size": len(indices)}, plan.batch_seed(k)
    if isinstance(params, StreamClips):
        return pipe(**inputs, num_frames=params.num_frames, seed=seed, **asdict(params.config))
    if isinstance(params, LongClips):
        return pipe(**inputs, sampler=sampler, seed=seed, num_frames=params.num_frames,
                    window_context=params.window_context, **params.params.to_dict())
    return pipe(**inputs, sampler=sampler, seed=seed, **params.to_dict())


def samples_of(out: PipelineOutput | VideoOutput | StreamOutput) -> list[np.ndarray]:
    """A pipeline call's samples as arrays: images uint8 [H, W, 3] or clips uint8 [T, H, W, 3]."""
    if isinstance(out, (VideoOutput, StreamOutput)):
        return list(out.videos)
    return [np.asarray(image) for image in out.images]


class DamagedSample(ValueError):
    """A sample file that does not read back whole (truncated or corrupted on disk)."""


def check_resumable(out_dir: Path, settings: dict) -> None:
    """Refuse to add samples to a folder made with other settings (its images would not be the same run's). Without
    a readable record of the folder's settings, every PNG that reads must carry this run's hash."""
    manifest = out_dir / MANIFEST
    if manifest.is_file():
        try:
            recorded = json.loads(manifest.read_text())["settings"]
            changed = sorted(k for k in {*recorded, *settings} if recorded.get(k) != settings.get(k))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
            damage = "it is empty" if manifest.stat().st_size == 0 else f"unreadable: {e}"
            foreign = first_foreign_png(out_dir, run_id(settings))
            if foreign is not None:
                raise ValueError(f"{manifest} is damaged ({damage}), and {foreign} was drawn with other settings: "
                                 f"rerun the command that made {out_dir} to repair it, or use a new --out") from None
            return
        if changed:
            shown = "; ".join(f"{k}: {json.dumps(recorded.get(k))} -> {json.dumps(settings.get(k))}" for k in changed)
            raise ValueError(f"{out_dir} holds samples made with other settings ({shown}); resume with the same "
                             f"settings or use a new --out")
        return
    foreign = first_foreign_png(out_dir, run_id(settings))
    if foreign is not None:
        raise ValueError(f"{out_dir} holds {foreign.name}, which these settings did not draw, and no {MANIFEST}: "
                         f"not a vgen sample-many folder of this command; use a new --out")


def first_foreign_png(out_dir: Path, run: str) -> Path | None:
    """The first PNG in ``out_dir`` that reads whole but was not drawn by run ``run`` (damaged ones are redrawn)."""
    for path in sorted(out_dir.glob("*.png")) if out_dir.is_dir() else ():
        try:
            record = png_record(path)
        except DamagedSample:
            continue
        if record is None or record.get("run") != run:
            return path
    return None


def png_path(out_dir: Path, index: int) -> Path:
    return out_dir / f"{index:06d}.png"


def png_record(path: Path) -> dict | None:
    """The run and batch recorded in the PNG at ``path`` (None when it records none), after checking that the file
    is whole (every chunk present, every checksum right); a :class:`DamagedSample` naming the file otherwise."""
    try:
        with Image.open(path) as image:
            text = image.info.get(PNG_RECORD)
            image.verify()
    except (OSError, SyntaxError) as e:
        raise DamagedSample(f"{path} is damaged ({e or type(e).__name__})") from None
    try:
        record = json.loads(text) if text is not None else None
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def read_sample(path: Path, frames: int | None) -> np.ndarray:
    """A sample's pixels: an image uint8 [H, W, 3], or with ``frames`` a clip [T, H, W, 3] from its frame strip."""
    try:
        with Image.open(path) as image:
            pixels = np.asarray(image.convert("RGB"))
    except (OSError, SyntaxError) as e:
        raise DamagedSample(f"cannot read {path} ({e or type(e).__name__}); run the same command again to draw it "
                            f"again") from None
    if frames is None:
        return pixels
    if len(pixels) % frames:
        raise ValueError(f"{path} is {pixels.shape[0]} pixels high, not a strip of {frames} frames")
    return pixels.reshape(frames, -1, *pixels.shape[1:])


def write_atomic(path: Path, write: Callable[[BinaryIO], object], sync: bool = False) -> None:
    """Write ``path`` through ``write`` into ``path`` + ``.part``, then rename it: a file that exists is whole.
    ``sync`` flushes it to the disk first. On any failure the ``.part`` is removed, and an OS error (a full disk)
    names ``path``."""
    tmp = path.with_name(path.name + ".part")
    try:
        with open(tmp, "wb") as f:
            write(f)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise OSError(e.errno, f"cannot write {path}: {e.strerror or e}") from e
        raise


def write_sample(sample: np.ndarray, path: Path, record: dict) -> None:
    """A sample as a PNG (a clip as its frames stacked top to bottom) that records the run and batch drawing it."""
    info = PngInfo()
    info.add_text(PNG_RECORD, json.dumps(record))
    image = Image.fromarray(sample.reshape(-1, *sample.shape[-2:]))
    write_atomic(path, lambda f: image.save(f, format="PNG", pnginfo=info))


def write_manifest(out_dir: Path, settings: dict, num_samples: int, plan: SamplePlan) -> None:
    """The folder's record of its settings and prompt set (:func:`prompt_set_record`), replaced atomically (flushed
    to the disk, then renamed)."""
    record = {"settings": settings, "num_samples": num_samples}
    if plan.prompt_set is not None:
        record["prompt_set"] = prompt_set_record(plan.prompt_set)
    text = json.dumps(record, indent=1)
    write_atomic(out_dir / MANIFEST, lambda f: f.write(text.encode()), sync=True)


def prompt_set_record(ps: PromptSet) -> dict:
    """A prompt set as the manifest records it: its file, format and subset, and per prompt its text, id and, where
    the set has them, category and challenge."""
    columns = {"prompt": ps.prompts, "id": ps.ids, "category": ps.categories, "challenge": ps.challenges}
    columns = {name: column for name, column in columns.items() if column is not None}
    return {"source": ps.source, "format": ps.format, "subset": ps.subset_size, "subset_seed": ps.subset_seed,
            "prompts": [dict(zip(columns, values)) for values in zip(*columns.values())]}


@dataclass(frozen=True)
class SampleManyResult:
    """The packed file (None on ranks other than 0), the samples in it, the samples drawn by this run and those
    found from an earlier one (over all ranks), and what was wrong with each damaged PNG this rank drew again."""

    npz: Path | None
    num_samples: int
    generated: int
    reused: int
    damaged: tuple[str, ...] = ()


def sample_many(pipe: ImagePipeline | StreamPipeline, out_dir: str | Path, num_samples: int, plan: SamplePlan,
                sampler: Sampler | None, params: Drawing, npz_path: str | Path | None = None,
                ctx: Distributed = Distributed(), progress: bool = True) -> SampleManyResult:
    """Draw this rank's missing batches into ``out_dir`` (created with its parents); rank 0 then packs the
    ``num_samples`` samples into ``npz_path`` (default: ``out_dir`` + ``.npz``, LlamaGen's place). A token pipeline
    draws with ``sampler`` and ``params``, a streaming one streams ``params`` (:class:`StreamClips`, no sampler).
    Every rank must call it with the same arguments."""
    check_count("num_samples", num_samples)
    check_drawing(pipe, sampler, params)
    check_conditioning(pipe, plan)
    out_dir = Path(out_dir)
    npz_path = Path(npz_path) if npz_path is not None else out_dir.with_name(out_dir.name + ".npz")
    settings = run_settings(pipe, plan, sampler, params)
    check_resumable(out_dir, settings)
    out_dir.mkdir(parents=True, exist_ok=True)
    if ctx.rank == 0:
        for stale in out_dir.glob("*.part"):  # left by a killed process: no rank writes before the barrier
            stale.unlink()
    ctx.barrier()  # every rank has checked the folder before rank 0 records (or re-records) the settings
    if ctx.rank == 0:
        write_manifest(out_dir, settings, num_samples, plan)
    run = run_id(settings)
    batches = range(ctx.rank, plan.num_batches(num_samples), ctx.world_size)
    damaged: list[str] = []
    todo = [k for k in batches if not kept_batch(out_dir, plan.batch_indices(k, num_samples), run, damaged)]
    total, drawn = (sum(len(plan.batch_indices(k, num_samples)) for k in ks) for ks in (batches, todo))
    bar = tqdm(total=total, initial=total - drawn, unit="sample", desc="sampling (rank 0)",
               disable=not progress or ctx.rank != 0)
    for k in todo:
        indices = plan.batch_indices(k, num_samples)
        out = draw_batch(pipe, plan, k, indices, sampler, params)
        for i, sample in zip(indices, samples_of(out)):
            write_sample(sample, png_path(out_dir, i), batch_record(run, indices))
        bar.update(len(indices))
    bar.close()
    generated, reused = ctx.sum([drawn, total - drawn])
    ctx.barrier()  # every rank's PNGs are on disk
    packed = pack_npz(out_dir, npz_path, num_samples, plan, num_frames(pipe, params)) if ctx.rank == 0 else None
    return SampleManyResult(packed, num_samples, generated, reused, tuple(damaged))


def batch_record(run: str, indices: range) -> dict:
    """What each PNG of a batch records: the run (:func:`run_id`) and the batch's indices [start, stop)."""
    return {"run": run, "batch": [indices.start, indices.stop]}


def kept_batch(out_dir: Path, indices: range, run: str, damaged: list[str]) -> bool:
    """Whether every PNG of a batch exists, reads whole and records this run and batch; a damaged PNG met on the
    way is described in ``damaged``."""
    for i in indices:
        path = png_path(out_dir, i)
        if not path.is_file():
            return False
        try:
            if png_record(path) != batch_record(run, indices):
                return False
        except DamagedSample as e:
            damaged.append(str(e))
            return False
    return True


def pack_npz(out_dir: Path, npz_path: Path, num_samples: int, plan: SamplePlan, frames: int | None = None) -> Path:
    """The first ``num_samples`` PNGs as ``arr_0`` (uint8 [N, H, W, 3], or with ``frames`` clips [N, T, H, W, 3]
    from frame strips), their labels as ``arr_1`` and, for prompts, each sample's prompt as ``prompts`` (and a prompt
    set's ``ids``, ``categories`` and ``challenges`` where it has them); the file is flushed to the disk before it is
    renamed."""
    missing = [i for i in range(num_samples) if not png_path(out_dir, i).is_file()]
    if missing:
        raise ValueError(f"{len(missing)} of the first {num_samples} samples are missing in {out_dir} (first: "
                         f"{png_path(out_dir, missing[0]).name}); run the same command again to draw them")
    first = read_sample(png_path(out_dir, 0), frames)
    samples = np.empty((num_samples, *first.shape), np.uint8)
    for i in tqdm(range(num_samples), desc="packing .npz", disable=num_samples < 1000):
        sample = read_sample(png_path(out_dir, i), frames)
        if sample.shape != first.shape:
            raise ValueError(f"{png_path(out_dir, i)} is {sample.shape}, not {first.shape} like the others")
        samples[i] = sample
    labels = np.asarray(plan.labels(range(num_samples)), np.int64)
    arrays = {"arr_0": samples, "arr_1": labels}
    if plan.prompts:
        arrays["prompts"] = np.array([plan.prompts[j] for j in labels], dtype=str)
    ps = plan.prompt_set
    if ps is not None:
        columns = {"ids": ps.ids, "categories": ps.categories, "challenges": ps.challenges}
        arrays |= {name: np.array([column[j] for j in labels], dtype=str) for name, column in columns.items()
                   if column is not None}
    npz_path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(npz_path, lambda f: np.savez(f, **arrays), sync=True)
    return npz_path
