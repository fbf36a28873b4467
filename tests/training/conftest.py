"""Fixtures of the training tests."""

from __future__ import annotations

import pytest
import torch

from vgen.hub import save_pretrained
from vgen.tokenizers.vq import VQConfig, VQModel


@pytest.fixture(scope="session")
def tiny_vq_dir(tmp_path_factory):
    """A saved random downsample-4 VQ with 32 codes: the frozen tokenizer of toy token-model runs."""
    torch.manual_seed(0)
    vq = VQModel(VQConfig(codebook_size=32, ch=8, ch_mult=(1, 2, 2), num_res_blocks=1, z_channels=8, norm_groups=4))
    return save_pretrained(vq, tmp_path_factory.mktemp("vq") / "vq")
