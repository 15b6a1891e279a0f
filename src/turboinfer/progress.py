"""One progress display for every command, always on stderr (stdout is for results).

On a terminal it is a live ``rich`` bar: the stage, a count and an ETA when the total is
known, removed when the command finishes so only the results stay. When stderr is a file
or a pipe it writes plain lines instead, at each stage and every few seconds while a stage
runs, so a log shows where a long run is and that it is still alive. The first line waits
those few seconds too: a quick command, or one that fails at once, leaves only its result
or its one-line error. ``TURBOINFER_PROGRESS_SECONDS`` sets the interval (default 5).

Two kinds of message:

- ``stage(message)``: a new step of the work; always shown. A message that starts with
  ``[i/n]`` (the library's progress callbacks count that way) is step ``i`` of ``n``.
- ``update(message)``: a live detail of the current step (counters, rates); shown at
  once on a terminal, at most every few seconds in a log.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from types import TracebackType
from typing import Protocol, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

# Long enough that a log stays readable, short enough that a stalled run is noticed.
LOG_EVERY_S = 5.0
LOG_EVERY_ENV = "TURBOINFER_PROGRESS_SECONDS"
_COUNTED = re.compile(r"^\[(\d+)/(\d+)\]\s*")


class _Backend(Protocol):
    def show(self, message: str, *, done: int | None, total: int | None,
             stage: bool) -> None: ...

    def close(self) -> None: ...


class ProgressDisplay:
    """The progress of one command; use as a context manager so it is always closed."""

    def __init__(self, *, enabled: bool = True, stream: TextIO | None = None,
                 log_every_s: float | None = None) -> None:
        out = stream if stream is not None else sys.stderr
        if log_every_s is None:
            log_every_s = _every_from_env()
        self._backend: _Backend
        if not enabled:
            self._backend = _Silent()
        elif out.isatty():
            self._backend = _LiveBar(out)
        else:
            self._backend = _LogLines(out, log_every_s)

    def stage(self, message: str) -> None:
        """Start a step; ``[i/n] text`` means step ``i`` of ``n`` (``i - 1`` done)."""
        match = _COUNTED.match(message)
        if match is None:
            self._backend.show(message, done=None, total=None, stage=True)
            return
        index, total = int(match.group(1)), int(match.group(2))
        self._backend.show(message, done=index - 1, total=total, stage=True)

    def step_done(self, message: str, *, done: int, total: int) -> None:
        """``done`` of ``total`` steps are finished; ``message`` says what the last was."""
        self._backend.show(f"[{done}/{total}] {message}", done=done, total=total, stage=True)

    def update(self, message: str) -> None:
        """A live detail of the current step."""
        self._backend.show(message, done=None, total=None, stage=False)

    def close(self) -> None:
        self._backend.close()

    def __enter__(self) -> ProgressDisplay:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


def _every_from_env() -> float:
    """The log interval from the environment; a value that is not a number is ignored."""
    try:
        return max(float(os.environ.get(LOG_EVERY_ENV, LOG_EVERY_S)), 0.0)
    except ValueError:
        return LOG_EVERY_S


class _Silent:
    def show(self, message: str, *, done: int | None, total: int | None,
             stage: bool) -> None:
        pass

    def close(self) -> None:
        pass


class _LiveBar:
    """A transient rich bar: it disappears on close, so the results print cleanly."""

    def __init__(self, stream: TextIO) -> None:
        self._progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
            MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("eta"),
            TimeRemainingColumn(), console=Console(file=stream), transient=True)
        self._task: TaskID | None = None

    def show(self, message: str, *, done: int | None, total: int | None,
             stage: bool) -> None:
        # The bar counts on its own: the ``[i/n]`` prefix would say it twice.
        message = _COUNTED.sub("", message)
        if self._task is None:
            self._progress.start()
            self._task = self._progress.add_task(message, total=total)
        self._progress.update(self._task, description=message)
        if total is not None:
            self._progress.update(self._task, completed=done or 0, total=total)

    def close(self) -> None:
        if self._task is not None:
            self._progress.stop()


class _LogLines:
    """Plain lines for a log: each stage, throttled updates, and a heartbeat.

    Nothing is written during the first ``every_s``: ``_last_line`` starts at the start.
    ``every_s=0`` writes every message as it comes, with no heartbeat.
    """

    def __init__(self, stream: TextIO, every_s: float) -> None:
        self._stream = stream
        self._every_s = every_s
        self._start = self._last_line = time.monotonic()
        self._counted_since: tuple[float, int] | None = None
        self._message = ""
        self._eta = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def show(self, message: str, *, done: int | None, total: int | None,
             stage: bool) -> None:
        with self._lock:
            now = time.monotonic()
            if total is not None:
                self._eta = self._estimate(now, done or 0, total)
            self._message = message
            quiet = now - self._start < self._every_s
            if (stage and not quiet) or now - self._last_line >= self._every_s:
                self._write(now, "")
        if self._beat is None and self._every_s > 0:
            self._beat = threading.Thread(target=self._heartbeat, daemon=True,
                                          name="turboinfer-progress")
            self._beat.start()

    def _estimate(self, now: float, done: int, total: int) -> str:
        """Remaining time from the rate since the first counted step."""
        if self._counted_since is None:
            self._counted_since = (now, done)
        since, first = self._counted_since
        if done <= first or done >= total:
            return ""
        seconds = (now - since) / (done - first) * (total - done)
        return f", eta {seconds:.0f} s"

    def _heartbeat(self) -> None:
        # A long stage reports nothing itself; the log still learns the run is alive.
        while not self._stop.wait(self._every_s / 2):
            with self._lock:
                now = time.monotonic()
                if now - self._last_line >= self._every_s:
                    self._write(now, ", still running")

    def _write(self, now: float, suffix: str) -> None:
        elapsed = now - self._start
        self._stream.write(f"[{elapsed:6.1f} s] {self._message}{suffix}{self._eta}\n")
        self._stream.flush()
        self._last_line = now

    def close(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
