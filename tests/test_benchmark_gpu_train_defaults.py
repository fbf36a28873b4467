"""benchmarks/gpu_train_defaults.sh with stand-in scripts: it runs the two trainings side by side, each with its own
files and deadline, and packs what both wrote into parts that come back from a device, also when one is still
running at the deadline."""

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu_train_defaults.sh"


def stand_in(path: Path, sleep_s: float) -> Path:
    """A script that records the settings it was given in its OUT folder, as the real ones write their files."""
    path.write_text(f'mkdir -p "$OUT"; echo "run $RUN data $DATA end $TRAIN_END_S batch $BATCH" >"$OUT/summary.txt"\n'
                    f'echo weights >"$OUT/result.tar.part-00"; sleep {sleep_s}\n')
    return path


def test_both_trainings_run_with_their_own_files_and_come_back_as_one_packed_result(tmp_path, unpack_device_result):
    settings = dict(OUT=str(tmp_path / "out"), WORK=str(tmp_path / "work"), T2I_END_S="30", TRAIN_END_S="20",
                    DEADLINE_S="3", BATCH="7", T2I_SCRIPT=str(stand_in(tmp_path / "t2i.sh", 0)),
                    CONTINUOUS_SCRIPT=str(stand_in(tmp_path / "continuous.sh", 10)))
    out = subprocess.run(["bash", str(SCRIPT)], env={**os.environ, **settings}, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    out_dir = tmp_path / "out"
    assert sorted(f.name for f in out_dir.iterdir()) == ["result.tar.part-00", "result.tar.sha256", "summary.txt"]
    summary = (out_dir / "summary.txt").read_text()
    work = tmp_path / "work"
    assert f"== t2i (exit 0)\nrun {work}/t2i/run data {work}/t2i/data end 30 batch 7" in summary
    continuous = f"run {work}/continuous/run data {work}/continuous/data end 20"
    assert f"== continuous (still running at 3s)\n{continuous}" in summary
    result = unpack_device_result(out_dir, tmp_path / "result")
    for name in ("t2i", "continuous"):
        assert (result / name / "result.tar.part-00").read_text() == "weights\n"
        assert (result / name / "script.log").exists()
