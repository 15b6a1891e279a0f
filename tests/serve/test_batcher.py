"""The batcher against a scripted session: batching, splitting, priorities, limits."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from turboinfer.engines import TensorSpec
from turboinfer.errors import InferenceError, UnavailableError
from turboinfer.serve.batch_queue import BatchQueue
from turboinfer.serve.batcher import Batcher, BatchingSettings
from turboinfer.serve.instances import InstancePool, split_threads


class ScriptedSession:
    """Doubles its input; records each batch; can be held at a gate or made to fail."""

    def __init__(self) -> None:
        self.batches: list[np.ndarray] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False

    @property
    def inputs(self) -> list[TensorSpec]:
        return [TensorSpec("x", np.dtype("float32"), ("batch", 2))]

    @property
    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec("y", np.dtype("float32"), ("batch", 2))]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.gate.wait(5)
        x = feeds["x"]
        self.batches.append(x.copy())
        if self.fail:
            raise RuntimeError("device lost")
        return {"y": x * 2}


def rows(value: float, count: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.full((count, 2), value, dtype=np.float32)}


async def _until(condition: object, timeout: float = 5.0) -> None:
    deadline = time.perf_counter() + timeout
    while not condition():  # type: ignore[operator]
        assert time.perf_counter() < deadline, "condition not reached"
        await asyncio.sleep(0.001)


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def make(settings: BatchingSettings, sessions: int = 1
         ) -> tuple[Batcher, list[ScriptedSession]]:
    scripted = [ScriptedSession() for _ in range(sessions)]
    batcher = Batcher(InstancePool(list(scripted)), settings)
    batcher.start()
    return batcher, scripted


def test_requests_arriving_while_busy_form_one_batch_split_back() -> None:
    async def scenario() -> None:
        batcher, (session,) = make(BatchingSettings(max_batch_size=8))
        session.gate.clear()
        first = asyncio.create_task(batcher.submit(rows(0), 1))
        # The first batch is running.
        await _until(lambda: batcher.in_flight == 1 and batcher.pending == 0)
        waiting = [asyncio.create_task(batcher.submit(rows(i, count=i), i)) for i in (1, 2, 3)]
        await _until(lambda: batcher.pending == 3)
        session.gate.set()
        await first
        results = await asyncio.gather(*waiting)
        assert [b.shape[0] for b in session.batches] == [1, 6]
        for i, result in zip((1, 2, 3), results, strict=True):
            np.testing.assert_array_equal(result["y"], np.full((i, 2), 2.0 * i))
        await batcher.close()

    run(scenario())


def test_queue_delay_collects_up_to_max_batch_size() -> None:
    async def scenario() -> None:
        batcher, (session,) = make(BatchingSettings(max_batch_size=4, max_queue_delay_s=30.0))
        start = time.perf_counter()
        results = await asyncio.gather(*(batcher.submit(rows(i), 1) for i in range(4)))
        # The batch was full long before the 30 s delay ran out: no waiting for it.
        assert time.perf_counter() - start < 15.0
        assert [b.shape[0] for b in session.batches] == [4]
        assert [float(r["y"][0, 0]) for r in results] == [0.0, 2.0, 4.0, 6.0]
        await batcher.close()

    run(scenario())


def test_higher_priority_leaves_first() -> None:
    async def scenario() -> None:
        batcher, (session,) = make(BatchingSettings(max_batch_size=0))
        session.gate.clear()
        blocker = asyncio.create_task(batcher.submit(rows(-1), 1))
        await _until(lambda: batcher.in_flight == 1 and batcher.pending == 0)
        low = [asyncio.create_task(batcher.submit(rows(i), 1, priority=0)) for i in (1, 2)]
        high = asyncio.create_task(batcher.submit(rows(9), 1, priority=5))
        await _until(lambda: batcher.pending == 3)
        session.gate.set()
        await asyncio.gather(blocker, high, *low)
        assert [float(b[0, 0]) for b in session.batches] == [-1, 9, 1, 2]
        await batcher.close()

    run(scenario())


def test_full_queue_rejects_at_once_and_timeouts_expire() -> None:
    async def scenario() -> None:
        batcher, (session,) = make(BatchingSettings(max_batch_size=0, max_queue_size=2))
        session.gate.clear()
        running = asyncio.create_task(batcher.submit(rows(0), 1))
        await _until(lambda: batcher.in_flight == 1 and batcher.pending == 0)
        queued = [asyncio.create_task(batcher.submit(rows(i), 1, timeout_s=0.05))
                  for i in (1, 2)]
        await _until(lambda: batcher.pending == 2)
        with pytest.raises(UnavailableError, match="queue full"):
            await batcher.submit(rows(3), 1)
        assert not running.done()  # rejected while the instance was still busy: no waiting
        await asyncio.sleep(0.1)
        assert all(task.done() for task in queued)  # expired while the instance was busy
        session.gate.set()
        await running
        for task in queued:
            with pytest.raises(UnavailableError, match="timed out"):
                await task
        await batcher.close()

    run(scenario())


def test_a_failing_batch_fails_every_request() -> None:
    async def scenario() -> None:
        batcher, (session,) = make(BatchingSettings(max_batch_size=8))
        session.gate.clear()
        session.fail = True
        tasks = [asyncio.create_task(batcher.submit(rows(i), 1)) for i in range(3)]
        await asyncio.sleep(0.01)
        session.gate.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, InferenceError) and "device lost" in str(r) for r in results)
        session.fail = False
        assert float((await batcher.submit(rows(1), 1))["y"][0, 0]) == 2.0
        await batcher.close()

    run(scenario())


def test_incompatible_shapes_never_share_a_batch() -> None:
    async def scenario() -> None:
        batcher, (session,) = make(BatchingSettings(max_batch_size=8))
        session.gate.clear()
        first = asyncio.create_task(batcher.submit(rows(0), 1))
        await _until(lambda: batcher.in_flight == 1 and batcher.pending == 0)
        wide = {"x": np.ones((1, 3), np.float32)}
        tasks = [asyncio.create_task(batcher.submit(feeds, 1))
                 for feeds in (rows(1), wide, rows(2))]
        await _until(lambda: batcher.pending == 3)
        session.gate.set()
        await asyncio.gather(first, *tasks)
        assert [b.shape for b in session.batches] == [(1, 2), (2, 2), (1, 3)]
        await batcher.close()

    run(scenario())


def test_instances_run_batches_in_parallel() -> None:
    async def scenario() -> None:
        batcher, sessions = make(BatchingSettings(max_batch_size=1), sessions=2)
        for session in sessions:
            session.gate.clear()
        tasks = [asyncio.create_task(batcher.submit(rows(i), 1)) for i in range(2)]
        # Both instances busy at once: two batches running, none waiting.
        await _until(lambda: batcher.in_flight == 2 and batcher.pending == 0)
        for session in sessions:
            session.gate.set()
        await asyncio.gather(*tasks)
        assert sorted(len(s.batches) for s in sessions) == [1, 1]
        await batcher.drain(1.0)
        with pytest.raises(UnavailableError):
            await batcher.submit(rows(0), 1)

    run(scenario())


def test_split_threads() -> None:
    assert split_threads(1, 8) == 8
    assert split_threads(3, 8) == 2
    assert split_threads(4, 2) == 1


def test_a_dead_dispatcher_fails_requests_instead_of_hanging(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: BatchQueue) -> list[object]:
        raise RuntimeError("bug")

    async def scenario() -> None:
        batcher, _ = make(BatchingSettings(max_batch_size=4))
        monkeypatch.setattr(BatchQueue, "take", broken)
        with pytest.raises(InferenceError, match="dispatcher stopped"):
            await asyncio.wait_for(batcher.submit(rows(1), 1), 5)
        with pytest.raises(UnavailableError):
            await batcher.submit(rows(1), 1)
        await batcher.close()

    run(scenario())


def test_drain_finishes_queued_and_running_requests_and_refuses_new_ones() -> None:
    async def scenario() -> None:
        batcher, (session,) = make(BatchingSettings(max_batch_size=0))
        session.gate.clear()
        tasks = [asyncio.create_task(batcher.submit(rows(i), 1)) for i in range(3)]
        await _until(lambda: batcher.in_flight == 3 and batcher.pending == 2)
        drain = asyncio.create_task(batcher.drain(30.0))
        await asyncio.sleep(0)
        with pytest.raises(UnavailableError, match="being unloaded"):
            await batcher.submit(rows(9), 1)
        assert not drain.done()  # one running, two queued: the drain waits for them
        session.gate.set()
        results = await asyncio.gather(*tasks)
        await drain
        assert [float(r["y"][0, 0]) for r in results] == [0.0, 2.0, 4.0]
        assert batcher.in_flight == 0

    run(scenario())


def test_drain_past_its_deadline_fails_what_is_still_queued() -> None:
    async def scenario() -> None:
        batcher, (session,) = make(BatchingSettings(max_batch_size=0))
        session.gate.clear()
        running = asyncio.create_task(batcher.submit(rows(1), 1))
        await _until(lambda: batcher.in_flight == 1 and batcher.pending == 0)
        queued = asyncio.create_task(batcher.submit(rows(2), 1))
        await _until(lambda: batcher.pending == 1)
        await batcher.drain(0.0)
        with pytest.raises(UnavailableError, match="unloaded"):
            await queued
        session.gate.set()  # a batch already running is not cut short
        assert float((await running)["y"][0, 0]) == 2.0

    run(scenario())
