"""Image sets for evaluation and the feature extractors that turn images or videos into vectors.

An image set is a folder of image files (png, jpg, jpeg, webp; sorted by name), an ``.npz`` holding ``arr_0``
[N, H, W, 3] uint8 (the layout LlamaGen's and ADM's samplers pack) or an ``.npy`` of that array (videos:
:mod:`vgen.eval.videos`). A statistics file (``.npz`` with ``mu`` and ``sigma``, written by ``vgen eval stats``)
may stand in for either side of an evaluation.

Feature sets (:data:`FEATURE_SETS`), each for images, videos or both:

- ``shapes``: for images, the 192-d pooled embedding of vgen's shipped domain classifier (offline, for the embedded
  default's domain; images are resized to its 64x64 input with PIL's bicubic filter). For videos, the 128-d pooled
  embedding of the shipped video feature network (:class:`~vgen.models.classifier.ShapesVideoClassifier`, trained on
  the moving-shapes clips to tell their shape and whether their frames move in a real order; frames resized to
  32x32 the same way). Statistics record these as ``shapes-video`` (:data:`SHAPES_VIDEO`), so that statistics of
  the per-frame features that ``shapes`` meant for videos before are refused rather than compared.
- ``inception``: Inception-v3 pool3 (2048-d) from the local FID weights file (:mod:`vgen.eval.inception`).
- ``i3d``: I3D Kinetics-400 logits (400-d) from a local file, for FVD (:mod:`vgen.eval.i3d`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

from vgen.eval.classifier import (
    SHIPPED_CLASSIFIER,
    SHIPPED_VIDEO_CLASSIFIER,
    load_shapes_classifier,
    load_shapes_video_classifier,
)
from vgen.eval.fid import npz_keys, read_npy, read_npz
from vgen.eval.i3d import I3D_TORCHSCRIPT, I3D_WEIGHTS, I3DFeatures
from vgen.eval.inception import FID_INCEPTION_WEIGHTS, load_fid_inception
from vgen.eval.weights import WeightsSpec, check_hash, find_weights, sha256_of
from vgen.hub import ASSETS

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
FEATURE_SETS = {"shapes": ("images", "videos"), "inception": ("images",), "i3d": ("videos",)}
SHAPES_VIDEO = "shapes-video"  # the recorded name of the shapes video features


def recorded_name(name: str, media: str) -> str:
    """The name that features ``name`` of ``media`` record in statistics and reports: ``shapes`` on videos is
    :data:`SHAPES_VIDEO` (the video network's features, not the image classifier's)."""
    return SHAPES_VIDEO if (name, media) == ("shapes", "videos") else name


def is_stats_file(path: str | Path) -> bool:
    """Whether ``path`` is an ``.npz`` holding ``mu`` and ``sigma``; an ``.npz`` numpy cannot open is an error."""
    path = Path(path)
    if path.suffix != ".npz" or not path.is_file():
        return False
    return {"mu", "sigma"} <= set(npz_keys(path))


def list_folder(path: Path, suffixes: tuple[str, ...], what: str) -> list[Path]:
    """Files of ``path`` with one of ``suffixes``, sorted by name; an error if there are none or it is unreadable."""
    try:
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in suffixes)
    except OSError as e:
        raise ValueError(f"cannot read folder {path}: {e.strerror or e}") from e
    if not files:
        raise ValueError(f"no {what} ({', '.join(suffixes)}) in {path}")
    return files


def check_array(array: np.ndarray, ndim: int, path: Path, layout: str) -> np.ndarray:
    if array.ndim != ndim or array.shape[-1] != 3 or array.dtype != np.uint8:
        raise ValueError(f"{path}: expected uint8 {layout}, got {array.dtype} {array.shape}")
    return array


def load_array(path: Path, ndim: int, layout: str) -> np.ndarray:
    """``arr_0`` of an ``.npz`` or the array of an ``.npy``, checked to be uint8 ``layout``."""
    if path.suffix == ".npz":
        array = read_npz(path, ["arr_0"]).get("arr_0")
        if array is None:
            raise ValueError(f"{path} holds no 'arr_0' array of {layout} (keys: {sorted(npz_keys(path))})")
    elif path.suffix == ".npy":
        array = read_npy(path)
    else:
        raise ValueError(f"unsupported input {path}: expected a folder, .npz or .npy")
    return check_array(array, ndim, path, layout)


def same_shapes(items: list[np.ndarray], files: list[Path], path: Path, what: str) -> np.ndarray:
    shapes = sorted({im.shape for im in items})
    if len(shapes) > 1:
        first = {s: next(f.name for f, im in zip(files, items) if im.shape == s) for s in shapes}
        listed = ", ".join(f"{'x'.join(map(str, s))} ({first[s]})" for s in shapes[:3])
        raise ValueError(f"{what} in {path} differ in size: {listed}{', ...' if len(shapes) > 3 else ''}")
    return np.stack(items)


def load_images(path: str | Path) -> np.ndarray:
    """uint8 RGB images [N, H, W, 3] from a folder, an ``.npz`` (``arr_0``) or an ``.npy``."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"image set not found: {path}")
    if not path.is_dir():
        return load_array(path, 4, "images [N, H, W, 3]")
    files = list_folder(path, IMAGE_SUFFIXES, "images")
    images = []
    for f in files:
        try:
            images.append(np.asarray(Image.open(f).convert("RGB")))
        except OSError as e:
            raise ValueError(f"cannot read image {f}: {e}") from e
    return same_shapes(images, files, path, "images")


@torch.no_grad()
def shapes_features(images: np.ndarray, batch_size: int = 256, progress: bool = False) -> np.ndarray:
    """The shipped domain classifier's 192-d features [N, 192] of uint8 images [N, H, W, 3]."""
    return batched_features(load_shapes_classifier().eval(), images, classifier_input, batch_size, progress)


def batched_features(model: torch.nn.Module, samples: np.ndarray,
                     to_input: Callable[[np.ndarray, torch.nn.Module], torch.Tensor], batch_size: int,
                     progress: bool = False) -> np.ndarray:
    """``model.features`` (float64 [N, d]) of uint8 samples, ``batch_size`` at a time through ``to_input``."""
    out = []
    for i in tqdm(range(0, len(samples), batch_size), desc="features", disable=not progress):
        out.append(model.features(to_input(samples[i:i + batch_size], model)).double().numpy())
    return np.concatenate(out)


def classifier_input(images: np.ndarray, classifier: torch.nn.Module) -> torch.Tensor:
    """uint8 images [N, H, W, 3] -> the domain classifier's input: resized (bicubic) to its size, [N, 3, S, S] in
    [-1, 1]."""
    size = classifier.config.image_size
    if images.shape[1:3] != (size, size):
        images = np.stack([np.asarray(Image.fromarray(im).resize((size, size), Image.BICUBIC)) for im in images])
    return torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float() / 127.5 - 1


def clip_input(videos: np.ndarray, model: torch.nn.Module) -> torch.Tensor:
    """uint8 videos [N, T, H, W, 3] -> the video classifier's input [N, 3, T, S, S] in [-1, 1] (frames resized as
    :func:`classifier_input` does)."""
    n, t = videos.shape[:2]
    frames = classifier_input(np.asarray(videos).reshape(n * t, *videos.shape[2:]), model)
    return frames.reshape(n, t, *frames.shape[1:]).transpose(1, 2).contiguous()


@torch.no_grad()
def shapes_video_features(videos: np.ndarray, batch_size: int = 64, progress: bool = False) -> np.ndarray:
    """The shipped video feature network's 128-d features [N, 128] of uint8 videos [N, T, H, W, 3]."""
    return batched_features(load_shapes_video_classifier().eval(), videos, clip_input, batch_size, progress)


def shipped_sha256(folder: str) -> str:
    """SHA-256 of the weights of a network shipped in ``vgen/assets/<folder>``."""
    return sha256_of(ASSETS / folder / "model.safetensors")


@dataclass
class Extractor:
    """A loaded feature set: ``extractor(array)`` maps uint8 images [N, H, W, 3] or videos [N, T, H, W, 3] to
    float64 features [N, dim]. ``weights_sha256`` identifies the weights; ``weights_verified`` is True when they
    are the reference file, None when no reference hash is known, False when a different file was allowed."""

    name: str
    media: str
    dim: int
    weights_sha256: str
    weights_verified: bool | None
    fn: Callable[[np.ndarray, int, bool], np.ndarray]

    def __call__(self, data: np.ndarray, batch_size: int = 64, progress: bool = False) -> np.ndarray:
        return self.fn(data, batch_size, progress)


def load_extractor(name: str, media: str = "images", weights: str | Path | None = None, verify: bool = True,
                   device: str = "cpu", trust_torchscript: bool = False) -> Extractor:
    """The feature set ``name`` for ``media`` ("images" or "videos"), its weights found as in
    :mod:`vgen.eval.weights` (``weights`` is the ``--weights`` flag). A TorchScript weights file runs only with
    ``trust_torchscript`` (:class:`~vgen.eval.i3d.I3DFeatures`)."""
    if (name, media) == (SHAPES_VIDEO, "videos"):
        name = "shapes"
    if name not in FEATURE_SETS:
        raise ValueError(f"unknown feature set {name!r}; available: {', '.join(FEATURE_SETS)}")
    if media not in FEATURE_SETS[name]:
        usable = [n for n, m in FEATURE_SETS.items() if media in m]
        raise ValueError(f"feature set {name!r} is for {' and '.join(FEATURE_SETS[name])}, not {media}; for {media} "
                         f"use {' or '.join(usable)}")
    if name == "shapes":
        return _shapes(media, weights)
    if name == "inception":
        return _inception(weights, verify, device)
    return _i3d(weights, verify, device, trust_torchscript)


def _shapes(media: str, weights) -> Extractor:
    if weights is not None:
        raise ValueError("--weights does not apply to the shapes features (the networks ship with vgen)")
    if media == "images":
        return Extractor("shapes", media, 192, shipped_sha256(SHIPPED_CLASSIFIER), None, shapes_features)
    return Extractor(SHAPES_VIDEO, media, 128, shipped_sha256(SHIPPED_VIDEO_CLASSIFIER), None, shapes_video_features)


def _inception(weights, verify: bool, device: str) -> Extractor:
    path = find_weights(FID_INCEPTION_WEIGHTS, weights)
    digest, verified = check_hash(FID_INCEPTION_WEIGHTS, path, verify)
    model = load_fid_inception(path).to(device)

    @torch.no_grad()
    def fn(images: np.ndarray, batch_size: int, progress: bool) -> np.ndarray:
        out, step = [], max(1, min(batch_size, 32))  # 299x299 activations: keep batches small
        for i in tqdm(range(0, len(images), step), desc="inception", disable=not progress):
            x = torch.from_numpy(np.ascontiguousarray(images[i:i + step])).permute(0, 3, 1, 2).to(device)
            out.append(model(x).double().cpu().numpy())
        return np.concatenate(out)
    return Extractor("inception", "images", 2048, digest, verified, fn)


def _i3d(weights, verify: bool, device: str, trust_torchscript: bool) -> Extractor:
    either = WeightsSpec(" or ".join(s.title for s in I3D_WEIGHTS), sum((s.filenames for s in I3D_WEIGHTS), ()),
                         None, "; ".join(s.source for s in I3D_WEIGHTS))
    path = find_weights(either, weights)
    spec = next((s for s in I3D_WEIGHTS if path.name in s.filenames), I3D_TORCHSCRIPT)
    digest, verified = check_hash(spec, path, verify)
    model = I3DFeatures(path, device, trust_torchscript)

    def fn(videos: np.ndarray, batch_size: int, progress: bool) -> np.ndarray:
        step = max(1, min(batch_size, 8))
        chunks = range(0, len(videos), step)
        return np.concatenate([model(videos[i:i + step], step) for i in tqdm(chunks, desc="i3d", disable=not progress)])
    return Extractor("i3d", "videos", 400, digest, verified, fn)


def extract(features: str, images: np.ndarray, batch_size: int = 256, progress: bool = False) -> np.ndarray:
    """Features [N, d] of uint8 images with the feature set ``features`` (weights found as usual)."""
    return load_extractor(features, "images")(images, batch_size, progress)
