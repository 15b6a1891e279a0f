"""Autoscaling in a real repository: a real ONNX model on real instances, real load.

The windows and cool-downs are short so that the tests are quick; what is asserted is
the behaviour (the count goes up, settles, comes down; no request fails), never speed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from turboinfer.serve.config import AutoscalingConfig, ModelConfig, write_entry
from turboinfer.serve.metrics import Metrics
from turboinfer.serve.protocol import InferRequest
from turboinfer.serve.repository import Repository
from turboinfer.serve.sources import scan_directory
from turboinfer.serve.version import ServedVersion

FAST = AutoscalingConfig(enabled=True, min_instances=1, max_instances=2,
                         scale_up_window_s=0.4, scale_down_window_s=0.6, cooldown_s=0.3)


def _request() -> InferRequest:
    return InferRequest(inputs={"input": np.ones((1, 512), np.float32)})


async def _until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


class ClosedLoop:
    """``workers`` coroutines sending back to back: more than one instance can serve."""

    def __init__(self, repo: Repository, workers: int = 4) -> None:
        self.repo, self.ok = repo, 0
        self.errors: list[Exception] = []
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._worker()) for _ in range(workers)]

    async def _worker(self) -> None:
        while not self._stop.is_set():
            try:
                outputs = await self.repo.get("slow").infer(_request())
                assert outputs["output"].shape == (1, 512)
                self.ok += 1
            except Exception as exc:  # recorded: the test asserts there are none
                self.errors.append(exc)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


def _repo(root: Path, slow: Path, autoscaling: AutoscalingConfig = FAST,
          **config: object) -> Repository:
    write_entry(root, "slow", slow, ModelConfig(autoscaling=autoscaling, **config))  # type: ignore[arg-type]
    repo = Repository(scan_directory(root), Metrics(), root=root, drain_timeout_s=5)
    repo.autoscaler.cores = 2  # the cap does not depend on the machine the tests run on
    return repo


def _events(repo: Repository, direction: str, reason: str) -> float:
    value = repo.metrics.registry.get_sample_value(
        "turboinfer_scale_events_total",
        {"model": "slow", "direction": direction, "reason": reason})
    return value or 0.0


def _instances_gauge(repo: Repository) -> float | None:
    return repo.metrics.registry.get_sample_value("turboinfer_instances",
                                                  {"model": "slow", "version": "1"})


def test_scales_up_under_load_and_down_when_quiet(
        tmp_path: Path, model_files: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="turboinfer.serve.autoscale")

    async def scenario() -> None:
        repo = _repo(tmp_path / "repo", model_files["slow"])
        await repo.load_all()
        served = repo.get("slow")
        assert len(served.pool.instances) == 1 and served.pool.threads == 2
        load = ClosedLoop(repo)
        await _until(lambda: len(served.pool.instances) == 2)
        # The cores are split: two instances of one intra-op thread each.
        assert [i.threads for i in served.pool.instances] == [1, 1]
        await asyncio.sleep(0.5)  # serve a while on the new layout
        await load.stop()
        await _until(lambda: len(served.pool.instances) == 1)
        assert served.pool.threads == 2
        await _until(lambda: _instances_gauge(repo) == 1.0)
        assert load.errors == [] and load.ok > 0
        assert _events(repo, "up", "cpu_utilization") == 1.0
        assert _events(repo, "down", "low_rate") == 1.0
        await repo.close()

    asyncio.run(scenario())
    lines = [r.getMessage() for r in caplog.records if "autoscale slow" in r.getMessage()]
    up = next(line for line in lines if " up 1 -> 2 " in line)
    assert "(cpu_utilization)" in up and "busy" in up and ">= 0.70" in up and "qps" in up
    down = next(line for line in lines if " down 2 -> 1 " in line)
    assert "(low_rate)" in down and "< 5 qps" in down


@pytest.mark.slow
def test_constant_overload_settles_then_makes_no_more_events(
        tmp_path: Path, model_files: dict[str, Path]) -> None:
    async def scenario() -> None:
        repo = _repo(tmp_path / "repo", model_files["slow"])
        await repo.load_all()
        served = repo.get("slow")
        load = ClosedLoop(repo)
        await _until(lambda: len(served.pool.instances) == 2)
        settled_up = _events(repo, "up", "cpu_utilization")
        # The rest of the window: ~10 cool-downs and windows, room for any flapping.
        for _ in range(15):
            await asyncio.sleep(0.2)
            assert len(served.pool.instances) == 2
        await load.stop()
        assert settled_up == 1.0
        assert _events(repo, "up", "cpu_utilization") == settled_up
        assert _events(repo, "down", "low_rate") == 0.0
        assert load.errors == []
        await repo.close()

    asyncio.run(scenario())


def test_no_request_is_lost_while_instances_come_and_go(
        tmp_path: Path, model_files: dict[str, Path]) -> None:
    """Resize back and forth under load (far faster than any policy would)."""
    async def scenario() -> None:
        repo = _repo(tmp_path / "repo", model_files["slow"],
                     autoscaling=AutoscalingConfig(), max_batch_size=4)
        await repo.load_all()
        served: ServedVersion = repo.get("slow")
        load = ClosedLoop(repo, workers=6)
        for count, threads in [(2, 1), (1, 2), (2, 1), (1, 1), (2, 1), (1, 2)]:
            before = load.ok
            await served.pool.resize(count, threads)
            assert len(served.pool.instances) == count
            await _until(lambda: load.ok > before + 5)  # noqa: B023 - read at once
        await load.stop()
        assert load.errors == [] and load.ok > 30
        await repo.close()

    asyncio.run(scenario())


def test_threads_fixed_by_the_config_bound_the_instances(
        tmp_path: Path, model_files: dict[str, Path]) -> None:
    from turboinfer.serve.config import EngineSettingsConfig  # why: only this test needs it

    async def scenario() -> None:
        repo = _repo(tmp_path / "repo", model_files["slow"],
                     autoscaling=FAST.model_copy(update={"max_instances": None}),
                     engine_settings=EngineSettingsConfig(intra_op_threads=2))
        await repo.load_all()
        served = repo.get("slow")
        load = ClosedLoop(repo)
        # Two cores at two threads each: one instance is the cap, so the load holds it.
        await _until(lambda: _instances_gauge(repo) == 1.0)
        await asyncio.sleep(1.5)
        await load.stop()
        assert len(served.pool.instances) == 1 and served.pool.threads == 2
        assert _events(repo, "up", "cpu_utilization") == 0.0
        assert load.errors == []
        await repo.close()

    asyncio.run(scenario())
