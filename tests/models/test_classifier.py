"""The shapes judge networks: logits and features of the documented shapes, chunked prediction equal to one
batch, and configs that round-trip through their dicts."""

from __future__ import annotations

import torch

from vgen.models.classifier import (
    SHAPES_VIDEO_CLASSIFIER,
    ClassifierConfig,
    ShapesClassifier,
    ShapesVideoClassifier,
    VideoClassifierConfig,
)


def test_image_classifier_gives_logits_and_features_of_its_widths() -> None:
    torch.manual_seed(0)
    model = ShapesClassifier(ClassifierConfig(num_classes=5, widths=(4, 8), image_size=16)).eval()
    images = torch.rand(7, 3, 16, 16) * 2 - 1
    assert model(images).shape == (7, 5)
    assert model.features(images).shape == (7, 8) and model.feature_dim == 8
    assert torch.equal(model.predict(images, batch_size=3), model(images).argmax(-1))


def test_video_classifier_gives_class_and_realness_logits() -> None:
    torch.manual_seed(0)
    model = ShapesVideoClassifier(VideoClassifierConfig(num_classes=4, stages=((4,), (6, 8)), image_size=8,
                                                        num_frames=5)).eval()
    clips = torch.rand(5, 3, 5, 8, 8) * 2 - 1
    logits, realness = model(clips)
    assert logits.shape == (5, 4) and realness.shape == (5,)
    assert model.features(clips).shape == (5, 8) and model.feature_dim == 8
    classes, real = model.predict(clips, batch_size=2)
    assert torch.equal(classes, logits.argmax(-1)) and torch.equal(real, realness > 0)


def test_configs_round_trip_through_their_dicts() -> None:
    image = ClassifierConfig(widths=[4, 8])
    assert image.widths == (4, 8) and ClassifierConfig.from_dict(image.to_dict()) == image
    assert image.to_dict()["widths"] == [4, 8]
    assert VideoClassifierConfig.from_dict(SHAPES_VIDEO_CLASSIFIER.to_dict()) == SHAPES_VIDEO_CLASSIFIER
    assert SHAPES_VIDEO_CLASSIFIER.to_dict()["stages"] == [list(s) for s in SHAPES_VIDEO_CLASSIFIER.stages]
