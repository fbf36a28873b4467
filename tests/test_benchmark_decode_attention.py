"""benchmarks/decode_attention.py: the two ways it times give the same attention for 1 and 16 queries, and its
table names each shape's four timings."""

import pytest
import torch


@pytest.fixture(scope="module")
def attention(benchmark_module):
    return benchmark_module("decode_attention")


@pytest.mark.parametrize("queries", [1, 16])
def test_the_timed_products_are_the_kernels_attention(attention, queries):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 8, n, 32, generator=g) for n in (queries, 40, 40))
    torch.testing.assert_close(attention.single_query_attention(q, k, v), attention.kernel(q, k, v))


def test_a_shape_is_timed_four_ways_and_tabled(attention):
    row = attention.measure(keys=8, queries=1, dtype=torch.float32, repeats=2, heads=2, head_dim=8)
    assert {key for key in row if key.endswith("_us")} == {"kernel_eager_us", "products_eager_us",
                                                            "kernel_compiled_us", "products_compiled_us"}
    assert all(row[key] > 0 for key in row if key.endswith("_us"))
    table = attention.markdown({"threads": 1, "rows": 2, "keys": 8, "repeats": 2, "shapes": [row]})
    assert table.splitlines()[-1].startswith("| 1 | float32 | ")
