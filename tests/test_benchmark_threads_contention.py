"""benchmarks/threads_contention.py: each candidate's row holds every command idle, with one core busy, and their
ratio (a lower bound where the busy run timed out), with the load average each run started at; a run is one vgen
command with the candidate's threads and environment."""

import subprocess


def test_the_table_has_a_ratio_per_command_and_a_bound_for_a_timed_out_run(benchmark_module):
    bench = benchmark_module("threads_contention")
    rows = [{"candidate": "1", "command": "sample", "loaded": False, "seconds": 4.0, "load": 0.2},
            {"candidate": "1", "command": "sample", "loaded": True, "seconds": 5.0, "load": 1.1},
            {"candidate": "all", "command": "sample", "loaded": False, "seconds": 3.0, "load": 0.3},
            {"candidate": "all", "command": "sample", "loaded": True, "seconds": None, "load": 1.0}]
    lines = bench.markdown(rows, timeout=60).splitlines()
    assert lines[0] == "| threads | sample idle | sample one core busy | sample ratio |"
    assert lines[2] == "| 1 | 4.0 s (0.2) | 5.0 s (1.1) | 1.25x |"
    assert lines[3] == "| all | 3.0 s (0.3) | >60 s (1.0) | >20.0x |"


def test_a_run_is_the_vgen_command_with_the_candidates_threads_and_environment(benchmark_module, monkeypatch,
                                                                               tmp_path):
    bench = benchmark_module("threads_contention")
    calls = []
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setattr(subprocess, "run", lambda args, **kwargs: calls.append((args, kwargs)))
    seconds, load = bench.run_command(["sample"], {"OMP_WAIT_POLICY": "passive"}, "1", tmp_path, 5.0)
    (args, kwargs), = calls
    assert args[1:] == ["-m", "vgen", "sample", "--no-progress", "--overwrite", "--threads", "1"]
    assert kwargs["env"]["OMP_WAIT_POLICY"] == "passive" and "OMP_NUM_THREADS" not in kwargs["env"]
    assert seconds >= 0 and load >= 0
