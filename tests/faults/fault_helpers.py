"""What the fault scenarios share: the server fixtures and model builders of tests/serve
(tests/serve_modules.py), and a watch on the server's RSS."""

from __future__ import annotations

import threading

import psutil

from serve_modules import serve_module

serve_fixtures = serve_module("serve_fixtures", "conftest.py")


class RssWatch:
    """A server's RSS (bytes): before, sampled on a thread for the peak, and after, at
    ``stop``. A process that has exited keeps its last sample."""

    def __init__(self, process: psutil.Process) -> None:
        self.process = process
        self.before = self.peak = self.last = process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        try:
            self.last = self.process.memory_info().rss
        except psutil.NoSuchProcess:
            return
        self.peak = max(self.peak, self.last)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self._sample()

    def stop(self) -> tuple[int, int, int]:
        """(before, peak, after)."""
        self._stop.set()
        self._thread.join()
        self._sample()
        return self.before, self.peak, self.last
