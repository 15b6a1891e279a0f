"""Peak resident memory over a stretch of work, sampled by a background thread.

``getrusage``'s maxrss is the peak of the whole process life, which says nothing about
the engine measured after another one; sampling gives a per-measurement peak.
"""

from __future__ import annotations

import threading
from types import TracebackType

import psutil


class PeakRss:
    """Context manager: ``peak_mb`` is the highest RSS seen while inside it."""

    def __init__(self, interval_s: float = 0.01) -> None:
        self.interval_s = interval_s
        self._process = psutil.Process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._peak = 0

    def _sample(self) -> None:
        while True:
            self._peak = max(self._peak, self._process.memory_info().rss)
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> PeakRss:
        self._peak = self._process.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        self._peak = max(self._peak, self._process.memory_info().rss)

    @property
    def peak_mb(self) -> float:
        return self._peak / (1024 * 1024)
