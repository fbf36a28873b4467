"""Inception-v3 for FID: the TensorFlow 2015-12-05 graph as torch-fidelity, torchmetrics and pytorch-fid run it.

The architecture is torchvision's Inception-v3 patched to match the TF graph (pytorch-fid's FIDInceptionA/C/E
blocks): average pools that ignore padding, a max pool in the last block's pool branch, BatchNorm eps 1e-3 and a
1008-way classifier. Parameter names follow torch-fidelity's ``FeatureExtractorInceptionV3``, which are also
pytorch-fid's, so ``pt_inception-2015-12-05-6726825d.pth`` and ``weights-inception-2015-12-05-6726825d.pth`` (the
same file) load unchanged. Input handling is torch-fidelity's: uint8 images, TensorFlow-1 bilinear resize to
299x299 (``align_corners=False``, no half-pixel offset), then ``(x - 128) / 128``. Features: pool3, 2048-d.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from vgen.eval.weights import WeightsSpec, load_into, load_state_dict

FID_INCEPTION_WEIGHTS = WeightsSpec(
    title="Inception-v3 FID weights (TF inception-2015-12-05 as converted by pytorch-fid / torch-fidelity)",
    filenames=("pt_inception-2015-12-05-6726825d.pth", "weights-inception-2015-12-05-6726825d.pth"),
    sha256="6726825d0af5f729cebd5821db510b11b1cfad8faad88a03f1befd49fb9129b2",
    source="https://github.com/mseitzer/pytorch-fid/releases/download/fid_weights/"
           "pt_inception-2015-12-05-6726825d.pth (the same file as torch-fidelity's v0.2.0 release asset)",
)
INPUT_SIZE = 299


def resize_bilinear_tf1(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """TensorFlow 1's ``resize_bilinear`` with ``align_corners=False`` on [B, C, H, W] floats.

    Output pixel i samples the input at ``i * in / out`` (no half-pixel offset, unlike ``F.interpolate``), between
    floor and the next pixel clamped to the border. Positions are computed in float32, as TF does.
    """
    def axis(n_in: int, n_out: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        pos = torch.arange(n_out, dtype=torch.float32, device=x.device) * torch.tensor(n_in / n_out)
        lo = pos.long()
        return lo, (lo + 1).clamp_max(n_in - 1), (pos - lo.float()).to(x.dtype)

    ylo, yhi, dy = axis(x.shape[2], size[0])
    xlo, xhi, dx = axis(x.shape[3], size[1])
    top, bottom = x[:, :, ylo], x[:, :, yhi]
    top = top[..., xlo] + (top[..., xhi] - top[..., xlo]) * dx
    bottom = bottom[..., xlo] + (bottom[..., xhi] - bottom[..., xlo]) * dx
    return top + (bottom - top) * dy[:, None]


class BasicConv2d(nn.Module):
    """Convolution without bias, BatchNorm (eps 1e-3, as in the TF graph), ReLU."""

    def __init__(self, cin: int, cout: int, kernel_size, stride=1, padding=0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel_size, stride, padding, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


def _avg_pool(x: torch.Tensor) -> torch.Tensor:
    return F.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False)  # TF averages over real pixels only


class InceptionA(nn.Module):
    def __init__(self, cin: int, pool_features: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 64, 1)
        self.branch5x5_1 = BasicConv2d(cin, 48, 1)
        self.branch5x5_2 = BasicConv2d(48, 64, 5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, 64, 1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, 3, padding=1)
        self.branch_pool = BasicConv2d(cin, pool_features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch1x1(x), self.branch5x5_2(self.branch5x5_1(x)),
                          self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x))),
                          self.branch_pool(_avg_pool(x))], 1)


class InceptionB(nn.Module):
    def __init__(self, cin: int) -> None:
        super().__init__()
        self.branch3x3 = BasicConv2d(cin, 384, 3, stride=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, 64, 1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch3x3(x), self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x))),
                          F.max_pool2d(x, 3, stride=2)], 1)


class InceptionC(nn.Module):
    def __init__(self, cin: int, c7: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 192, 1)
        self.branch7x7_1 = BasicConv2d(cin, c7, 1)
        self.branch7x7_2 = BasicConv2d(c7, c7, (1, 7), padding=(0, 3))
        self.branch7x7_3 = BasicConv2d(c7, 192, (7, 1), padding=(3, 0))
        self.branch7x7dbl_1 = BasicConv2d(cin, c7, 1)
        self.branch7x7dbl_2 = BasicConv2d(c7, c7, (7, 1), padding=(3, 0))
        self.branch7x7dbl_3 = BasicConv2d(c7, c7, (1, 7), padding=(0, 3))
        self.branch7x7dbl_4 = BasicConv2d(c7, c7, (7, 1), padding=(3, 0))
        self.branch7x7dbl_5 = BasicConv2d(c7, 192, (1, 7), padding=(0, 3))
        self.branch_pool = BasicConv2d(cin, 192, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        d7 = x
        for i in range(1, 6):
            d7 = getattr(self, f"branch7x7dbl_{i}")(d7)
        return torch.cat([self.branch1x1(x), b7, d7, self.branch_pool(_avg_pool(x))], 1)


class InceptionD(nn.Module):
    def __init__(self, cin: int) -> None:
        super().__init__()
        self.branch3x3_1 = BasicConv2d(cin, 192, 1)
        self.branch3x3_2 = BasicConv2d(192, 320, 3, stride=2)
        self.branch7x7x3_1 = BasicConv2d(cin, 192, 1)
        self.branch7x7x3_2 = BasicConv2d(192, 192, (1, 7), padding=(0, 3))
        self.branch7x7x3_3 = BasicConv2d(192, 192, (7, 1), padding=(3, 0))
        self.branch7x7x3_4 = BasicConv2d(192, 192, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b7 = x
        for i in range(1, 5):
            b7 = getattr(self, f"branch7x7x3_{i}")(b7)
        return torch.cat([self.branch3x3_2(self.branch3x3_1(x)), b7, F.max_pool2d(x, 3, stride=2)], 1)


class InceptionE(nn.Module):
    """The last two blocks; the TF graph pools the pool branch with an average in the first, a max in the second."""

    def __init__(self, cin: int, pool: str) -> None:
        super().__init__()
        self.pool = pool
        self.branch1x1 = BasicConv2d(cin, 320, 1)
        self.branch3x3_1 = BasicConv2d(cin, 384, 1)
        self.branch3x3_2a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv2d(cin, 448, 1)
        self.branch3x3dbl_2 = BasicConv2d(448, 384, 3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch_pool = BasicConv2d(cin, 192, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3_1(x)
        d3 = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        pooled = _avg_pool(x) if self.pool == "avg" else F.max_pool2d(x, 3, stride=1, padding=1)
        return torch.cat([self.branch1x1(x), self.branch3x3_2a(b3), self.branch3x3_2b(b3),
                          self.branch3x3dbl_3a(d3), self.branch3x3dbl_3b(d3), self.branch_pool(pooled)], 1)


class FIDInceptionV3(nn.Module):
    """uint8 images [B, 3, H, W] (any size) -> pool3 features [B, 2048] float32. Always runs in eval mode."""

    num_features = 2048  # read by torchmetrics' FrechetInceptionDistance for a custom feature module

    def __init__(self) -> None:
        super().__init__()
        self.Conv2d_1a_3x3 = BasicConv2d(3, 32, 3, stride=2)
        self.Conv2d_2a_3x3 = BasicConv2d(32, 32, 3)
        self.Conv2d_2b_3x3 = BasicConv2d(32, 64, 3, padding=1)
        self.Conv2d_3b_1x1 = BasicConv2d(64, 80, 1)
        self.Conv2d_4a_3x3 = BasicConv2d(80, 192, 3)
        self.Mixed_5b = InceptionA(192, 32)
        self.Mixed_5c = InceptionA(256, 64)
        self.Mixed_5d = InceptionA(288, 64)
        self.Mixed_6a = InceptionB(288)
        self.Mixed_6b = InceptionC(768, 128)
        self.Mixed_6c = InceptionC(768, 160)
        self.Mixed_6d = InceptionC(768, 160)
        self.Mixed_6e = InceptionC(768, 192)
        self.Mixed_7a = InceptionD(768)
        self.Mixed_7b = InceptionE(1280, pool="avg")
        self.Mixed_7c = InceptionE(2048, pool="max")
        self.fc = nn.Linear(2048, 1008)  # the TF graph's logits; kept so the reference file loads strictly
        self.eval()

    def train(self, mode: bool = True) -> FIDInceptionV3:
        return super().train(False)  # BatchNorm must use the stored statistics (pytorch-fid issue #118)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"expected uint8 images [B, 3, H, W], got {images.dtype} {tuple(images.shape)}")
        x = resize_bilinear_tf1(images.float(), (INPUT_SIZE, INPUT_SIZE))
        x = (x - 128) / 128
        x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
        x = F.max_pool2d(x, 3, stride=2)
        x = F.max_pool2d(self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x)), 3, stride=2)
        for name in ("5b", "5c", "5d", "6a", "6b", "6c", "6d", "6e", "7a", "7b", "7c"):
            x = getattr(self, f"Mixed_{name}")(x)
        return x.mean(dim=(2, 3))


def load_fid_inception(path: str | Path) -> FIDInceptionV3:
    """The FID Inception with the weights of ``path`` (reference key layout; .pth/.pt or .safetensors)."""
    model = FIDInceptionV3()
    load_into(model, load_state_dict(path), "the FID Inception-v3 (torch-fidelity / pytorch-fid key layout)")
    return model.requires_grad_(False)
