"""I3D (Kinetics-400) for FVD: 16-frame clips at 224x224 in [-1, 1] -> the 400 pre-softmax logits, averaged over
time (the embedding the original TF FVD takes, ``RGB/inception_i3d/Mean:0``).

Two kinds of local file work:

- ``i3d_torchscript.pt``, StyleGAN-V's TorchScript port of the tf-hub model. It is called exactly as StyleGAN-V
  calls it: uint8 [B, 3, T, H, W] with ``rescale=True, resize=True, return_features=True``, so it rescales and
  resizes internally, and vgen's numbers are StyleGAN-V's. A TorchScript file is a program: loading and calling it
  runs the code inside it with the user's permissions, and no hash of the published file is known to check it
  against. So it runs only when the user says they trust it (``trust_torchscript=True``, ``--trust-torchscript``).
- A state dict in the pytorch-i3d key layout (``i3d_pretrained_400.pt``, the tf-hub weights as converted by
  VideoGPT / TATS and used by cd-fvd), read as tensors only (``torch.load(weights_only=True)``). It runs in
  :class:`InceptionI3d`, with TATS' and cd-fvd's preprocessing: ``F.interpolate`` bilinear
  (``align_corners=False``) to 224x224 per frame, then ``2x / 255 - 1``. (VideoGPT instead scales the short side
  to 224 and crops the centre; the two agree on square frames.)

The architecture is pytorch-i3d's: TensorFlow "SAME" padding computed from the input size, zero padding before
the max pools (their inputs are ReLU outputs, so this equals TF's), BatchNorm eps 1e-5 as in VideoGPT's / TATS'
port, a [2, 7, 7] average pool, a 1x1x1 logits convolution, and the mean over the remaining time steps.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vgen.eval.weights import WeightsError, WeightsSpec, is_torchscript, load_into, load_state_dict, sha256_of

I3D_TORCHSCRIPT = WeightsSpec(
    title="I3D Kinetics-400 TorchScript (StyleGAN-V's i3d_torchscript.pt)",
    filenames=("i3d_torchscript.pt",),
    sha256=None,  # no published hash found; results record the file's hash
    source="https://www.dropbox.com/s/ge9e5ujwgetktms/i3d_torchscript.pt (linked from StyleGAN-V's "
           "src/metrics/frechet_video_distance.py)",
)
I3D_STATE_DICT = WeightsSpec(
    title="I3D Kinetics-400 weights (pytorch-i3d layout, i3d_pretrained_400.pt from VideoGPT / TATS)",
    filenames=("i3d_pretrained_400.pt",),
    sha256=None,
    source="TATS' repository (tats/fvd/i3d_pretrained_400.pt), made by its convert_tf_pretrained.py from tf-hub "
           "deepmind/i3d-kinetics-400/1",
)
I3D_WEIGHTS = (I3D_TORCHSCRIPT, I3D_STATE_DICT)
NUM_FRAMES = 16
INPUT_SIZE = 224


def _same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    total = max(kernel - (stride if size % stride == 0 else size % stride), 0)
    return total // 2, total - total // 2


def _pad_same(x: torch.Tensor, kernel: tuple[int, int, int], stride: tuple[int, int, int]) -> torch.Tensor:
    t, h, w = (_same_padding(x.shape[2 + i], kernel[i], stride[i]) for i in range(3))
    return F.pad(x, (w[0], w[1], h[0], h[1], t[0], t[1]))


class Unit3D(nn.Module):
    """Conv3d with TF "SAME" padding, then BatchNorm and ReLU (the logits unit: bias, no norm, no activation)."""

    def __init__(self, cin: int, cout: int, kernel=(1, 1, 1), stride=(1, 1, 1), logits: bool = False) -> None:
        super().__init__()
        self.kernel, self.stride, self.logits = tuple(kernel), tuple(stride), logits
        self.conv3d = nn.Conv3d(cin, cout, self.kernel, self.stride, bias=logits)
        if not logits:
            self.bn = nn.BatchNorm3d(cout, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv3d(_pad_same(x, self.kernel, self.stride))
        return x if self.logits else F.relu(self.bn(x))


class MaxPool3dSame(nn.Module):
    def __init__(self, kernel: tuple[int, int, int], stride: tuple[int, int, int]) -> None:
        super().__init__()
        self.kernel, self.stride = kernel, stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool3d(_pad_same(x, self.kernel, self.stride), self.kernel, self.stride)


class InceptionModule(nn.Module):
    """Four branches: 1x1; 1x1 -> 3x3x3; 1x1 -> 3x3x3; 3x3x3 max pool -> 1x1 (pytorch-i3d's b0 ... b3b)."""

    def __init__(self, cin: int, widths: tuple[int, int, int, int, int, int]) -> None:
        super().__init__()
        self.b0 = Unit3D(cin, widths[0])
        self.b1a = Unit3D(cin, widths[1])
        self.b1b = Unit3D(widths[1], widths[2], (3, 3, 3))
        self.b2a = Unit3D(cin, widths[3])
        self.b2b = Unit3D(widths[3], widths[4], (3, 3, 3))
        self.b3a = MaxPool3dSame((3, 3, 3), (1, 1, 1))
        self.b3b = Unit3D(cin, widths[5])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b0(x), self.b1b(self.b1a(x)), self.b2b(self.b2a(x)), self.b3b(self.b3a(x))], 1)


class InceptionI3d(nn.Module):
    """Videos [B, 3, T, 224, 224] in [-1, 1] -> Kinetics-400 logits [B, 400], averaged over time."""

    num_features = 400

    def __init__(self, num_classes: int = 400) -> None:
        super().__init__()
        self.Conv3d_1a_7x7 = Unit3D(3, 64, (7, 7, 7), (2, 2, 2))
        self.MaxPool3d_2a_3x3 = MaxPool3dSame((1, 3, 3), (1, 2, 2))
        self.Conv3d_2b_1x1 = Unit3D(64, 64)
        self.Conv3d_2c_3x3 = Unit3D(64, 192, (3, 3, 3))
        self.MaxPool3d_3a_3x3 = MaxPool3dSame((1, 3, 3), (1, 2, 2))
        self.Mixed_3b = InceptionModule(192, (64, 96, 128, 16, 32, 32))
        self.Mixed_3c = InceptionModule(256, (128, 128, 192, 32, 96, 64))
        self.MaxPool3d_4a_3x3 = MaxPool3dSame((3, 3, 3), (2, 2, 2))
        self.Mixed_4b = InceptionModule(480, (192, 96, 208, 16, 48, 64))
        self.Mixed_4c = InceptionModule(512, (160, 112, 224, 24, 64, 64))
        self.Mixed_4d = InceptionModule(512, (128, 128, 256, 24, 64, 64))
        self.Mixed_4e = InceptionModule(512, (112, 144, 288, 32, 64, 64))
        self.Mixed_4f = InceptionModule(528, (256, 160, 320, 32, 128, 128))
        self.MaxPool3d_5a_2x2 = MaxPool3dSame((2, 2, 2), (2, 2, 2))
        self.Mixed_5b = InceptionModule(832, (256, 160, 320, 32, 128, 128))
        self.Mixed_5c = InceptionModule(832, (384, 192, 384, 48, 128, 128))
        self.logits = Unit3D(1024, num_classes, logits=True)
        self.eval()

    def train(self, mode: bool = True) -> InceptionI3d:
        return super().train(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for module in list(self.children())[:-1]:
            x = module(x)
        x = self.logits(F.avg_pool3d(x, (2, 7, 7), stride=1))
        return x.mean(dim=(3, 4)).mean(dim=2)


def preprocess(videos: torch.Tensor, size: int = INPUT_SIZE) -> torch.Tensor:
    """uint8 videos [B, T, H, W, 3] -> float [B, 3, T, size, size] in [-1, 1], each frame resized to size x size
    (TATS / cd-fvd)."""
    b, t, h, w, c = videos.shape
    frames = videos.reshape(b * t, h, w, c).permute(0, 3, 1, 2).float()
    frames = F.interpolate(frames, size=(size, size), mode="bilinear", align_corners=False)
    return (frames.reshape(b, t, c, size, size).transpose(1, 2) * (2 / 255) - 1).contiguous()


class I3DFeatures:
    """uint8 videos [N, T, H, W, 3] -> float64 [N, 400] from either kind of weights file; a TorchScript file only
    with ``trust_torchscript`` (it is code)."""

    num_features = 400

    def __init__(self, path: str | Path, device: str | torch.device = "cpu", trust_torchscript: bool = False) -> None:
        self.device = torch.device(device)
        self.torchscript = is_torchscript(path)
        if self.torchscript:
            if not trust_torchscript:
                raise WeightsError(f"{path} is a TorchScript file (SHA-256 {sha256_of(path)}): loading it runs the "
                                   f"code inside it with your permissions; pass --trust-torchscript "
                                   f"(trust_torchscript=True) only if you trust where it came from")
            try:
                self.model = torch.jit.load(str(path), map_location=self.device).eval()
            except Exception as e:
                raise WeightsError(f"cannot load TorchScript {path}: {str(e).splitlines()[0]}") from e
        else:
            model = InceptionI3d()
            load_into(model, load_state_dict(path), "I3D (pytorch-i3d key layout, 400 classes)")
            self.model = model.requires_grad_(False).to(self.device)

    @torch.no_grad()
    def __call__(self, videos: np.ndarray, batch_size: int = 8) -> np.ndarray:
        out = []
        for i in range(0, len(videos), batch_size):
            clip = torch.from_numpy(np.ascontiguousarray(videos[i:i + batch_size])).to(self.device)
            if self.torchscript:  # StyleGAN-V: uint8 [B, C, T, H, W]; the script rescales and resizes
                logits = self.model(clip.permute(0, 4, 1, 2, 3).contiguous(), rescale=True, resize=True,
                                    return_features=True)
            else:
                logits = self.model(preprocess(clip))
            out.append(logits.double().cpu().numpy())
        return np.concatenate(out)
