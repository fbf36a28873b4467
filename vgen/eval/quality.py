"""Quality figures of a token model: token statistics, and whether its samples show their class or prompt.

``token_statistics`` measures how spread out the model's next-token distributions are on its own samples
(mean entropy in nats, median top-1 probability): the speed of every speculative sampler depends on them, so each
benchmark table prints them beside its speed-ups. ``class_accuracy`` asks the domain classifier whether each
sample shows the class it was generated for; ``attribute_accuracy`` asks the scene judge whether a text-to-image
sample shows each attribute its prompt stated. For clips, ``clip_class_accuracy`` asks it about every frame and
``motion_check`` compares how much the frames change with real clips: the shape must both keep its class and move.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from vgen.data.clips import SPLIT_SEEDS, ClipsConfig, render_clips
from vgen.data.scenes import ATTRIBUTE_VALUES, POSITIONS
from vgen.data.shapes import to_tensor
from vgen.eval.drift import CLIP_CHUNK_FRAMES, chunk_bounds, class_probabilities, clip_collapse
from vgen.models.classifier import AttributeClassifier, ShapesClassifier
from vgen.models.conditioning import Condition, cat_conditions
from vgen.models.llamagen import teacher_forced_logits
from vgen.samplers import SamplingParams, apply_cfg, build_processors


@torch.no_grad()
def token_statistics(model: torch.nn.Module, tokens: torch.Tensor, cond: Condition,
                     params: SamplingParams, max_logits: int = 1 << 27) -> dict[str, float]:
    """Entropy and top-1 probability of the distributions a sampler with ``params`` drew ``tokens`` [B, N] from,
    under their condition (class ids [B], or a text model's prompt condition).

    A teacher-forced pass over the finished sequences gives exactly the distributions the sampler used
    (guided, then temperature / top-k / top-p), one per token, without slowing sampling down. A next-token model
    (LlamaGen, Janus) reads the sequence through its KV cache (:func:`~vgen.models.llamagen.teacher_forced_logits`);
    a grid model (NAR, NBP) reads the whole grid under its own mask and scores every cell from the cells its
    sampler had at that step. Sequences go through in chunks of
    at most ``max_logits`` logits (guided rows included; 512 MB in fp32), so 2,048-token clips over a 4,096-code
    vocabulary are scored 8 at a time rather than holding gigabytes of logits at once.
    """
    processors = build_processors(params)
    next_token = getattr(model, "token_order", "raster") == "raster"
    per_sequence = (2 if params.guided else 1) * tokens.shape[1] * model.config.vocab_size
    batch_size = max(1, max_logits // per_sequence)
    entropies, top1 = [], []
    device = next(model.parameters()).device
    for i in range(0, len(tokens), batch_size):
        t, c = tokens[i:i + batch_size].to(device), cond[i:i + batch_size].to(device)
        if params.guided:
            t, c = torch.cat([t, t]), cat_conditions([c, model.null_condition(c)])
        logits = teacher_forced_logits(model, c, t) if next_token else model(c, t)
        logits = apply_cfg(logits, params, torch.arange(logits.shape[1], device=logits.device))
        probs = processors(logits).softmax(-1)
        entropies.append(-(probs * probs.clamp_min(1e-30).log()).sum(-1).flatten())
        top1.append(probs.max(-1).values.flatten())
    ent, p1 = torch.cat(entropies), torch.cat(top1)
    return {"mean_entropy_nats": float(ent.mean()), "median_top1_prob": float(p1.median()),
            "mean_top1_prob": float(p1.mean()), "share_top1_below_0.05": float((p1 < 0.05).float().mean()),
            "tokens_measured": int(ent.numel())}


@torch.no_grad()
def class_accuracy(classifier: ShapesClassifier, images: torch.Tensor, class_ids: Sequence[int]) -> dict:
    """Share of images [N, 3, H, W] in [-1, 1] that the classifier assigns to their requested class, per class,
    and the ``confusion`` counts (row: requested class, column: the class the classifier saw) that say what a
    failing class turns into."""
    preds = classifier.predict(images).cpu().numpy()
    wanted = np.asarray(class_ids)
    per_class = {int(c): float((preds[wanted == c] == c).mean()) for c in np.unique(wanted)}
    return {"class_accuracy": float((preds == wanted).mean()), "per_class": per_class,
            "confusion": confusion_counts(wanted, preds, classifier.config.num_classes), "num_images": len(wanted)}


def confusion_counts(wanted: np.ndarray, seen: np.ndarray, num_classes: int) -> list[list[int]]:
    """Counts [requested class][class seen] of int class ids ``wanted`` and ``seen`` [N]."""
    flat = np.asarray(wanted) * num_classes + np.asarray(seen)
    return np.bincount(flat, minlength=num_classes ** 2).reshape(num_classes, num_classes).tolist()


@torch.no_grad()
def judged(judge: AttributeClassifier, images: np.ndarray, attributes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The judge's reading [N, A] of uint8 images [N, H, W, 3], and the requested ``attributes`` [N, A]."""
    return judge.predict(to_tensor(np.asarray(images))).numpy(), np.asarray(attributes)


def accuracy_by_request(judge: AttributeClassifier, images: np.ndarray, attributes: np.ndarray) -> dict:
    """Where a text model misses: each attribute's accuracy per requested value (``per_value``: which shapes,
    colours or places fail), and, for a judge of ``size``, every attribute's accuracy per requested size
    (``by_size``: whether small objects are the cause). Values are named as the scene captions name them."""
    preds, wanted = judged(judge, images, attributes)
    names = judge.config.names

    def value_name(name: str, value: int) -> str:
        return ATTRIBUTE_VALUES[name][value] if name in ATTRIBUTE_VALUES else str(value)

    per_value = {name: {value_name(name, int(v)): float((preds[wanted[:, i] == v, i] == v).mean())
                        for v in np.unique(wanted[:, i])} for i, name in enumerate(names)}
    figures: dict = {"per_value": per_value}
    if "size" in names:
        size = wanted[:, names.index("size")]
        figures["by_size"] = {value_name("size", int(v)): {name: float((preds[size == v, i] == wanted[size == v, i])
                                                                       .mean()) for i, name in enumerate(names)}
                              for v in np.unique(size)}
    return figures


def attribute_accuracy(judge: AttributeClassifier, images: np.ndarray, attributes: np.ndarray) -> dict[str, float]:
    """Per-attribute share of images (uint8 [N, H, W, 3]) the judge reads as ``attributes`` [N, A], and the share
    with every attribute right (``joint``): how faithfully text-to-image samples follow their prompts. A judge
    of the scenes' ``position`` also gets the place's row and column scored apart (``position_row``,
    ``position_column``), which tells a model that finds the height but not the side from one that finds neither."""
    preds, wanted = judged(judge, images, attributes)
    right = preds == wanted
    names = judge.config.names
    figures = {name: float(right[:, i].mean()) for i, name in enumerate(names)}
    if "position" in names:
        side, i = math.isqrt(len(POSITIONS)), names.index("position")
        figures["position_row"] = float((preds[:, i] // side == wanted[:, i] // side).mean())
        figures["position_column"] = float((preds[:, i] % side == wanted[:, i] % side).mean())
    return {**figures, "joint": float(right.all(1).mean())}


def clip_class_accuracy(videos: np.ndarray, class_ids: Sequence[int]) -> dict:
    """Per-frame domain classifier on clips uint8 [N, T, H, W, 3]: ``class_accuracy`` (the class of highest mean
    probability over a clip's frames is the requested one), ``frame_accuracy`` (share of frames of the requested
    class) and ``identity_kept`` (mean share of a clip's frames that agree with its own majority class, whatever
    it is: a shape that morphs into another lowers it) and the ``confusion`` counts of clips (row: requested class,
    column: the clip's class). Clips of two or more :data:`CLIP_CHUNK_FRAMES` chunks also get
    ``class_accuracy_by_chunk``: the class accuracy of each chunk judged as a clip of its own."""
    n, t = videos.shape[:2]
    probs = class_probabilities(np.ascontiguousarray(videos).reshape(n * t, *videos.shape[2:])).reshape(n, t, -1)
    wanted = np.asarray(class_ids)
    frame_pred, clip_pred = probs.argmax(-1), probs.mean(1).argmax(-1)
    majority = np.array([np.bincount(f, minlength=probs.shape[-1]).max() / t for f in frame_pred])
    per_class = {int(c): float((clip_pred[wanted == c] == c).mean()) for c in np.unique(wanted)}
    figures = {"class_accuracy": float((clip_pred == wanted).mean()),
               "frame_accuracy": float((frame_pred == wanted[:, None]).mean()),
               "identity_kept": float(majority.mean()), "per_class": per_class,
               "confusion": confusion_counts(wanted, clip_pred, probs.shape[-1]), "num_clips": int(n)}
    if t >= 2 * CLIP_CHUNK_FRAMES:
        figures["class_accuracy_by_chunk"] = {
            f"frames {a}-{b - 1}": float((probs[:, a:b].mean(1).argmax(-1) == wanted).mean())
            for a, b in chunk_bounds(t, t // CLIP_CHUNK_FRAMES)}
    return figures


def frame_change(videos: np.ndarray) -> np.ndarray:
    """Mean absolute change between consecutive frames of each clip uint8 [N, T, H, W, 3], in grey levels [N]."""
    return np.abs(np.diff(videos.astype(np.float32), axis=1)).mean(axis=(1, 2, 3, 4))


def motion_check(videos: np.ndarray, reference: np.ndarray) -> dict:
    """Do the clips move like real ones? ``share_moving``: clips changing at least as much per frame as the 5%
    slowest real clips (a frozen clip fails); ``share_above_real_p95``: clips changing more than 95% of real ones
    (flicker)."""
    change, real = frame_change(videos), frame_change(reference)
    low, high = np.percentile(real, [5, 95])
    return {"frame_change": float(change.mean()), "real_frame_change": float(real.mean()),
            "real_frame_change_p5": float(low), "real_frame_change_p95": float(high),
            "share_moving": float((change >= low).mean()), "share_above_real_p95": float((change > high).mean()),
            "num_real_clips": len(reference)}


def clip_quality(videos: np.ndarray, class_ids: Sequence[int], clips: ClipsConfig) -> dict:
    """Class, texture-collapse and motion figures of generated clips [N, T, H, W, 3], against N real clips of the
    moving-shapes validation split rendered with ``clips`` (whose class figures, under ``real_clips``, are the
    ceiling)."""
    real, real_classes = render_clips(SPLIT_SEEDS["val"], 0, len(videos), clips)
    figures = clip_class_accuracy(videos, class_ids)
    figures["real_clips"] = {k: v for k, v in clip_class_accuracy(real, real_classes).items()
                             if k not in ("per_class", "confusion", "class_accuracy_by_chunk")}
    return {**figures, **clip_collapse(videos), **motion_check(videos, real)}
