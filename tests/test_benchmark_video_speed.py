"""benchmarks/video_speed.py: run as a script on a saved video pipeline, it times the pipeline and a next-token GPT
twin over the same frames, and with --num-frames beyond the window the pipeline draws window by window while the
twin covers every frame."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "video_speed.py"


def test_longer_clips_are_timed_window_by_window_against_a_twin_over_all_frames(tiny_video_pipeline_dir,
                                                                               tmp_path) -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "--models", str(tiny_video_pipeline_dir), "--num-frames", "5",
                          "--batch", "2", "--repeats", "1", "--threads", "1", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "video_speed.json").read_text())
    assert report["frames"] == 5 and report["tokens"] == 5 * 16
    nbp, ar = report["rows"][str(tiny_video_pipeline_dir)], report["rows"]["next-token AR (random weights)"]
    assert nbp["forward_passes"] == 3 + 2  # a 3-frame window, then one of 2 new frames after 1 given
    assert ar["forward_passes"] == 5 * 16 and 0 <= nbp["class_accuracy"] <= 1
    assert nbp["pass_ratio_vs_ar"] == 80 / 5 and (tmp_path / "video_speed.md").is_file()
