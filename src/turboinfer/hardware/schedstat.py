"""How long this process's threads waited for a CPU, from ``/proc/self/task/*/schedstat``.

Each thread's schedstat is ``<ns on a CPU> <ns runnable but waiting> <timeslices>``. The
waiting time is the direct measure of CPU contention: a thread that wanted to run while
another process (or too many of its own threads) held the core. Process CPU seconds say
how much the server ran; this says how much longer it would have liked to.

Threads come and go (thread pools grow, executors retire workers), and an exited thread's
file is gone: the counter keeps what each thread had at its last reading, so the total
never goes down.
"""

from __future__ import annotations

import threading
from pathlib import Path

TASKS = Path("/proc/self/task")


def read_thread_waits(tasks: Path = TASKS) -> dict[str, tuple[int, int]] | None:
    """thread id -> (running ns, waiting ns); None where schedstat is not readable (a
    kernel without CONFIG_SCHED_INFO, or not Linux)."""
    try:
        tids = [p.name for p in tasks.iterdir()]
    except OSError:
        return None
    out: dict[str, tuple[int, int]] = {}
    for tid in tids:
        try:
            fields = (tasks / tid / "schedstat").read_text().split()
        except OSError:
            continue  # the thread exited between listing and reading
        if len(fields) >= 2 and fields[0].isdigit() and fields[1].isdigit():
            out[tid] = (int(fields[0]), int(fields[1]))
    return out or None


class WaitCounter:
    """Seconds this process's threads spent runnable but waiting for a CPU, summed over
    every thread seen, exited ones included (at their last reading). Safe to call from
    several scrape threads at once."""

    def __init__(self, tasks: Path = TASKS) -> None:
        self._tasks = tasks
        self._last: dict[str, int] = {}
        self._retired_ns = 0
        self._lock = threading.Lock()

    def seconds(self) -> float | None:
        waits = read_thread_waits(self._tasks)
        if waits is None:
            return None
        with self._lock:
            gone = set(self._last) - set(waits)
            self._retired_ns += sum(self._last.pop(tid) for tid in gone)
            for tid, (_, wait_ns) in waits.items():
                # A reused thread id restarts from zero: keep the old thread's total.
                if wait_ns < self._last.get(tid, 0):
                    self._retired_ns += self._last[tid]
                self._last[tid] = wait_ns
            return (self._retired_ns + sum(self._last.values())) / 1e9
