"""Idle unload: zero instances after ``idle_unload_s``, reloaded by the next request,
which waits for it; the cold start is logged and in /metrics."""

from __future__ import annotations

import asyncio
import gc
import logging
import shutil
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from turboinfer.errors import UnavailableError
from turboinfer.serve.config import ModelConfig, write_entry
from turboinfer.serve.core import ServerCore, ServerSettings
from turboinfer.serve.metrics import Metrics
from turboinfer.serve.protocol import InferRequest
from turboinfer.serve.repository import Repository
from turboinfer.serve.sources import scan_directory

if TYPE_CHECKING:
    from conftest import Server

IDLE = ModelConfig(max_batch_size=8, idle_unload_s=0.3)


def _request() -> InferRequest:
    return InferRequest(inputs={"input": np.full((1, 16), 3.0, np.float32)})


async def _until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def _core(root: Path) -> ServerCore:
    metrics = Metrics()
    repository = Repository(scan_directory(root), metrics, root=root, drain_timeout_s=5)
    core = ServerCore(ServerSettings(repository=root), repository, metrics)
    core.started = True
    return core


def _sample(core: ServerCore, name: str, **labels: str) -> float | None:
    return core.metrics.registry.get_sample_value(name, labels)


def test_idle_version_unloads_to_zero_and_the_next_requests_wait_for_the_reload(
        tmp_path: Path, model_files: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="turboinfer.serve.autoscale")
    root = tmp_path / "repo"
    write_entry(root, "affine", model_files["affine1"], IDLE)

    async def scenario() -> None:
        core = _core(root)
        await core.repository.load_all()
        served, outputs = await core.infer("affine", None, _request())
        assert outputs["output"][0, 0] == 7.0  # 2 * 3 + 1
        session = weakref.ref(served.pool.instances[0].session)
        await _until(lambda: not served.pool.instances)
        labels = {"model": "affine", "version": "1"}
        await _until(lambda: _sample(core, "turboinfer_instances", **labels) == 0.0)
        # The engine session is freed, not merely set aside.
        await _until(lambda: gc.collect() >= 0 and session() is None)
        # The model still answers for its metadata and readiness while unloaded.
        assert core.model_ready("affine", None)
        assert core.model_metadata("affine", None)["inputs"][0]["name"] == "input"
        # Several requests at once after idle: all wait for one reload, none fails.
        results = await asyncio.gather(*(core.infer("affine", None, _request())
                                         for _ in range(5)))
        assert all(out["output"][0, 0] == 7.0 for _, out in results)
        assert len(served.pool.instances) == 1
        assert _sample(core, "turboinfer_cold_start_seconds_count", **labels) == 1.0
        last = _sample(core, "turboinfer_last_cold_start_seconds", **labels)
        assert last is not None and last > 0
        assert _sample(core, "turboinfer_scale_events_total", model="affine",
                       direction="down", reason="idle") == 1.0
        assert _sample(core, "turboinfer_scale_events_total", model="affine",
                       direction="up", reason="cold_start") == 1.0
        # Used again, so it idles again: the cycle repeats.
        await _until(lambda: not served.pool.instances)
        _, outputs = await core.infer("affine", None, _request())
        assert outputs["output"][0, 0] == 7.0
        assert _sample(core, "turboinfer_cold_start_seconds_count", **labels) == 2.0
        await core.close()

    asyncio.run(scenario())
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("idle unload affine version 1: no request for") and "1 -> 0" in m
               for m in messages)
    assert any(m.startswith("cold start affine version 1: 0 -> 1 instance(s)") for m in messages)


def test_a_version_in_use_is_not_unloaded(tmp_path: Path,
                                          model_files: dict[str, Path]) -> None:
    root = tmp_path / "repo"
    write_entry(root, "affine", model_files["affine1"], IDLE)

    async def scenario() -> None:
        core = _core(root)
        await core.repository.load_all()
        served = core.repository.get("affine")
        end = time.monotonic() + 1.5  # five idle timeouts, with a request every 50 ms
        while time.monotonic() < end:
            await core.infer("affine", None, _request())
            await asyncio.sleep(0.05)
        assert len(served.pool.instances) == 1
        assert _sample(core, "turboinfer_scale_events_total", model="affine",
                       direction="down", reason="idle") is None
        await core.close()

    asyncio.run(scenario())


def test_a_reload_that_fails_after_idle_fails_the_waiting_request(
        tmp_path: Path, model_files: dict[str, Path]) -> None:
    root = tmp_path / "repo"
    write_entry(root, "affine", model_files["affine1"], IDLE)

    async def scenario() -> None:
        core = _core(root)
        await core.repository.load_all()
        served = core.repository.get("affine")
        await _until(lambda: not served.pool.instances)
        shutil.rmtree(root / "affine" / "1")  # the model file is gone meanwhile
        with pytest.raises(UnavailableError):
            await asyncio.wait_for(core.infer("affine", None, _request()), 30)
        index = {m["name"]: m for m in core.repository_index()}
        assert "reload after idle unload failed" in index["affine"]["reason"]
        await core.close()

    asyncio.run(scenario())


@pytest.mark.slow
def test_idle_unload_over_http(tmp_path: Path, model_files: dict[str, Path],
                               launch: Callable[..., Server]) -> None:
    root = tmp_path / "repo"
    write_entry(root, "affine", model_files["affine1"], IDLE)
    server = launch(root, tmp_path / "server.log", cli=True)
    try:
        series = 'turboinfer_instances{model="affine",version="1"}'

        def metrics() -> str:
            return server.request("GET", "/metrics")[1].decode()

        deadline = time.monotonic() + 30
        while f"{series} 0.0" not in metrics():
            assert time.monotonic() < deadline, "the model was not unloaded"
            time.sleep(0.05)
        status, body = server.post_json("/v2/models/affine/infer", {"inputs": [
            {"name": "input", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]})
        assert status == 200 and body["outputs"][0]["data"][0] == 3.0
        text = metrics()
        assert 'turboinfer_cold_start_seconds_count{model="affine",version="1"} 1.0' in text
        assert 'turboinfer_scale_events_total{direction="up",model="affine",' \
               'reason="cold_start"} 1.0' in text
    finally:
        assert server.stop() == 0
    log = (tmp_path / "server.log").read_text()
    assert "idle unload affine version 1" in log and "cold start affine version 1" in log
