"""benchmarks/t2v_stream.py: a dry run on a tiny streaming model writes every figure (fidelity, one row per switch
mode with the frames before the switch equal across modes, drift per chunk, speed with its switches), and bad
arguments end in one line."""

from __future__ import annotations

import json
import re

import pytest

from vgen.data.scenes import CLASS_NAMES as SHAPES
from vgen.hub import save_pretrained


def test_a_dry_run_writes_every_figure(benchmark_module, tiny_text_stream_pipeline_dir, tiny_scene_judge, tmp_path,
                                       capsys):
    bench = benchmark_module("t2v_stream")
    judge = save_pretrained(tiny_scene_judge, tmp_path / "judge")
    out = tmp_path / "figures" / "t2v.json"
    assert bench.main(["--model", str(tiny_text_stream_pipeline_dir), "--judge", str(judge), "--streams", "1",
                       "--fidelity-frames", "4", "--frames", "6", "--switch-frame", "4", "--modes", "recache,reset",
                       "--long-streams", "1", "--long-frames", "10", "--speed-every", "4", "--real", "1",
                       "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    fidelity = record["fidelity"]
    assert fidelity["streams"] == 1 and len(fidelity["per_stream"]) == 1 and 0 <= fidelity["frame_accuracy"] <= 1
    assert set(fidelity["by_shape"]) <= set(SHAPES) and 0 <= fidelity["motion_accuracy"] <= 1
    switch = record["switch"]
    assert list(switch["modes"]) == ["recache", "reset"]
    assert switch["paired_before_switch"] == 1.0  # every mode draws the same noise before the switch
    for mode in switch["modes"].values():
        assert mode["streams"] == 1 and len(mode["latencies"]) == 1 and mode["mean_spike"] >= 0
    assert switch["real"]["clips"] == 1 and switch["real"]["frames"] == 13  # a whole spike window
    assert record["drift"]["streams"] == 1 and len(record["drift"]["per_chunk"]) == 10
    assert record["speed"]["frames"] == 10 and record["speed"]["switches"] == 2
    assert record["speed"]["mean_recache_ms"] > 0
    table = out.with_suffix(".md").read_text()
    assert table in capsys.readouterr().out
    assert sum(line.startswith(("| recache |", "| reset |")) for line in table.splitlines()) == 2


def test_a_class_stream_switches_class(benchmark_module, tiny_stream_pipeline_dir, tmp_path):
    bench = benchmark_module("t2v_stream")
    out = tmp_path / "t2v.json"
    assert bench.main(["--model", str(tiny_stream_pipeline_dir), "--parts", "switch", "--streams", "3", "--frames",
                       "6", "--switch-frame", "4", "--modes", "plain,reset", "--real", "1", "--batch-size", "2",
                       "--cfg-scale", "2", "--steps", "1", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["judged"] == ["class"]
    assert list(record) == ["model", "threads", "judged", "seed", "settings", "switch"]
    assert record["settings"] == {"cfg_scale": 2.0, "steps": 1}
    assert out.with_suffix(".md").read_text().startswith(f"{tiny_stream_pipeline_dir}, cfg_scale 2.0, steps 1:")
    assert record["switch"]["paired_before_switch"] == 1.0  # batches of 2 and 1, the same noise in each mode
    assert all(len(mode["latencies"]) == 3 for mode in record["switch"]["modes"].values())


def test_the_table_reads_the_record(benchmark_module):
    bench = benchmark_module("t2v_stream")
    mode = {"streams": 4, "within_window": 0.75, "never": 0.25, "median_latency": 2.0, "mean_spike": 3.5,
            "median_spike": 3.0, "label_flicker": None, "pixel_flicker": None, "latencies": [0, 2, 3, None]}
    record = {"model": "m", "judged": ["shape", "colour"],
              "switch": {"streams": 4, "frames": 48, "switch_frame": 16, "paired_before_switch": 1.0,
                         "modes": {"recache": mode},
                         "real": {"mean_spike_at_switch": 1.1, "mean_largest_spike": 1.6, "max_largest_spike": 2.5}}}
    table = bench.markdown(record)
    assert "| recache | 75.0% | 25.0% | 2.0 | 3.50 | - | - |" in table.splitlines()
    assert "real clips: 1.10 at s, largest 1.60 on average, 2.50 at most" in table


@pytest.mark.parametrize("argv, message", [
    (["--modes", "recache,fast"], "--modes must name some of recache, recache-keep-sink, plain, reset"),
    (["--parts", "speed,colour"], "--parts must name some of"),
    (["--switch-frame", "48"], r"--switch-frame must be in \[2, --frames\), got 48 of 48"),
    (["--streams", "0"], "--streams must be >= 1, got 0"),
    (["--long-frames", "8"], "--long-frames must be >= 10"),
    (["--fidelity-frames", "2"], "--fidelity-frames must be >= 3"),
    (["--speed-every", "-1"], "--speed-every must be >= 0"),
])
def test_bad_arguments_end_in_one_line(benchmark_module, capsys, argv, message):
    bench = benchmark_module("t2v_stream")
    with pytest.raises(SystemExit) as exit_:
        bench.parse_args(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.search(message, err), err


def test_a_switch_inside_a_block_is_refused(benchmark_module, tiny_stream_pipeline_dir, tmp_path, capsys):
    bench = benchmark_module("t2v_stream")
    assert bench.main(["--model", str(tiny_stream_pipeline_dir), "--switch-frame", "5", "--frames", "12",
                       "--out", str(tmp_path / "x.json")]) == 2
    assert capsys.readouterr().err.strip() == (f"t2v_stream: --switch-frame 5 is not a block's first frame "
                                               f"({tiny_stream_pipeline_dir} makes blocks of 2 frames)")
    assert not (tmp_path / "x.json").exists()
