"""Domain classifier for the shapes data: judges whether an image shows the requested class.

A small VGG-style CNN on 64x64 images. Its pooled 192-d activations are vgen's offline features for FID on the
shapes domain (no Inception weights needed); its predictions give the class accuracy of generated samples.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ClassifierConfig:
    num_classes: int = 8
    widths: tuple[int, ...] = (24, 48, 96, 192)
    image_size: int = 64

    def __post_init__(self) -> None:
        object.__setattr__(self, "widths", tuple(self.widths))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["widths"] = list(self.widths)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ClassifierConfig:
        return cls(**d)


def _conv(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


class ShapesClassifier(nn.Module):
    """Images in [-1, 1], [B, 3, H, W] -> class logits; :meth:`features` gives the pooled embedding."""

    def __init__(self, config: ClassifierConfig = ClassifierConfig()) -> None:
        super().__init__()
        self.config = config
        layers: list[nn.Module] = []
        cin = 3
        for i, w in enumerate(config.widths):
            layers += _conv(cin, w) + _conv(w, w)
            if i < len(config.widths) - 1:
                layers.append(nn.MaxPool2d(2))
            cin = w
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(cin, config.num_classes)

    @property
    def feature_dim(self) -> int:
        return self.config.widths[-1]

    def features(self, images: torch.Tensor) -> torch.Tensor:
        return self.body(images).mean(dim=(2, 3))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images))

    @torch.no_grad()
    def predict(self, images: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
        """Class ids for images in [-1, 1] (any batch size, evaluated in chunks)."""
        self.eval()
        return torch.cat([self(images[i:i + batch_size]).argmax(-1) for i in range(0, len(images), batch_size)])


SHIPPED_CLASSIFIER = "shapes-classifier"


def load_shapes_classifier() -> ShapesClassifier:
    """The domain classifier shipped inside the package (``vgen/assets/shapes-classifier``)."""
    from vgen.hub import from_pretrained
    from vgen.pipelines import ASSETS

    return from_pretrained(ASSETS / SHIPPED_CLASSIFIER)
