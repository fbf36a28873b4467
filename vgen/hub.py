"""Local checkpoints: vgen's own format (``config.json`` + ``model.safetensors``) and LlamaGen ``.pt`` files.

Nothing is downloaded: every loader takes a local path and, when the file is not there, says where to put it.
Pickled checkpoints are read with ``torch.load(weights_only=True)``; vgen writes safetensors only. A state dict
that does not fit the model fails with :class:`CheckpointError`, naming the missing and unexpected keys and the
shapes that differ. A folder is checked before any tensor is allocated: every field of its ``config.json`` against
its declaration (type, range, relations: :mod:`vgen.models.config_fields`), then its safetensors header (read
without the data), which must hold exactly the tensor names and shapes of the model that config describes, built on
the meta device to tell, and that model at most ``max_params`` values (:data:`MAX_PARAMS` unless raised). A
folder's ``config.json`` names its model class by a name of :data:`MODEL_CLASSES`, or names another folder that
holds the same model (:data:`SAME_AS`). The models shipped inside the package lie under :data:`ASSETS`, where
evaluation and training find them without a pipeline.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from torch.overrides import TorchFunctionMode

from vgen.models.blockdiff import BlockDiffConfig, BlockDiffusionTransformer
from vgen.models.checkpoint_io import (  # noqa: F401 (the readers are vgen.hub's API too)
    CheckpointError,
    describe_mismatch,
    load_weights,
    local_path,
    read_safetensors,
    read_torch_checkpoint,
    safetensors_shapes,
    torch_load,
)
from vgen.models.classifier import (
    AttributeClassifier,
    AttributeClassifierConfig,
    ClassifierConfig,
    ShapesClassifier,
    ShapesVideoClassifier,
    VideoClassifierConfig,
)
from vgen.models.config_fields import ModelConfig, short_repr
from vgen.models.draft_head import DraftHead, DraftHeadConfig
from vgen.models.llamagen import GPTConfig, LlamaGenGPT
from vgen.models.mar import ContinuousAR, MARConfig
from vgen.models.nar import NARConfig, NARTransformer
from vgen.models.nbp import NBPConfig, NBPTransformer
from vgen.models.word_encoder import WordEncoderConfig, WordTextEncoder
from vgen.tokenizers.kl import KLConfig, KLTokenizer
from vgen.tokenizers.vq import VQConfig, VQModel

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
ASSETS = Path(__file__).parent / "assets"
"""The embedded models and judges shipped inside the package, one folder each."""
SAME_AS = "same_as"
"""The one key of a ``config.json`` that stands for a model folder kept elsewhere, by a path relative to its own
folder (``{"same_as": "../../shapes-c2i/vq"}``): the embedded models name their shared tokenizers so, and the
package holds one copy of each."""
PIPELINE_CONFIG = "pipeline.json"
"""The file that makes a folder a pipeline folder (names, image size, defaults), beside its model folders."""
MAX_PARAMS = 20_000_000_000
"""The most values (parameters and buffers) a model from a folder may hold unless ``max_params`` says more: 80 GB
in float32."""


MODEL_CLASSES: dict[str, tuple[type[nn.Module], type[ModelConfig]]] = {
    "LlamaGenGPT": (LlamaGenGPT, GPTConfig), "VQModel": (VQModel, VQConfig),
    "ShapesClassifier": (ShapesClassifier, ClassifierConfig),
    "ShapesVideoClassifier": (ShapesVideoClassifier, VideoClassifierConfig),
    "DraftHead": (DraftHead, DraftHeadConfig),
    "NARTransformer": (NARTransformer, NARConfig), "NBPTransformer": (NBPTransformer, NBPConfig),
    "ContinuousAR": (ContinuousAR, MARConfig),
    "KLTokenizer": (KLTokenizer, KLConfig),
    "BlockDiffusionTransformer": (BlockDiffusionTransformer, BlockDiffConfig),
    "WordTextEncoder": (WordTextEncoder, WordEncoderConfig),
    "AttributeClassifier": (AttributeClassifier, AttributeClassifierConfig)}
"""The model classes a ``config.json`` may name, by the name it records."""


def register_model_class(name: str, model_cls: type[nn.Module], config_cls: type[ModelConfig]) -> None:
    """Let :func:`from_pretrained` build ``model_cls`` from a folder whose config names ``name``; ``config_cls``
    derives from :class:`~vgen.models.config_fields.ModelConfig`, so its fields are checked before the build."""
    if not (isinstance(config_cls, type) and issubclass(config_cls, ModelConfig)):
        raise TypeError(f"the config class of {name} must derive from vgen.models.config_fields.ModelConfig, whose "
                        f"declared fields are checked before a model is built; got {config_cls!r}")
    MODEL_CLASSES[name] = (model_cls, config_cls)


def save_pretrained(model: nn.Module, path: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write ``model`` (which must have a ``config`` with ``to_dict``) as ``path/config.json`` + safetensors."""
    name = type(model).__name__
    if name not in MODEL_CLASSES:
        raise TypeError(f"{name} is not a registered vgen model class")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for k, v in model.state_dict().items():
        v = v.detach().cpu().contiguous()
        tensors[k] = v.to(dtype) if dtype is not None and v.dtype.is_floating_point else v
    save_file(tensors, str(path / WEIGHTS_NAME))
    (path / CONFIG_NAME).write_text(json.dumps({"class": name, "config": model.config.to_dict()}, indent=1))
    return path


def read_config(path: str | Path) -> dict:
    path = Path(path)
    cfg_path = path / CONFIG_NAME
    if not cfg_path.is_file():
        raise CheckpointError(f"no {CONFIG_NAME} in {path}: expected a folder written by save_pretrained")
    try:
        meta = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{cfg_path} is not valid JSON: {e}") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{cfg_path} holds a JSON {type(meta).__name__}, not an object with 'class' and 'config'")
    return meta


def model_folder(path: str | Path) -> Path:
    """The folder that holds the model of folder ``path``: ``path`` itself, or the folder its ``config.json`` names
    by :data:`SAME_AS`, which must be a relative path to a folder that names no other."""
    path = Path(path)
    meta = read_config(path)
    if SAME_AS not in meta:
        return path
    target = meta[SAME_AS]
    if set(meta) != {SAME_AS} or not isinstance(target, str) or not target or Path(target).is_absolute():
        raise CheckpointError(f"{path / CONFIG_NAME}: {SAME_AS!r} must be the only key, with a relative path to a "
                              f"model folder; got {short_repr(meta)}")
    folder = Path(os.path.normpath(path / target))
    if not (folder / CONFIG_NAME).is_file():
        raise CheckpointError(f"{path / CONFIG_NAME} names {target!r} by {SAME_AS!r}, but {folder} has no "
                              f"{CONFIG_NAME}")
    if SAME_AS in read_config(folder):
        raise CheckpointError(f"{path / CONFIG_NAME} names {folder} by {SAME_AS!r}, which names another folder in "
                              f"turn: name the folder that holds the model")
    return folder


def model_config(path: str | Path) -> tuple[str, type[nn.Module], ModelConfig]:
    """The name of the model class a folder's ``config.json`` records (that of the folder it names by
    :data:`SAME_AS`), that class and its config, every field checked: a :class:`CheckpointError` names the file and
    what is wrong (an unknown class, a bad field)."""
    path = model_folder(path)
    meta = read_config(path)
    if meta.get("class") not in MODEL_CLASSES:
        raise CheckpointError(f"{path / CONFIG_NAME} names model class {meta.get('class')!r}; "
                              f"known: {sorted(MODEL_CLASSES)}")
    model_cls, config_cls = MODEL_CLASSES[meta["class"]]
    try:
        return meta["class"], model_cls, config_cls.from_dict(meta["config"])
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise CheckpointError(f"bad model config in {path / CONFIG_NAME}: {e}") from None


def from_pretrained(path: str | Path, map_location: str | torch.device = "cpu",
                    max_params: int = MAX_PARAMS) -> nn.Module:
    """Build and load a model saved with :func:`save_pretrained` (or the one its folder names by :data:`SAME_AS`).

    Before any tensor is allocated, the config's fields are checked (a bad one is named with the file), and the
    config's model is built on the meta device and compared with the weights file's header: it must have exactly
    the header's tensor names and shapes, and at most ``max_params`` values in its parameters and buffers. A
    config that does not fit its weights, or a model too large, fails in one line.
    """
    path = model_folder(local_path(path, "from_pretrained's path"))
    name, model_cls, config = model_config(path)
    weights = path / WEIGHTS_NAME
    shapes = safetensors_shapes(weights)
    described = f"the {name} of {path / CONFIG_NAME}"
    limit = 2 * len(shapes) + 16  # room for a config that differs a little, whose keys the mismatch then names
    with parameter_budget(limit, f"{described} has over {limit} parameter tensors, far more than the {len(shapes)} "
                                 f"of {weights}"), meta_device():
        skeleton = model_cls(config)
    problem = describe_mismatch({k: tuple(v.shape) for k, v in skeleton.state_dict().items()}, shapes)
    if problem:
        raise CheckpointError(f"{weights} does not match {described}: {problem}")
    size = sum(t.numel() for t in (*skeleton.parameters(), *skeleton.buffers()))
    if size > max_params:
        raise CheckpointError(f"{described} holds {size:,} values in its parameters and buffers, over the limit of "
                              f"{max_params:,}: pass max_params={size} to load a model this large")
    model = model_cls(config)
    load_weights(model, read_safetensors(weights), source=str(weights))
    return model.to(map_location).eval()


class _SkipMetaValues(TorchFunctionMode):
    """On meta tensors, skips what computes values only: in-place ops (``normal_``, ``uniform_``, ``copy_``, ...,
    but not those that change a shape) and :data:`SAME_SHAPE` functions, whose result is an empty tensor of the
    input's shape. Meta tensors have no values, and the meta kernels of some of these ops are written in Python
    and import ``torch._dynamo`` (seconds) on first use."""

    SHAPE_OPS = frozenset({"resize_", "resize_as_", "squeeze_", "unsqueeze_", "t_", "transpose_", "swapdims_",
                           "swapaxes_", "as_strided_", "set_"})
    SAME_SHAPE = frozenset({torch.nn.functional.normalize})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        target = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        if target is not None and target.is_meta:
            name = getattr(func, "__name__", "")
            if name.endswith("_") and not name.startswith("_") and name not in self.SHAPE_OPS:
                return target
            if func in self.SAME_SHAPE:
                return torch.empty_like(target)
        return func(*args, **kwargs)


@contextmanager
def meta_device() -> Iterator[None]:
    """Build modules on the meta device (shapes without data), skipping their value initialisation."""
    with torch.device("meta"), _SkipMetaValues():
        yield


@contextmanager
def parameter_budget(tensors: int, what: str) -> Iterator[None]:
    """Stop a model's construction (in this thread) with a :class:`CheckpointError` starting with ``what`` once it
    has registered more than ``tensors`` parameters: a config far larger than its weights file then fails after a
    bounded number of modules, however many layers it asks for."""
    thread, seen = threading.get_ident(), [0]

    def count(module: nn.Module, name: str, param: torch.Tensor | None) -> None:
        if param is None or threading.get_ident() != thread:
            return
        seen[0] += 1
        if seen[0] > tensors:
            raise CheckpointError(f"{what} (building it stopped at {type(module).__name__}.{name} "
                                  f"{list(param.shape)})")

    handle = torch.nn.modules.module.register_module_parameter_registration_hook(count)
    try:
        yield
    finally:
        handle.remove()
