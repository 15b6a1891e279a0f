"""Dynamic batching: requests wait in a bounded priority queue and leave it as batches.

The recipe: each request is a future in the queue; one dispatcher task waits for a free
instance, then for the first request, then up to ``max_queue_delay`` for more rows (or
until the largest preferred batch size is reached), and hands the batch to a task of its
own. Every request of a failing batch gets the error. Because a batch only forms once an
instance is free, requests that arrive while all instances are busy pile up into the next
batch: with a delay of 0 batching is purely opportunistic and adds no latency at low load.

Requests carrying their own batch dimension count by rows. Only requests whose
per-row shapes and dtypes agree can share a batch; the others wait for the next one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from turboinfer.errors import InferenceError, TurboinferError, UnavailableError
from turboinfer.serve.instances import Instance, InstancePool

log = logging.getLogger(__name__)

Outputs = dict[str, np.ndarray]


@dataclass(frozen=True)
class BatchingSettings:
    max_batch_size: int = 0  # rows; 0: no batching, each request runs alone
    max_queue_delay_s: float = 0.0
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_size: int = 1024  # requests; beyond it submit() rejects at once
    default_timeout_s: float | None = None


class BatchObserver:
    """Receives timings; the metrics module implements it. Defaults do nothing."""

    def queued(self, pending: int) -> None: ...

    def dequeued(self, queue_s: float) -> None: ...

    def batch(self, rows: int, requests: int, input_s: float, infer_s: float,
              output_s: float) -> None: ...


class _Pending:
    __slots__ = ("arrival", "future", "inputs", "rows", "signature", "timer")

    def __init__(self, inputs: dict[str, np.ndarray], rows: int,
                 future: asyncio.Future[Outputs]) -> None:
        self.inputs = inputs
        self.rows = rows
        self.future = future
        self.arrival = time.perf_counter()
        self.timer: asyncio.TimerHandle | None = None
        # Requests are batched together only if everything but the batch axis agrees.
        self.signature = tuple((n, a.dtype.str, a.shape[1:]) for n, a in inputs.items())


def _expire(future: asyncio.Future[Outputs], timeout_s: float) -> None:
    if not future.done():
        future.set_exception(UnavailableError(
            f"request timed out after {timeout_s * 1000:g} ms in the queue"))


class Batcher:
    """One per served model version. ``submit`` is called on the event loop."""

    def __init__(self, pool: InstancePool, settings: BatchingSettings,
                 observer: BatchObserver | None = None) -> None:
        self.pool = pool
        self.settings = settings
        self.observer = observer or BatchObserver()
        self._levels: dict[int, deque[_Pending]] = {}
        self._count = 0
        self._rows = 0
        self._wakeup = asyncio.Event()
        self._running: set[asyncio.Task[None]] = set()
        self._dispatcher: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def pending(self) -> int:
        return self._count

    @property
    def full(self) -> bool:
        return self._count >= self.settings.max_queue_size

    @property
    def in_flight(self) -> int:
        return self._count + len(self._running)

    def start(self) -> None:
        self._dispatcher = asyncio.get_running_loop().create_task(self._dispatch())
        self._dispatcher.add_done_callback(self._dispatcher_done)

    async def submit(self, inputs: dict[str, np.ndarray], rows: int, priority: int = 0,
                     timeout_s: float | None = None) -> Outputs:
        if self._closed:
            raise UnavailableError("this model version is being unloaded")
        if self.full:
            raise UnavailableError(
                f"queue full ({self.settings.max_queue_size} requests waiting); retry later")
        timeout_s = timeout_s if timeout_s is not None else self.settings.default_timeout_s
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outputs] = loop.create_future()
        pending = _Pending(inputs, rows, future)
        if timeout_s is not None:
            # A queue timeout: the timer fails the request on time even while every
            # instance is busy; taking the request into a batch cancels it.
            pending.timer = loop.call_later(timeout_s, _expire, future, timeout_s)
        level = self._levels.get(priority)
        if level is None:
            level = self._levels[priority] = deque()
        level.append(pending)
        self._count += 1
        self._rows += rows
        self.observer.queued(self._count)
        self._wakeup.set()
        return await future

    def _dispatcher_done(self, task: asyncio.Task[None]) -> None:
        # A dead dispatcher would leave requests queued forever: refuse and fail them.
        if task.cancelled() or task.exception() is None:
            return
        log.error("batch dispatcher stopped", exc_info=task.exception())
        self._closed = True
        self._fail_queued(InferenceError(f"batch dispatcher stopped: {task.exception()!r}"))

    def _fail_queued(self, error: Exception) -> None:
        for level in self._levels.values():
            for item in level:
                if not item.future.done():
                    item.future.set_exception(error)
        self._levels.clear()
        self._count = self._rows = 0

    async def _dispatch(self) -> None:
        while True:
            instance = await self.pool.acquire()
            try:
                batch = await self._next_batch()
            except BaseException:
                self.pool.release(instance)
                raise
            if not batch:  # every waiting request had timed out or was cancelled
                self.pool.release(instance)
                continue
            task = asyncio.get_running_loop().create_task(self._execute(instance, batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _next_batch(self) -> list[_Pending]:
        while not self._count:
            self._wakeup.clear()
            await self._wakeup.wait()
        settings = self.settings
        if settings.max_batch_size and settings.max_queue_delay_s > 0:
            target = max(settings.preferred_batch_sizes, default=settings.max_batch_size)
            deadline = self._oldest_arrival() + settings.max_queue_delay_s
            while self._rows < target:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
                except TimeoutError:
                    break
        return self._take()

    def _oldest_arrival(self) -> float:
        return min(level[0].arrival for level in self._levels.values() if level)

    def _row_limit(self) -> int:
        settings = self.settings
        if not settings.max_batch_size:
            return 0  # one request per batch, whatever its size
        fitting = [p for p in settings.preferred_batch_sizes if p <= self._rows]
        return max(fitting) if fitting else settings.max_batch_size

    def _take(self) -> list[_Pending]:
        """Highest priority first, FIFO within a level, compatible shapes only."""
        limit = self._row_limit()
        batch: list[_Pending] = []
        rows, full = 0, False
        for priority in sorted(self._levels, reverse=True):
            level, skipped = self._levels[priority], deque[_Pending]()
            while level and not full:
                item = level[0]
                if item.future.done():  # timed out, or its client went away
                    self._drop(level.popleft(), served=False)
                elif batch and item.signature != batch[0].signature:
                    skipped.append(level.popleft())
                elif batch and rows + item.rows > limit:
                    full = True
                else:
                    batch.append(self._drop(level.popleft()))
                    rows += item.rows
                    full = not limit or rows >= limit
            level.extendleft(reversed(skipped))
            if not level:
                del self._levels[priority]
            if full:
                break
        self.observer.queued(self._count)
        return batch

    def _drop(self, item: _Pending, served: bool = True) -> _Pending:
        self._count -= 1
        self._rows -= item.rows
        if item.timer is not None:
            item.timer.cancel()
        if served:
            self.observer.dequeued(time.perf_counter() - item.arrival)
        return item

    async def _execute(self, instance: Instance, batch: list[_Pending]) -> None:
        try:
            start = time.perf_counter()
            feeds = _merge(batch)
            merged = time.perf_counter()
            outputs = await instance.run(feeds)
            ran = time.perf_counter()
            _scatter(batch, outputs)
            self.observer.batch(sum(p.rows for p in batch), len(batch), merged - start,
                                ran - merged,
                                time.perf_counter() - ran)
        except BaseException as exc:
            error = exc if isinstance(exc, TurboinferError) else InferenceError(
                f"the engine failed on a batch of {len(batch)} requests: {exc}")
            if not isinstance(exc, TurboinferError):
                log.exception("batch failed")
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(error)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self.pool.release(instance)

    async def drain(self, timeout_s: float = 30.0) -> None:
        """Refuse new requests, finish the queued and running ones, then stop."""
        self._closed = True
        deadline = time.perf_counter() + timeout_s
        while self.in_flight and time.perf_counter() < deadline:
            await asyncio.sleep(0.005)
        await self.close()

    async def close(self) -> None:
        self._closed = True
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            await asyncio.gather(self._dispatcher, return_exceptions=True)
        self._fail_queued(UnavailableError("model version unloaded"))


def _merge(batch: list[_Pending]) -> dict[str, np.ndarray]:
    if len(batch) == 1:
        return batch[0].inputs
    names = batch[0].inputs
    return {name: np.concatenate([p.inputs[name] for p in batch]) for name in names}


def _scatter(batch: list[_Pending], outputs: Outputs) -> None:
    if len(batch) == 1:
        _resolve(batch[0], outputs)
        return
    rows = sum(p.rows for p in batch)
    for name, value in outputs.items():
        if value.ndim == 0 or value.shape[0] != rows:
            raise InferenceError(f"output {name!r} has shape {list(value.shape)}, which has "
                                 f"no batch axis of {rows} rows to split")
    offset = 0
    for item in batch:
        end = offset + item.rows
        _resolve(item, {name: value[offset:end] for name, value in outputs.items()})
        offset = end


def _resolve(item: _Pending, outputs: Outputs) -> None:
    if not item.future.done():  # the waiter may have been cancelled (client went away)
        item.future.set_result(outputs)
