"""Many samples for evaluation: sharded over processes (``torchrun``), resumable, packed as an ADM-style ``.npz``.

**What each sample is.** Sample ``i`` of a run is a pure function of ``i`` and the run's settings, whatever the
number of processes. Samples are made in batches of ``batch_size`` consecutive indices; batch ``k`` (indices
``k*B .. k*B+B-1``) is drawn with a ``torch.Generator`` seeded with a 32-bit mix of ``(seed, k)``
(:meth:`SamplePlan.batch_seed`). Its labels are, per index,
``class_ids[i % C]`` with ``balanced`` (classes in turn, so every prefix of the run is balanced to within one
sample per class) and otherwise a uniform draw from ``class_ids`` seeded by ``(seed, i)``. LlamaGen's
``sample_c2i_ddp.py`` seeds each *rank* instead (``global_seed * world_size + rank``) and draws labels and noise
from that per-rank stream, so its samples change with the number of GPUs; vgen derives the stream from the global
seed and the batch instead, so the packed ``.npz`` is the same for any number of
processes, given the same batch size, settings, weights and deterministic kernels (CPU; one GPU model).

**Sharding.** Batch ``k`` belongs to rank ``k % world_size``. As in LlamaGen, whole batches are always made
(``ceil(N / B)`` of them), every rank writes ``{index:06d}.png`` into the output folder, and rank 0 packs the first
``N`` after a barrier into an ``.npz`` with ``arr_0`` (uint8 [N, H, W, 3]) and ``arr_1`` (int64 labels [N]; the
positional names guided-diffusion's ``image_sample.py`` writes for class-conditional samples).

**Resuming.** A PNG is written under a temporary name and renamed, so a file that exists is complete. A rerun skips
every batch whose PNGs all exist and redraws the others (identically, by the rule above), so an interrupted run
continues without duplicated or lost samples; a larger ``--num-samples`` extends a finished run. The folder's
``sample_many.json`` records the settings and a fingerprint of the weights; a rerun with other settings is refused.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from PIL import Image
from tqdm.auto import tqdm

from vgen.pipelines import ImagePipeline
from vgen.samplers import Sampler, SamplingParams

MAX_SEED = 2**31
MANIFEST = "sample_many.json"


@dataclass(frozen=True)
class SamplePlan:
    """Which noise seed and label each sample index gets (see the module docstring)."""

    seed: int
    batch_size: int
    class_ids: tuple[int, ...]
    balanced: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "class_ids", tuple(int(c) for c in self.class_ids))
        if not 0 <= self.seed < MAX_SEED:
            raise ValueError(f"seed must be in [0, 2**31), got {self.seed}")
        if self.batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {self.batch_size}")
        if not self.class_ids:
            raise ValueError("no class ids to draw labels from")

    def num_batches(self, num_samples: int) -> int:
        return math.ceil(num_samples / self.batch_size)

    def batch_indices(self, k: int) -> range:
        return range(k * self.batch_size, (k + 1) * self.batch_size)

    def batch_seed(self, k: int) -> int:
        """A 32-bit seed mixed from (seed, batch) by numpy's SeedSequence: torch's CPU generator keeps only the
        low 32 bits of a seed, so a plain ``seed * 2**32 + k`` would give every global seed the same images."""
        return int(np.random.SeedSequence([self.seed, k]).generate_state(1)[0])

    def labels(self, indices: Iterable[int]) -> list[int]:
        c = self.class_ids
        if self.balanced:
            return [c[i % len(c)] for i in indices]
        return [c[int(np.random.default_rng([self.seed, i]).integers(len(c)))] for i in indices]

    def to_dict(self) -> dict:
        return {**asdict(self), "class_ids": list(self.class_ids)}


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


def weights_fingerprint(pipe: ImagePipeline) -> str:
    """SHA-256 over every tensor of the backbone, tokenizer and draft head (names, dtypes and bytes)."""
    digest = hashlib.sha256()
    for prefix, module in (("gpt", pipe.model), ("vq", pipe.tokenizer), ("drafter", pipe.draft_head)):
        if module is None:
            continue
        for name, tensor in module.state_dict().items():
            digest.update(f"{prefix}.{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
            digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def run_settings(pipe: ImagePipeline, plan: SamplePlan, sampler: Sampler, params: SamplingParams) -> dict:
    """Everything that decides the images (and so must not change when a run is resumed)."""
    return {"model": pipe.info.name, "image_size": pipe.info.image_size, "weights_sha256": weights_fingerprint(pipe),
            "dtype": str(pipe.model.output.weight.dtype).removeprefix("torch."), "plan": plan.to_dict(),
            "sampler": sampler.to_dict(), "sampling": params.to_dict()}


def check_resumable(out_dir: Path, settings: dict) -> None:
    """Refuse to add samples to a folder made with other settings (its images would not be the same run's)."""
    manifest = out_dir / MANIFEST
    if not manifest.is_file():
        if out_dir.is_dir() and any(out_dir.glob("*.png")):
            raise ValueError(f"{out_dir} already holds PNG files but no {MANIFEST}: not a vgen sample-many folder; "
                             f"use a new --out")
        return
    try:
        recorded = json.loads(manifest.read_text())["settings"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"unreadable {manifest}: {e}") from None
    changed = sorted(k for k in {*recorded, *settings} if recorded.get(k) != settings.get(k))
    if changed:
        shown = "; ".join(f"{k}: {json.dumps(recorded.get(k))} -> {json.dumps(settings.get(k))}" for k in changed)
        raise ValueError(f"{out_dir} holds samples made with other settings ({shown}); resume with the same "
                         f"settings or use a new --out")


def png_path(out_dir: Path, index: int) -> Path:
    return out_dir / f"{index:06d}.png"


def existing_indices(out_dir: Path) -> set[int]:
    return {int(p.stem) for p in out_dir.glob("*.png") if p.stem.isdigit()}


def read_png(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def write_png(image: Image.Image, path: Path) -> None:
    """Write under a temporary name, then rename: a PNG that exists is complete."""
    tmp = path.with_name(path.name + ".part")
    image.save(tmp, format="PNG")
    os.replace(tmp, path)


@dataclass(frozen=True)
class SampleManyResult:
    """The packed file (None on ranks other than 0), the samples in it, and the images drawn by this run and
    found from an earlier one (over all ranks; whole batches, so they may exceed ``num_samples``)."""

    npz: Path | None
    num_samples: int
    generated: int
    reused: int


def sample_many(pipe: ImagePipeline, out_dir: str | Path, num_samples: int, plan: SamplePlan, sampler: Sampler,
                params: SamplingParams, npz_path: str | Path | None = None, ctx: Distributed = Distributed(),
                progress: bool = True) -> SampleManyResult:
    """Draw this rank's missing batches into ``out_dir``; rank 0 then packs the first ``num_samples`` into
    ``npz_path`` (default: ``out_dir`` + ``.npz``, LlamaGen's place). Every rank must call it with the same
    arguments."""
    if num_samples < 1:
        raise ValueError(f"number of samples must be >= 1, got {num_samples}")
    pipe.check_class_ids(plan.class_ids)
    out_dir = Path(out_dir)
    npz_path = Path(npz_path) if npz_path is not None else out_dir.with_name(out_dir.name + ".npz")
    settings = run_settings(pipe, plan, sampler, params)
    check_resumable(out_dir, settings)
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx.barrier()  # every rank has checked the folder before rank 0 records (or re-records) the settings
    if ctx.rank == 0:
        (out_dir / MANIFEST).write_text(json.dumps({"settings": settings, "num_samples": num_samples}, indent=1))
    done = existing_indices(out_dir)
    mine = range(ctx.rank, plan.num_batches(num_samples), ctx.world_size)
    todo = [k for k in mine if not set(plan.batch_indices(k)) <= done]
    reused = (len(mine) - len(todo)) * plan.batch_size
    bar = tqdm(total=len(mine) * plan.batch_size, initial=reused, unit="img", desc="sampling (rank 0)",
               disable=not progress or ctx.rank != 0)
    for k in todo:
        indices = plan.batch_indices(k)
        out = pipe(plan.labels(indices), sampler=sampler, seed=plan.batch_seed(k), **params.to_dict())
        for i, image in zip(indices, out.images):
            write_png(image, png_path(out_dir, i))
        bar.update(len(indices))
    bar.close()
    generated, reused = ctx.sum([len(todo) * plan.batch_size, reused])
    ctx.barrier()  # every rank's PNGs are on disk
    packed = pack_npz(out_dir, npz_path, num_samples, plan) if ctx.rank == 0 else None
    return SampleManyResult(packed, num_samples, generated, reused)


def pack_npz(out_dir: Path, npz_path: Path, num_samples: int, plan: SamplePlan) -> Path:
    """The first ``num_samples`` PNGs as ``arr_0`` (uint8 [N, H, W, 3]) and their labels as ``arr_1``."""
    missing = [i for i in range(num_samples) if not png_path(out_dir, i).is_file()]
    if missing:
        raise ValueError(f"{len(missing)} of the first {num_samples} samples are missing in {out_dir} (first: "
                         f"{png_path(out_dir, missing[0]).name}); run the same command again to draw them")
    first = read_png(png_path(out_dir, 0))
    images = np.empty((num_samples, *first.shape), np.uint8)
    for i in tqdm(range(num_samples), desc="packing .npz", disable=num_samples < 1000):
        image = read_png(png_path(out_dir, i))
        if image.shape != first.shape:
            raise ValueError(f"{png_path(out_dir, i)} is {image.shape}, not {first.shape} like the others")
        images[i] = image
    labels = np.asarray(plan.labels(range(num_samples)), np.int64)
    tmp = npz_path.with_name(npz_path.name + ".part")
    with open(tmp, "wb") as f:
        np.savez(f, arr_0=images, arr_1=labels)
    os.replace(tmp, npz_path)
    return npz_path
