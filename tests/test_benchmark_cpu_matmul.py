"""benchmarks/cpu_matmul.py: every weight shape is timed at every row count through both libraries, whose results
agree to rounding, and the table has one cell per row count."""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


def test_each_shape_and_row_count_is_timed_through_both_libraries(benchmark_module):
    matmul = benchmark_module("cpu_matmul")
    results = matmul.measure(repeats=2, shapes=((8, 16), (16, 8)), row_counts=(1, 4, 32))
    assert [(r["in"], r["out"], r["rows"]) for r in results] == [
        (8, 16, 1), (8, 16, 4), (8, 16, 32), (16, 8, 1), (16, 8, 4), (16, 8, 32)]
    for r in results:
        assert r["mkl_us"] > 0 and r["onednn_us"] > 0 and r["max_abs_diff"] < 1e-4
        assert r["mkl_gflops"] == pytest.approx(2 * r["rows"] * r["in"] * r["out"] / r["mkl_us"] / 1e3)
        assert r["onednn_speedup"] == pytest.approx(r["mkl_us"] / r["onednn_us"])
    table = matmul.markdown(results, "setup")
    assert "| weight (in x out) | 1 rows | 4 rows | 32 rows |" in table
    assert sum(line.startswith("| 8 x 16 |") or line.startswith("| 16 x 8 |") for line in table.splitlines()) == 2
