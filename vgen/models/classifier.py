"""The shapes domain's judge networks: a small VGG-style CNN on 64x64 images (class logits, and pooled 192-d
features for FID on the shapes domain) and a 3-D CNN on clips (class and frame-order realness logits, and pooled
features for FVD). Their shipped weights and loaders are :mod:`vgen.eval.classifier`'s."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vgen.models.backbone import GRID_LIMIT
from vgen.models.config_fields import ModelConfig, size
from vgen.models.linear import Linear


@dataclass(frozen=True)
class ClassifierConfig(ModelConfig):
    """The classes, the widths of the conv stages (2x max-pooled between them) and the image side it expects."""

    num_classes: int = size(8)
    widths: tuple[int, ...] = size((24, 48, 96, 192))
    image_size: int = size(64, at_most=GRID_LIMIT)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_pooling(self.widths, self.image_size)


def check_pooling(widths: tuple[int, ...], image_size: int) -> None:
    """Refuse more conv stages than an image of ``image_size`` can be halved between (the last sees >= 1 pixel)."""
    if 2 ** (len(widths) - 1) > image_size:
        raise ValueError(f"{len(widths)} widths halve an image {len(widths) - 1} times, more than image_size "
                         f"{image_size} allows")


def _conv(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


def _vgg_body(widths: tuple[int, ...]) -> nn.Sequential:
    """Two 3x3 conv-BN-ReLU layers per width, 2x max-pooled between widths."""
    layers: list[nn.Module] = []
    cin = 3
    for i, w in enumerate(widths):
        layers += _conv(cin, w) + _conv(w, w)
        if i < len(widths) - 1:
            layers.append(nn.MaxPool2d(2))
        cin = w
    return nn.Sequential(*layers)


class ShapesClassifier(nn.Module):
    """Images in [-1, 1], [B, 3, H, W] -> class logits; :meth:`features` gives the pooled embedding."""

    def __init__(self, config: ClassifierConfig = ClassifierConfig()) -> None:
        super().__init__()
        self.config = config
        self.body = _vgg_body(config.widths)
        self.head = Linear(config.widths[-1], config.num_classes)

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


POOLED_GRID = 3
"""The attribute judge pools its last feature map to POOLED_GRID x POOLED_GRID cells."""


@dataclass(frozen=True)
class AttributeClassifierConfig(ModelConfig):
    """One head per attribute: ``attributes`` lists (name, number of values) in order."""

    attributes: tuple[tuple[str, int], ...] = size(at_least=2)
    widths: tuple[int, ...] = size((24, 48, 96, 192))
    image_size: int = size(64, at_most=GRID_LIMIT)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_pooling(self.widths, self.image_size)
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"attributes has repeated names: {list(self.names)}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.attributes)


class AttributeClassifier(nn.Module):
    """Images in [-1, 1], [B, 3, H, W] -> one logit vector per attribute (shape, colour, place, ...): the judge of
    whether a text-to-image sample shows what its prompt asked for."""

    def __init__(self, config: AttributeClassifierConfig) -> None:
        super().__init__()
        self.config = config
        self.body = _vgg_body(config.widths)
        features = config.widths[-1] * POOLED_GRID ** 2
        self.heads = nn.ModuleDict({name: Linear(features, k) for name, k in config.attributes})

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        # places matter, so the features are pooled to a coarse grid rather than to one vector
        features = nn.functional.adaptive_avg_pool2d(self.body(images), POOLED_GRID).flatten(1)
        return {name: head(features) for name, head in self.heads.items()}

    @torch.no_grad()
    def predict(self, images: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
        """Attribute values [N, A] (in ``config.names`` order) for images in [-1, 1]."""
        self.eval()
        out = []
        for i in range(0, len(images), batch_size):
            logits = self(images[i:i + batch_size])
            out.append(torch.stack([logits[name].argmax(-1) for name in self.config.names], dim=1))
        return torch.cat(out)


@dataclass(frozen=True)
class VideoClassifierConfig(ModelConfig):
    """Stages of 3-D convolutions (``stages[i]`` lists the widths of stage i's convs); after every stage but the
    last, clips are max-pooled 2x in time and space. ``image_size`` is the frame side
    it expects (frames of another size are resized), ``num_frames`` the clip length it was trained on."""

    num_classes: int = size(8)
    stages: tuple[tuple[int, ...], ...] = size(((16,), (32,), (64, 64), (128,)))
    image_size: int = size(32, at_most=GRID_LIMIT)
    num_frames: int = size(16, at_most=GRID_LIMIT)


def _conv3d(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv3d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm3d(cout), nn.ReLU(inplace=True)]


class ShapesVideoClassifier(nn.Module):
    """Clips in [-1, 1], [B, 3, T, H, W] -> (class logits [B, C], realness logit [B]).

    Two heads share the pooled embedding (:meth:`features`, vgen's offline FVD features for the moving-shapes
    clips): the clip's shape class, and whether its frames are in a real temporal order (not shuffled, frozen or
    stuttering). The second head makes the embedding see motion, which a per-frame feature averaged over time cannot.
    """

    def __init__(self, config: VideoClassifierConfig = VideoClassifierConfig()) -> None:
        super().__init__()
        self.config = config
        layers: list[nn.Module] = []
        cin = 3
        for i, widths in enumerate(config.stages):
            for w in widths:
                layers += _conv3d(cin, w)
                cin = w
            if i < len(config.stages) - 1:
                layers.append(nn.MaxPool3d(2, ceil_mode=True))
        self.body = nn.Sequential(*layers)
        self.head = Linear(cin, config.num_classes)
        self.realness = Linear(cin, 1)

    @property
    def feature_dim(self) -> int:
        return self.config.stages[-1][-1]

    def features(self, clips: torch.Tensor) -> torch.Tensor:
        return self.body(clips).mean(dim=(2, 3, 4))

    def forward(self, clips: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.features(clips)
        return self.head(f), self.realness(f)[:, 0]

    @torch.no_grad()
    def predict(self, clips: torch.Tensor, batch_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        """(class ids, whether judged real) for clips in [-1, 1], evaluated in chunks."""
        self.eval()
        outs = [self(clips[i:i + batch_size]) for i in range(0, len(clips), batch_size)]
        return torch.cat([c.argmax(-1) for c, _ in outs]), torch.cat([r > 0 for _, r in outs])


SHAPES_VIDEO_CLASSIFIER = VideoClassifierConfig()  # the recipe's network: 16-frame clips of 32x32 pixels
