"""Image sets for evaluation and their features.

An image set is a folder of image files (png, jpg, jpeg, webp; sorted by name), an ``.npz`` holding ``arr_0``
[N, H, W, 3] uint8 (the layout LlamaGen's and ADM's samplers pack) or an ``.npy`` of that array. A statistics
file (``.npz`` with ``mu`` and ``sigma``, written by ``vgen eval stats``) may stand in for either side of FID.

Feature sets: ``shapes``, the 192-d pooled embedding of vgen's shipped domain classifier (offline, for the
embedded default's domain; images are resized to its 64x64 input with PIL's bicubic filter).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
FEATURE_SETS = ("shapes",)


def is_stats_file(path: str | Path) -> bool:
    path = Path(path)
    if path.suffix != ".npz" or not path.is_file():
        return False
    with np.load(path) as f:
        return "mu" in f and "sigma" in f


def load_images(path: str | Path) -> np.ndarray:
    """uint8 RGB images [N, H, W, 3] from a folder, an ``.npz`` (``arr_0``) or an ``.npy``."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"image set not found: {path}")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise ValueError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {path}")
        images = [np.asarray(Image.open(f).convert("RGB")) for f in files]
        if len({im.shape for im in images}) > 1:
            raise ValueError(f"images in {path} differ in size")
        return np.stack(images)
    if path.suffix == ".npz":
        with np.load(path) as f:
            if "arr_0" not in f:
                raise ValueError(f"{path} holds no 'arr_0' image array (keys: {sorted(f.files)})")
            array = f["arr_0"]
    elif path.suffix == ".npy":
        array = np.load(path)
    else:
        raise ValueError(f"unsupported image set {path}: expected a folder, .npz or .npy")
    if array.ndim != 4 or array.shape[-1] != 3 or array.dtype != np.uint8:
        raise ValueError(f"{path}: expected uint8 images [N, H, W, 3], got {array.dtype} {array.shape}")
    return array


@torch.no_grad()
def shapes_features(images: np.ndarray, batch_size: int = 256, progress: bool = False) -> np.ndarray:
    """The shipped domain classifier's 192-d features [N, 192] of uint8 images [N, H, W, 3]."""
    from vgen.eval.classifier import load_shapes_classifier

    classifier = load_shapes_classifier().eval()
    size = classifier.config.image_size
    out = []
    for i in tqdm(range(0, len(images), batch_size), desc="features", disable=not progress):
        chunk = images[i:i + batch_size]
        if chunk.shape[1:3] != (size, size):
            chunk = np.stack([np.asarray(Image.fromarray(im).resize((size, size), Image.BICUBIC)) for im in chunk])
        x = torch.from_numpy(np.ascontiguousarray(chunk)).permute(0, 3, 1, 2).float() / 127.5 - 1
        out.append(classifier.features(x).double().numpy())
    return np.concatenate(out)


def extract(features: str, images: np.ndarray, batch_size: int = 256, progress: bool = False) -> np.ndarray:
    if features not in FEATURE_SETS:
        raise ValueError(f"unknown feature set {features!r}; available: {', '.join(FEATURE_SETS)}")
    return shapes_features(images, batch_size, progress)
