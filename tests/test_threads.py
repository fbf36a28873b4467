"""The CPU threads vgen computes with: a count as given, or "auto", the available cores less those busy elsewhere
(so that a busy core elsewhere does not stall every parallel step), OMP_NUM_THREADS respected; set for a command
and restored after it."""

from __future__ import annotations

import pytest
import torch

from vgen import threads


@pytest.fixture
def fresh_auto(monkeypatch):
    """auto_threads measured anew in the test, OMP_NUM_THREADS unset, torch's thread count restored after."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    threads.auto_threads.cache_clear()
    yield
    threads.auto_threads.cache_clear()
    torch.set_num_threads(before)


@pytest.mark.parametrize(("cores", "busy", "expected"), [
    (2, 0.0, 2), (2, 0.3, 2), (2, 1.0, 1), (2, 0.8, 1), (2, 7.0, 1), (8, 2.4, 6), (1, 0.0, 1)])
def test_auto_takes_the_cores_less_those_busy_elsewhere_and_at_least_one(fresh_auto, monkeypatch, cores, busy,
                                                                        expected):
    monkeypatch.setattr(threads, "available_cores", lambda: cores)
    monkeypatch.setattr(threads, "busy_cores", lambda: busy)
    assert threads.resolve_threads("auto") == expected


def test_auto_is_measured_once_a_process(fresh_auto, monkeypatch):
    calls = []
    monkeypatch.setattr(threads, "busy_cores", lambda: calls.append(1) or 0.0)
    threads.resolve_threads("auto")
    threads.resolve_threads("auto")
    assert len(calls) == 1


def test_auto_keeps_the_count_omp_num_threads_asked_for(fresh_auto, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(threads, "busy_cores", lambda: pytest.fail("nothing is measured"))
    torch.set_num_threads(1)
    assert threads.set_threads("auto") == 1 and torch.get_num_threads() == 1


def test_busy_cores_is_the_machines_busy_share_of_cpu_time_in_cores(monkeypatch):
    samples = iter([(100, 1000), (175, 1100)])  # (busy, total) ticks: 75 of 100 busy
    monkeypatch.setattr(threads, "cpu_times", lambda: next(samples))
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 4)
    assert threads.busy_cores(interval_s=0) == pytest.approx(3.0)


def test_busy_cores_falls_back_on_the_load_average_without_proc_stat(monkeypatch):
    monkeypatch.setattr(threads, "cpu_times", lambda: None)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (1.5, 1.0, 0.5))
    assert threads.busy_cores(interval_s=0) == 1.5


def test_cpu_times_reads_busy_and_total_ticks_of_this_machine():
    times = threads.cpu_times()
    if times is None:
        pytest.skip("no /proc/stat here")
    busy, total = times
    assert 0 <= busy <= total


@pytest.mark.parametrize("bad", [0, -1, 1.5, "two", True, None])
def test_a_bad_count_is_refused_in_one_line(bad):
    with pytest.raises(ValueError, match=r"^threads must be an integer >= 1 or 'auto', got "):
        threads.set_threads(bad)


def test_threads_for_sets_the_count_in_the_block_and_restores_it_after(fresh_auto):
    torch.set_num_threads(2)
    with threads.threads_for(1) as count:
        assert count == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
