"""The drain in process: a request inside finishes, new ones get 503 with Retry-After,
and errors leave every door in the one shape ``errors.reply_for`` gives them."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from turboinfer.errors import UnavailableError
from turboinfer.serve.app import create_app
from turboinfer.serve.config import ModelConfig, write_entry
from turboinfer.serve.core import ServerCore, ServerSettings
from turboinfer.serve.http_infer import InferEndpoint
from turboinfer.serve.metrics import Metrics
from turboinfer.serve.protocol import InferRequest
from turboinfer.serve.repository import Repository
from turboinfer.serve.sources import scan_directory

BODY = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16],
                                 "data": [0.0] * 16}]})


def _request() -> InferRequest:
    return InferRequest(inputs={"input": np.zeros((1, 16), np.float32)})


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


async def _call(app: InferEndpoint, method: str, path: str,
                body: bytes = b"") -> tuple[int, dict[bytes, bytes], Any]:
    """One request through the ASGI application, as uvicorn would make it."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "root_path": "", "query_string": b"", "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 8000),
             "headers": [(b"content-length", str(len(body)).encode())]}
    incoming = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    content = b"".join(m.get("body", b"") for m in sent[1:])
    return sent[0]["status"], dict(sent[0]["headers"]), orjson.loads(content)


async def _core(root: Path) -> ServerCore:
    metrics = Metrics()
    repository = Repository(scan_directory(root), metrics, root=root)
    await repository.load_all()
    core = ServerCore(ServerSettings(repository=root, grpc_port=None), repository, metrics)
    core.started = True
    return core


@pytest.fixture
def root(tmp_path: Path, model_files: dict[str, Path]) -> Path:
    write_entry(tmp_path / "repo", "affine", model_files["affine1"],
                ModelConfig(max_batch_size=8))
    return tmp_path / "repo"


def test_drain_lets_a_request_inside_finish_and_refuses_new_ones(
        root: Path, hold: Callable[[Any], threading.Event]) -> None:
    async def scenario() -> None:
        core = await _core(root)
        app = create_app(core)
        batches = hold(core.repository.get("affine"))  # the request stays inside
        inside = asyncio.create_task(core.infer("affine", None, _request()))
        await _until(lambda: core.in_flight == 1)
        drain = asyncio.create_task(core.drain(30.0))
        await _until(lambda: core.draining)
        with pytest.raises(UnavailableError, match="shutting down"):
            await core.infer("affine", None, _request())
        status, headers, body = await _call(app, "POST", "/v2/models/affine/infer", BODY)
        assert (status, headers[b"retry-after"]) == (503, b"1")
        assert "shutting down" in body["error"]
        status, headers, body = await _call(app, "GET", "/v2/health/ready")
        assert (status, headers[b"retry-after"], body) == (
            503, b"1", {"error": "server not ready: draining"})
        assert not drain.done()
        batches.set()
        _, outputs = await inside
        assert outputs["output"][0, 0] == 1.0
        assert await drain is True
        assert core.in_flight == 0
        await core.close()

    asyncio.run(scenario())


def test_drain_with_nothing_inside_returns_at_once(root: Path) -> None:
    async def scenario() -> None:
        core = await _core(root)
        assert await core.drain(0.0) is True
        assert not core.ready
        await core.close()

    asyncio.run(scenario())


def test_drain_deadline_passes_with_requests_still_inside(
        root: Path, hold: Callable[[Any], threading.Event]) -> None:
    async def scenario() -> None:
        core = await _core(root)
        served = core.repository.get("affine")
        batcher, batches = served.batcher, hold(served)
        running = asyncio.create_task(core.infer("affine", None, _request()))
        await _until(lambda: batcher.in_flight == 1 and batcher.pending == 0)
        wide = InferRequest(inputs={"input": np.zeros((8, 16), np.float32)})
        queued = asyncio.create_task(core.infer("affine", None, wide))
        await _until(lambda: core.in_flight == 2)
        assert await core.drain(0.0) is False
        await core.close()  # frees the models: the request still queued fails
        with pytest.raises(UnavailableError, match="unloaded"):
            await queued
        batches.set()  # the running batch is not cut short
        _, outputs = await running
        assert outputs["output"][0, 0] == 1.0

    asyncio.run(scenario())


def test_errors_leave_the_http_door_in_one_shape(root: Path) -> None:
    async def scenario() -> None:
        core = await _core(root)
        app = create_app(core)
        status, headers, body = await _call(app, "POST", "/v2/models/nope/infer", BODY)
        assert (status, body) == (404, {"error": "unknown model 'nope'"})
        assert b"retry-after" not in headers
        status, _, body = await _call(app, "GET", "/v2/models/nope/ready")
        assert (status, body) == (404, {"error": "unknown model 'nope'"})
        status, _, body = await _call(app, "GET", "/v2/models/nope")
        assert (status, body) == (404, {"error": "unknown model 'nope'"})
        status, _, body = await _call(app, "POST", "/v2/models/affine/infer", b"{")
        assert status == 400 and body["error"]
        await core.close()

    asyncio.run(scenario())
