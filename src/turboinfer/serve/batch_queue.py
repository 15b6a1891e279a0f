"""Batch forming: a bounded priority queue of waiting requests and the rule that turns
them into one batch.

Nothing here runs a model: ``next_batch`` waits for the first request, then up to
``max_queue_delay`` for more rows (or until the largest preferred batch size is
reached), and takes the batch. Requests carrying their own batch dimension count by
rows. Only requests whose per-row shapes and dtypes agree can share a batch; the others
wait for the next one.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from turboinfer.serve.deadline import IN_QUEUE, expire

Outputs = dict[str, np.ndarray]


@dataclass(frozen=True)
class BatchingSettings:
    max_batch_size: int = 0  # rows; 0: no batching, each request runs alone
    max_queue_delay_s: float = 0.0
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_size: int = 1024  # requests; beyond it submit() rejects at once
    default_timeout_s: float | None = None


class Pending:
    """One waiting request: its inputs, and the future its caller awaits."""

    __slots__ = ("arrival", "future", "inputs", "rows", "signature", "timeout_s", "timer")

    def __init__(self, inputs: dict[str, np.ndarray], rows: int,
                 future: asyncio.Future[Outputs]) -> None:
        self.inputs = inputs
        self.rows = rows
        self.future = future
        self.arrival = time.perf_counter()
        self.timer: asyncio.TimerHandle | None = None
        self.timeout_s: float | None = None
        # Requests are batched together only if everything but the batch axis agrees.
        self.signature = tuple((n, a.dtype.str, a.shape[1:]) for n, a in inputs.items())

    def expire_after(self, loop: asyncio.AbstractEventLoop, timeout_s: float) -> None:
        """Fail the request on time even while every instance is busy; leaving the
        queue in a batch cancels the timer (``deadline.hold`` keeps the deadline for
        the engine run)."""
        self.timeout_s = timeout_s
        self.timer = loop.call_later(timeout_s, expire, self.future, timeout_s, IN_QUEUE)


class BatchQueue:
    """Waiting requests by priority (highest first, FIFO within a level)."""

    def __init__(self, settings: BatchingSettings) -> None:
        self.settings = settings
        self._levels: dict[int, deque[Pending]] = {}
        self._count = 0  # requests waiting
        self._rows = 0  # their rows
        self._wakeup = asyncio.Event()
        self.closed = False

    @property
    def pending(self) -> int:
        return self._count

    @property
    def full(self) -> bool:
        return self._count >= self.settings.max_queue_size

    def put(self, item: Pending, priority: int) -> None:
        level = self._levels.get(priority)
        if level is None:
            level = self._levels[priority] = deque()
        level.append(item)
        self._count += 1
        self._rows += item.rows
        self._wakeup.set()

    def close(self) -> None:
        """Take no more requests; ``next_batch`` returns None once the queue is empty."""
        self.closed = True
        self._wakeup.set()

    def fail_all(self, error: Exception) -> None:
        for level in self._levels.values():
            for item in level:
                if item.timer is not None:
                    item.timer.cancel()
                if not item.future.done():
                    item.future.set_exception(error)
        self._levels.clear()
        self._count = self._rows = 0

    async def next_batch(self) -> list[Pending] | None:
        """The next batch (empty if every waiting request had expired meanwhile), or
        None when the queue is closed and empty."""
        while not self._count:
            if self.closed:
                return None
            self._wakeup.clear()
            await self._wakeup.wait()
        settings = self.settings
        if settings.max_batch_size and settings.max_queue_delay_s > 0:
            await self._fill(settings.max_queue_delay_s)
        return self.take()

    async def _fill(self, delay_s: float) -> None:
        """Wait for more rows until the target size or the oldest request's deadline."""
        settings = self.settings
        target = max(settings.preferred_batch_sizes, default=settings.max_batch_size)
        deadline = self._oldest_arrival() + delay_s
        while self._rows < target and not self.closed:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), remaining)
            except TimeoutError:
                return

    def _oldest_arrival(self) -> float:
        return min(level[0].arrival for level in self._levels.values() if level)

    def _row_limit(self) -> int:
        settings = self.settings
        if not settings.max_batch_size:
            return 0  # one request per batch, whatever its size
        fitting = [p for p in settings.preferred_batch_sizes if p <= self._rows]
        return max(fitting) if fitting else settings.max_batch_size

    def take(self) -> list[Pending]:
        """Highest priority first, FIFO within a level, compatible shapes only."""
        limit = self._row_limit()
        batch: list[Pending] = []
        rows, full = 0, False
        for priority in sorted(self._levels, reverse=True):
            level, skipped = self._levels[priority], deque[Pending]()
            while level and not full:
                item = level[0]
                if item.future.done():  # timed out, or its client went away
                    self._remove(level.popleft())
                elif batch and item.signature != batch[0].signature:
                    skipped.append(level.popleft())
                elif batch and rows + item.rows > limit:
                    full = True
                else:
                    batch.append(self._remove(level.popleft()))
                    rows += item.rows
                    full = not limit or rows >= limit
            level.extendleft(reversed(skipped))
            if not level:
                del self._levels[priority]
            if full:
                break
        return batch

    def _remove(self, item: Pending) -> Pending:
        self._count -= 1
        self._rows -= item.rows
        if item.timer is not None:
            item.timer.cancel()
        return item
