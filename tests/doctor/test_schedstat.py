"""The CPU-wait counter behind turboinfer_cpu_wait_seconds_total: schedstat files of
threads that come and go, and this process's own threads for real."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from turboinfer.hardware.schedstat import TASKS, WaitCounter, read_thread_waits


def _thread(tasks: Path, tid: str, run_ns: int, wait_ns: int) -> None:
    (tasks / tid).mkdir(parents=True, exist_ok=True)
    (tasks / tid / "schedstat").write_text(f"{run_ns} {wait_ns} 7\n")


def test_an_exited_thread_keeps_its_wait_and_the_total_never_drops(tmp_path: Path) -> None:
    tasks = tmp_path / "task"
    _thread(tasks, "100", 5_000_000_000, 1_000_000_000)
    _thread(tasks, "101", 2_000_000_000, 500_000_000)
    counter = WaitCounter(tasks)
    assert counter.seconds() == pytest.approx(1.5)
    (tasks / "101" / "schedstat").unlink()
    (tasks / "101").rmdir()
    _thread(tasks, "100", 6_000_000_000, 1_200_000_000)
    assert counter.seconds() == pytest.approx(1.7)
    # A new thread under a reused id starts from zero: the old one's total stays.
    _thread(tasks, "100", 1_000, 100_000_000)
    assert counter.seconds() == pytest.approx(1.8)


def test_no_schedstat_is_none(tmp_path: Path) -> None:
    assert read_thread_waits(tmp_path / "absent") is None
    assert WaitCounter(tmp_path / "absent").seconds() is None


@pytest.mark.skipif(read_thread_waits() is None, reason="no schedstat on this kernel")
def test_this_process_threads_are_read() -> None:
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        waits = read_thread_waits(TASKS)
        assert waits is not None and len(waits) >= 2
        start = time.process_time()
        while time.process_time() - start < 0.05:
            pass
        after = read_thread_waits(TASKS)
        assert after is not None
        assert sum(run for run, _ in after.values()) > sum(run for run, _ in waits.values())
    finally:
        stop.set()
        worker.join()
