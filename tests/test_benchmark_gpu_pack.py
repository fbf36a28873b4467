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
