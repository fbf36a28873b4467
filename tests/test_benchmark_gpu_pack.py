"""benchmarks/gpu_pack.sh's use_carried_wheels: wheels carried with a device call are installed ahead of the
machine's own packages, and without any it changes nothing."""

import subprocess
import sys
import zipfile
from pathlib import Path

PACK = Path(__file__).parents[1] / "benchmarks" / "gpu_pack.sh"


def make_wheel(folder: Path) -> Path:
    """A minimal pure-Python wheel of a module ``carried_probe``."""
    folder.mkdir(parents=True)
    path = folder / "carried_probe-1.0-py3-none-any.whl"
    dist = "carried_probe-1.0.dist-info"
    files = {"carried_probe.py": "WHERE = 'carried'\n",
             f"{dist}/METADATA": "Metadata-Version: 2.1\nName: carried-probe\nVersion: 1.0\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{dist}/RECORD"])
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return path


def run_with_wheels(wheels: Path, site: Path) -> subprocess.CompletedProcess:
    script = (f'source "{PACK}"; WHEELS="{wheels}" WHEEL_SITE="{site}" use_carried_wheels && '
              'echo "path=$PYTHONPATH" && python3 -c "import carried_probe; print(carried_probe.WHERE)"')
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120,
                          env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"})


def test_carried_wheels_are_installed_ahead_of_the_machines_packages(tmp_path):
    out = run_with_wheels(make_wheel(tmp_path / "whl").parent, tmp_path / "site")
    assert out.returncode == 0, out.stderr
    assert f"path={tmp_path / 'site'}\n" in out.stdout and out.stdout.strip().endswith("carried")


def test_without_carried_wheels_nothing_changes(tmp_path):
    out = run_with_wheels(tmp_path / "none", tmp_path / "site")
    assert "path=\n" in out.stdout and "No module named 'carried_probe'" in out.stderr


FAKE_TRAIN = """import json, sys
from pathlib import Path
args = sys.argv[1:]
flag = lambda name, default=None: args[args.index(name) + 1] if name in args else default
run = Path(flag("--run-dir"))
with open(run.parent / "calls.txt", "a") as f:
    f.write(" ".join(args) + "\\n")
log_every, steps = int(flag("--log-every", 25)), int(flag("--steps"))
state = run / "checkpoints" / "step-0" / "state.json"
start = json.loads(state.read_text())["step"] if state.exists() else 0
end = min(steps, start + 40)  # 40 steps a call, 0.1 s each
with open(run / "log.jsonl", "a") as f:
    for step in range(start + 1, end + 1):
        if step % log_every == 0:
            f.write(json.dumps({"step": step, "time": 1000.0 + 0.1 * step}) + "\\n")
state.parent.mkdir(parents=True, exist_ok=True)
state.write_text(json.dumps({"step": end}))
(run / "latest").write_text("step-0")
"""


def test_train_until_probes_with_frequent_log_records_and_lays_the_schedule_over_the_time_left(tmp_path):
    """A slow device logs fewer than two default (25-step) records in its probe; the probe logs every 5 steps,
    so the resume's schedule comes from the measured speed (10 steps a second), not the step cap."""
    (tmp_path / "run").mkdir()
    (tmp_path / "fake_train.py").write_text(FAKE_TRAIN)
    script = (f'source "{PACK}"; PROBE_S=1 RESTART_S=0 train_until $(( $(date +%s) + 30 )) 100000 '
              f'"{tmp_path / "run"}" python3 "{tmp_path / "fake_train.py"}" --run-dir "{tmp_path / "run"}"')
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120,
                         env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
                              "PYTHONPATH": str(PACK.parents[1])})
    assert out.returncode == 0, out.stderr
    probe, resume = (tmp_path / "calls.txt").read_text().splitlines()
    assert "--steps 100000 --log-every 5" in probe and "--log-every" not in resume
    steps = int(resume.split("--steps ")[1].split()[0])
    assert 40 + 10 * 25 <= steps <= 40 + 10 * 30, steps  # about 30 s left at 10 steps a second
    assert "--override-config" in resume
