"""Dynamic batching: requests wait in a bounded priority queue and leave it as batches.

The recipe: each request is a future in the queue (``batch_queue``, which also decides
what makes a batch); one dispatcher task takes a free instance, then the next batch, and
hands it to a task of its own. A failing batch of several requests is run again request
by request, so only the request at fault gets the error. Because
a batch only forms once an instance is free, requests that arrive while all instances
are busy pile up into the next batch: with a delay of 0 batching is purely opportunistic.
With a delay, a batch still waits only while more requests are expected and waiting has
paid (``batch_window``), so batching adds no latency when there is nothing to batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import numpy as np

from turboinfer.errors import InferenceError, TurboinferError, UnavailableError
from turboinfer.serve.batch_queue import BatchingSettings, BatchQueue, Outputs, Pending
from turboinfer.serve.deadline import hold, release
from turboinfer.serve.instances import Instance, InstancePool

log = logging.getLogger(__name__)

# How long a batch still running when its version closes may go on before its requests
# fail; shorter than the grace the server gives its listeners to write the last answers.
RUNNING_GRACE_S = 0.5

__all__ = ["BatchObserver", "Batcher", "BatchingSettings", "Outputs"]


class BatchObserver:
    """Receives timings; the metrics module implements it. Defaults do nothing."""

    def queued(self, pending: int) -> None: ...

    def dequeued(self, queue_s: float) -> None: ...

    def batch(self, rows: int, requests: int, input_s: float, infer_s: float,
              output_s: float) -> None: ...


class Batcher:
    """One per served model version. ``submit`` is called on the event loop."""

    def __init__(self, pool: InstancePool, settings: BatchingSettings,
                 observer: BatchObserver | None = None) -> None:
        self.pool = pool
        self.settings = settings
        self.observer = observer or BatchObserver()
        self._queue = BatchQueue(settings)
        self._running: set[asyncio.Task[None]] = set()
        self._dispatcher: asyncio.Task[None] | None = None

    @property
    def pending(self) -> int:
        return self._queue.pending

    @property
    def full(self) -> bool:
        return self._queue.full

    @property
    def dispatch_reasons(self) -> dict[str, int]:
        """How many batches left the queue for each reason (``batch_window``)."""
        return dict(self._queue.reasons)

    @property
    def in_flight(self) -> int:
        """Requests waiting plus batches running."""
        return self._queue.pending + len(self._running)

    def start(self) -> None:
        self._dispatcher = asyncio.get_running_loop().create_task(self._dispatch())
        self._dispatcher.add_done_callback(self._dispatcher_done)

    async def submit(self, inputs: dict[str, np.ndarray], rows: int, priority: int = 0,
                     timeout_s: float | None = None) -> Outputs:
        queue = self._queue
        if queue.closed:
            raise UnavailableError("this model version is being unloaded")
        if queue.full:
            raise UnavailableError(
                f"queue full ({self.settings.max_queue_size} requests waiting); retry later")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outputs] = loop.create_future()
        item = Pending(inputs, rows, future, self.settings.ragged)
        timeout_s = timeout_s if timeout_s is not None else self.settings.default_timeout_s
        if timeout_s is not None:
            item.expire_after(loop, timeout_s)
        queue.put(item, priority)
        self.observer.queued(queue.pending)
        return await future

    def _dispatcher_done(self, task: asyncio.Task[None]) -> None:
        # A dead dispatcher would leave requests queued forever: refuse and fail them.
        if task.cancelled() or task.exception() is None:
            return
        log.error("batch dispatcher stopped", exc_info=task.exception())
        self._queue.close()
        self._queue.fail_all(InferenceError(f"batch dispatcher stopped: {task.exception()!r}"))

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        async for instance, batch in self._batches():
            task = loop.create_task(self._execute(instance, batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _batches(self) -> AsyncIterator[tuple[Instance, list[Pending]]]:
        """Each batch with the free instance it runs on, until the queue closes empty."""
        queue, observer = self._queue, self.observer
        while True:
            instance = await self.pool.acquire()
            try:
                batch = await queue.next_batch()
            except BaseException:
                self.pool.release(instance)
                raise
            if batch is None:
                self.pool.release(instance)
                return
            observer.queued(queue.pending)
            if not batch:  # every waiting request had timed out or was cancelled
                self.pool.release(instance)
                continue
            now = time.perf_counter()
            for item in batch:
                observer.dequeued(now - item.arrival)
            yield instance, batch

    async def _execute(self, instance: Instance, batch: list[Pending]) -> None:
        deadlines = hold(batch)  # a request's timeout holds while the engine runs it
        try:
            start = time.perf_counter()
            feeds = _merge(batch, self.settings.ragged)
            merged = time.perf_counter()
            outputs = await instance.run(feeds)
            ran = time.perf_counter()
            _scatter(batch, outputs)
            self.observer.batch(sum(p.rows for p in batch), len(batch), merged - start,
                                ran - merged,
                                time.perf_counter() - ran)
        except asyncio.CancelledError:
            _fail_all(batch, UnavailableError("model version unloaded"))
            raise
        except Exception as exc:
            if len(batch) == 1:
                _fail(batch[0], exc)
            else:
                # One bad request must not fail the others it was merged with: run each
                # alone, so only the guilty one gets the error.
                await _one_by_one(instance, batch)
        finally:
            release(deadlines)
            self._queue.finished(len(batch))
            self.pool.release(instance)

    async def drain(self, timeout_s: float = 30.0) -> None:
        """Refuse new requests, let the queued and running ones finish within
        ``timeout_s``, then stop; whatever is still queued then fails."""
        self._queue.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        if self._dispatcher is not None:
            # The dispatcher returns once the closed queue is empty. asyncio.wait, not
            # wait_for: a deadline must not cancel batches that are running.
            await asyncio.wait({self._dispatcher}, timeout=timeout_s)
        if self._running:
            await asyncio.wait(set(self._running), timeout=max(0.0, deadline - loop.time()))
        await self.close()

    async def close(self) -> None:
        self._queue.close()
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            await asyncio.gather(self._dispatcher, return_exceptions=True)
        self._queue.fail_all(UnavailableError("model version unloaded"))
        if self._running:
            # A batch still running gets a short grace, then its requests fail (503):
            # at shutdown the listeners must still be there to write that answer, or
            # the clients would be cut off with none.
            asyncio.get_running_loop().call_later(RUNNING_GRACE_S, _cancel,
                                                  list(self._running))


def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()  # _execute fails the batch's requests; a finished task ignores it


def _merge(batch: list[Pending], ragged: frozenset[str] = frozenset()
           ) -> dict[str, np.ndarray]:
    if len(batch) == 1:
        return batch[0].inputs
    names = batch[0].inputs
    return {name: _padded([p.inputs[name] for p in batch]) if name in ragged
            else np.concatenate([p.inputs[name] for p in batch]) for name in names}


def _padded(parts: list[np.ndarray]) -> np.ndarray:
    """Requests' token tensors ``[n_i, L_i, ...]`` as one ``[sum n_i, max L_i, ...]``,
    zero-padded on the right (the attention mask's zeros hide the padding)."""
    width = max(part.shape[1] for part in parts)
    if all(part.shape[1] == width for part in parts):
        return np.concatenate(parts)
    first = parts[0]
    merged = np.zeros((sum(len(p) for p in parts), width, *first.shape[2:]), first.dtype)
    row = 0
    for part in parts:
        merged[row:row + len(part), : part.shape[1]] = part
        row += len(part)
    return merged


def _scatter(batch: list[Pending], outputs: Outputs) -> None:
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


async def _one_by_one(instance: Instance, batch: list[Pending]) -> None:
    for index, item in enumerate(batch):
        if item.future.done():
            continue
        try:
            outputs = await instance.run(item.inputs)
        except asyncio.CancelledError:
            _fail_all(batch[index:], UnavailableError("model version unloaded"))
            raise
        except Exception as exc:
            _fail(item, exc)
        else:
            _resolve(item, outputs)


def _fail(item: Pending, exc: Exception) -> None:
    """The request's error: a domain error as it is (bad input stays a 400), anything
    else an internal error logged with its traceback."""
    if not isinstance(exc, TurboinferError):
        log.error("the engine failed on a request", exc_info=exc)
        exc = InferenceError(f"the engine failed: {exc}")
    if not item.future.done():
        item.future.set_exception(exc)


def _fail_all(batch: list[Pending], error: Exception) -> None:
    for item in batch:
        if not item.future.done():
            item.future.set_exception(error)


def _resolve(item: Pending, outputs: Outputs) -> None:
    if not item.future.done():  # the waiter may have been cancelled (client went away)
        item.future.set_result(outputs)
