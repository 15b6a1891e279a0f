"""Batch forming: a bounded priority queue of waiting requests and the rule that turns
them into one batch.

Nothing here runs a model: ``next_batch`` waits for the first request, then for more
rows while more are expected within the adaptive window (``batch_window``: never longer
than ``max_queue_delay``, and not at all when nothing else is on its way) or until the
largest preferred batch size is reached, and takes the batch. Requests carrying their
own batch dimension count by rows. Only requests whose per-row shapes and dtypes agree
can share a batch; the others wait for the next one.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from dataclasses import dataclass

import numpy as np

from turboinfer.serve.batch_window import AT_ONCE, FULL, WAITED, BatchWindow
from turboinfer.serve.deadline import IN_QUEUE, expire

Outputs = dict[str, np.ndarray]


@dataclass(frozen=True)
class BatchingSettings:
    max_batch_size: int = 0  # rows; 0: no batching, each request runs alone
    max_queue_delay_s: float = 0.0
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_size: int = 1024  # requests; beyond it submit() rejects at once
    default_timeout_s: float | None = None
    # Inputs whose axis 1 (tokens) may differ between requests: a batch pads them with
    # zeros to its longest (text models with an attention mask).
    ragged: frozenset[str] = frozenset()


class Pending:
    """One waiting request: its inputs, and the future its caller awaits."""

    __slots__ = ("arrival", "future", "inputs", "rows", "signature", "timeout_s", "timer")

    def __init__(self, inputs: dict[str, np.ndarray], rows: int,
                 future: asyncio.Future[Outputs], ragged: frozenset[str] = frozenset()
                 ) -> None:
        self.inputs = inputs
        self.rows = rows
        self.future = future
        self.arrival = time.perf_counter()
        self.timer: asyncio.TimerHandle | None = None
        self.timeout_s: float | None = None
        # Requests are batched together only if everything but the batch axis agrees.
        self.signature = tuple((n, a.dtype.str, a.shape[2:] if n in ragged else a.shape[1:])
                               for n, a in inputs.items())

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
        self._waiter: asyncio.Future[None] | None = None  # next_batch waiting for a put
        self.window = BatchWindow(settings.max_queue_delay_s)
        self.reasons: Counter[str] = Counter()  # why each batch left (batch_window)
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
        self.window.arrived(item.arrival, queue_was_empty=self._count == 1,
                            waiting=self._count)
        self._rows += item.rows
        self._wake()

    def close(self) -> None:
        """Take no more requests; ``next_batch`` returns None once the queue is empty."""
        self.closed = True
        self._wake()

    def finished(self, requests: int) -> None:
        """A batch of ``requests`` taken from here has been run (the window counts running
        batches and their requests)."""
        self.window.finished(requests)

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
            await self._wait(None)
        settings = self.settings
        reason = AT_ONCE
        if settings.max_batch_size and settings.max_queue_delay_s > 0:
            reason = await self._fill()
        batch = self.take()
        if batch:
            self.window.dispatched(time.perf_counter(), len(batch))
            self.reasons[reason] += 1
        return batch

    async def _fill(self) -> str:
        """Wait for more rows while the window expects some, up to the target size;
        returns why the batch goes."""
        settings, window = self.settings, self.window
        target = max(settings.preferred_batch_sizes, default=settings.max_batch_size)
        oldest, rows = self._oldest_arrival(), self._rows
        reason, waited = AT_ONCE, False
        while not self.closed:
            if self._rows >= target:
                reason = FULL
                break
            wait_s, reason = window.wait_s(oldest, time.perf_counter(), self._count)
            if wait_s <= 0:
                break
            waited = True
            await self._wait(wait_s)
        if waited:  # a wait that was not needed teaches the window nothing
            window.waited(joined=self._rows > rows)
            if reason == AT_ONCE:
                reason = WAITED  # the window's slack ran out
        return reason

    async def _wait(self, timeout_s: float | None) -> None:
        """Until the next put or close, or ``timeout_s``: one future and one timer
        handle (``asyncio.wait_for`` would add a task per wait)."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = None if timeout_s is None else loop.call_later(timeout_s, _wake, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def _wake(self) -> None:
        if self._waiter is not None:
            _wake(self._waiter)

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


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
