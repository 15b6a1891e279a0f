"""What the fault scenarios share: the server fixtures and model builders of tests/serve,
and a watch on the server's RSS. The ``conftest`` of tests/serve cannot be imported by
that name from here (tests/faults has the name too), so each module of tests/serve is
loaded once by path under its own name."""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType

import psutil

SERVE_TESTS = Path(__file__).parents[1] / "serve"


def serve_module(name: str, filename: str) -> ModuleType:
    """``tests/serve/<filename>`` as the module ``name``, loaded on first use."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SERVE_TESTS / filename)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


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
