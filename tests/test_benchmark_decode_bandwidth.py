"""benchmarks/decode_bandwidth.py: a decode step is timed at the middle of the image with the cache cropped back
after every step, and the bytes it reads are the weights plus the keys and values up to its position."""

import pytest
import torch

from vgen.models.llamagen import GPTConfig, LlamaGenGPT


@pytest.fixture(scope="module")
def bandwidth(benchmark_module):
    return benchmark_module("decode_bandwidth")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_decode_step_reads_the_weights_and_half_the_cache(bandwidth, dtype):
    model = LlamaGenGPT(GPTConfig(vocab_size=64, dim=32, n_layer=2, n_head=4, num_classes=3, block_size=16)).eval()
    model = model.to(dtype)
    seconds, kv = bandwidth.decode_step(model, rows=2, repeats=3)
    assert seconds > 0
    size = 2 if dtype == torch.bfloat16 else 4
    # keys and values of 2 layers, 2 rows, 4 heads of 8 channels, at the class position + 8 tokens + the new one
    assert kv == 2 * 2 * 2 * 4 * (1 + 8 + 1) * 8 * size
    assert bandwidth.model_bytes(model) == sum(p.numel() for p in model.parameters()) * size


def test_the_table_names_each_step_s_share_of_the_copy_bandwidth(bandwidth):
    result = {"threads": 2, "rows": 2, "copy_gbps": 10.0, "greedy_bf16_agreement": 0.75, "agreement_images": 4,
              "steps": [{"model": "m", "dtype": "bf16", "step_ms": 2.0, "weight_mb": 10.0, "kv_mb": 0.5,
                         "achieved_gbps": 5.25, "share_of_copy": 0.525}]}
    table = bandwidth.markdown(result)
    assert "| m | bf16 | 2.00 | 10.0 | 0.50 | 5.2 | 52% |" in table
    assert "copy bandwidth 10.0 GB/s" in table and "75.0% (4 images)" in table
