"""The shipped judges of the shapes domain: the image classifier (whether an image shows the requested class;
its pooled activations are vgen's offline FID features) and the video feature network (FVD features, clip class
and frame-order realness). Their networks are :mod:`vgen.models.classifier`'s; this module loads the weights
shipped inside the package."""

from __future__ import annotations

from vgen.hub import ASSETS, from_pretrained
from vgen.models.classifier import AttributeClassifier, ShapesClassifier, ShapesVideoClassifier

SHIPPED_CLASSIFIER = "shapes-classifier"
SHIPPED_VIDEO_CLASSIFIER = "shapes-video-classifier"
SHIPPED_SCENE_JUDGE = "shapes-scene-judge"


def load_shapes_classifier() -> ShapesClassifier:
    """The domain classifier shipped inside the package (``vgen/assets/shapes-classifier``)."""
    return from_pretrained(ASSETS / SHIPPED_CLASSIFIER)


def load_shapes_video_classifier() -> ShapesVideoClassifier:
    """The video feature network shipped inside the package (``vgen/assets/shapes-video-classifier``)."""
    return from_pretrained(ASSETS / SHIPPED_VIDEO_CLASSIFIER)


def load_scene_judge() -> AttributeClassifier:
    """The judge of prompt faithfulness shipped inside the package (``vgen/assets/shapes-scene-judge``): shape,
    colour, size, place and background of a captioned scene."""
    return from_pretrained(ASSETS / SHIPPED_SCENE_JUDGE)
