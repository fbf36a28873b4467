"""benchmarks/tree_speed.py: the planner's pass cost fitted to a cost curve is free up to its knee and grows past it
by the node cost; and benchmarks/gpu_check.sh's tree step, dry-run on the CPU with tiny backbones, leaves a curve and
a sampler table per model and batch size in $OUT/tree_speed/."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu_check.sh"
DRY_RUN = ("--tiny --device cpu --dtype fp32 --compile-mode none --batch-sizes 1 2 --cost-repeats 2 --branches 0 4 31 "
           "--num-real 16")


def test_the_pass_cost_is_free_up_to_the_knee_and_grows_past_it_by_the_node_cost(benchmark_module,
                                                                                  monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "benchmarks"))  # it imports its sibling scripts
    fit = benchmark_module("tree_speed").fit_pass_cost
    flat = {t: 1 + 0.0002 * (t - 1) for t in (32, 64, 128, 256)}  # all <= 1.1
    result = fit({**flat, 320: 1 + 0.005 * 64, 384: 1.05, 472: 1 + 0.005 * 216})  # a cost past 1.1 ends the knee
    assert result["knee"] == result["free_nodes"] == 256
    assert result["node_cost"] == pytest.approx((0.32 * 64 + 0.05 * 128 + 1.08 * 216) / (64**2 + 128**2 + 216**2))
    assert result["linear_node_cost"] == pytest.approx(0.0002)  # through (1, 1), up to the knee
    steep = fit({32: 1.5, 64: 2.0})  # no knee: every node costs, from the first
    assert steep["knee"] is None and steep["free_nodes"] == 1
    assert steep["node_cost"] == steep["linear_node_cost"] == pytest.approx((0.5 * 31 + 63) / (31**2 + 63**2))
    free = fit({32: 1.0, 472: 1.05})  # nothing past the knee: no slope to fit
    assert free["knee"] == free["free_nodes"] == 472 and free["node_cost"] is None


def test_the_tree_row_compiles_its_passes_without_branches_outside_cuda_graphs(benchmark_module,
                                                                             monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "benchmarks"))
    row_specs = benchmark_module("tree_speed").row_specs
    graphs = row_specs("reduce-overhead", (0.004, 128), [])
    assert graphs[:2] == ["ar-compiled=ar:compile=reduce-overhead", "mcsjd-compiled=mcsjd:compile=reduce-overhead"]
    assert graphs[2].startswith("tree-fit-compiled=mcsjd:") and graphs[2].endswith(",compile=default")
    assert "compile" not in graphs[3]  # tree-free: the step-count ceiling, eager
    assert all("compile" not in spec for spec in row_specs(None, (0.004, 128), []))


@pytest.mark.slow
def test_the_tree_step_writes_a_curve_and_a_table_per_model_and_batch(tmp_path) -> None:
    settings = dict(OUT=str(tmp_path / "out"), PYTHON=sys.executable, TREE_SPEED_ARGS=DRY_RUN, OMP_NUM_THREADS="1")
    out = subprocess.run(["bash", str(SCRIPT), "tree"], env={**os.environ, **settings}, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    folder = tmp_path / "out" / "tree_speed"
    assert sorted(f.name for f in folder.iterdir()) == ["tree_speed.json", "tree_speed.md"]
    result = json.loads((folder / "tree_speed.json").read_text())
    assert result["device"] == "cpu" and result["tiny"] and result["compile_mode"] == "none"
    runs = {(r["model"], r["batch"]): r for r in result["runs"]}
    assert list(runs) == [(m, b) for m in ("shapes-c2i", "llamagen-t2i") for b in (1, 2)]
    for (model, batch), run in runs.items():
        curve = run["curve"]
        assert curve["rows"] == 2 * batch  # both models guide: CFG rows
        nodes = [p["nodes"] for p in curve["points"]]
        assert nodes[0] == curve["window"] == (32 if model == "shapes-c2i" else 15)  # the chain; 16 tiny t2i tokens
        assert nodes == sorted(set(nodes)) and len(nodes) == 3 and all(p["cost"] > 0 for p in curve["points"])
        assert curve["free_nodes"] == (curve["knee"] or 1) and curve["knee"] in (None, *nodes)
        bench = run["bench"]
        assert bench["setup"]["reference"] == "ar" and bench["setup"]["batch_size"] == batch
        rows = {r["label"]: r for r in bench["results"]}
        assert list(rows) == ["ar", "mcsjd", "tree-fit", "tree-free"]
        node_cost, free_nodes = run["tree_pass_cost"]
        assert rows["tree-fit"]["options"] == {"window": 32, "candidates": 3, "branch_depth": 8,
                                               "node_cost": node_cost, "free_nodes": free_nodes}
        assert node_cost >= 1e-4 and free_nodes == curve["free_nodes"]
        assert rows["tree-free"]["options"] == {"window": 32, "candidates": 3, "branch_depth": 8, "node_cost": 0.001}
        for r in rows.values():
            assert r["forward_passes"] <= rows["ar"]["forward_passes"]
            assert r["latency_ratio"] == rows["ar"]["wall_time_s"] / r["wall_time_s"]
            assert r["tokens_per_forward"] >= 1 and r["mean_entropy_nats"] > 0 and 0 < r["median_top1_prob"] <= 1
            assert (r["class_accuracy"] is not None) == (r["fid"] is not None) == (model == "shapes-c2i")
    table = (folder / "tree_speed.md").read_text()
    assert "## llamagen-t2i, batch 2" in table and table.count("| tree-free | jacobi |") == 4
    assert "| branched columns | nodes | cost |" in table and "random weights" in table
    summary = (tmp_path / "out" / "summary.log").read_text().splitlines()
    assert summary[-1].split()[:2] == ["tree", "ok"]
