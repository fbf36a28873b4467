"""benchmarks/gpu_check_t2i.sh, dry-run on the CPU: its speed step times AR, mcsjd and lantern on tiny models of both
text-to-image families at batch 1 and 8, its t2i_mllm step on tiny models of the two families with fixed tokens
(Emu3, Lumina-mGPT) at batch 1 and 4, their rows capped (benchmarks/t2i_speed.py --tiny), and each returns its tables
in a handful of files; a step it does not know stops it before any work."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu_check_t2i.sh"


def run(tmp_path: Path, *steps: str, **env: str) -> subprocess.CompletedProcess:
    settings = dict(OUT=str(tmp_path / "out"), PYTHON=sys.executable, T2I_SPEED_ARGS="--tiny --device cpu --dtype fp32",
                    **env)
    return subprocess.run(["bash", str(SCRIPT), *steps], env={**os.environ, **settings}, capture_output=True,
                          text=True, timeout=600)


def test_the_speed_step_writes_a_table_of_every_model_batch_and_sampler(tmp_path) -> None:
    out = run(tmp_path, "t2i_speed")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    files = sorted(f.name for f in (tmp_path / "out").iterdir())
    assert files == ["summary.log", "t2i_speed.json", "t2i_speed.log", "t2i_speed.md"]  # a device returns <= 8
    result = json.loads((tmp_path / "out" / "t2i_speed.json").read_text())
    assert result["tiny"] and result["repeats"] == 1 and "random weights" in result["note"]
    rows = {(r["model"], r["batch"], r["sampler"]): r for r in result["rows"]}
    assert set(rows) == {(m, b, s) for m in ("llamagen-t2i", "janus-pro-1b") for b in (1, 8)
                         for s in ("ar", "mcsjd", "lantern")}
    for (model, batch, _), r in rows.items():
        ar = rows[model, batch, "ar"]
        assert r["forward_passes"] <= ar["forward_passes"] == 16  # tiny grids of 4 x 4 tokens
        assert r["step_compression"] == ar["forward_passes"] / r["forward_passes"]
        assert r["speed_vs_ar"] == ar["wall_s"] / r["wall_s"] and r["wall_s"] > 0
    table = (tmp_path / "out" / "t2i_speed.md").read_text()
    assert "random weights" in table and table.count("| janus-pro-1b |") == 6
    assert "t2i_speed" in (tmp_path / "out" / "summary.log").read_text().splitlines()[-1]
    assert " ok " in (tmp_path / "out" / "summary.log").read_text().splitlines()[-1]


def test_an_unknown_step_is_refused_before_any_work(tmp_path) -> None:
    out = run(tmp_path, "speed")
    assert out.returncode == 99 and "unknown step 'speed'" in out.stderr
    assert "t2i_speed t2i_mllm t2i_tests" in out.stderr
    assert not (tmp_path / "out" / "summary.log").exists()


def test_the_mllm_step_times_emu3_and_lumina_on_their_first_rows_of_codes_with_peak_memory(tmp_path) -> None:
    out = run(tmp_path, "t2i_mllm", T2I_MLLM_ROWS="2")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert sorted(f.name for f in (tmp_path / "out" / "t2i_mllm").iterdir()) == ["t2i_speed.json", "t2i_speed.md"]
    result = json.loads((tmp_path / "out" / "t2i_mllm" / "t2i_speed.json").read_text())
    assert result["tiny"] and result["rows_cap"] == 2
    rows = {(r["model"], r["batch"], r["sampler"]): r for r in result["rows"]}
    assert set(rows) == {(m, b, s) for m in ("emu3-gen", "lumina-mgpt-7b") for b in (1, 4)
                         for s in ("ar", "mcsjd", "lantern")}
    for (model, batch, _), r in rows.items():
        ar = rows[model, batch, "ar"]
        assert r["grid"] == [2, 4] and ar["forward_passes"] == 8  # 2 of the tiny 4 x 4 codes' rows, codes only
        assert r["forward_passes"] <= 8 and r["peak_memory_gib"] is None  # peak memory is a CUDA figure
    table = (tmp_path / "out" / "t2i_mllm" / "t2i_speed.md").read_text()
    assert table.count("| lumina-mgpt-7b | 2 x 4 |") == 6 and "peak memory |" in table
    assert "t2i_mllm" in (tmp_path / "out" / "summary.log").read_text().splitlines()[-1]
