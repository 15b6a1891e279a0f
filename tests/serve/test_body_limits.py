"""Memory under hostile input: JSON parsing near the body's size, a smaller limit for
all-JSON bodies than binary ones, and a cap on body bytes in flight (503 at once)."""

from __future__ import annotations

import asyncio
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from turboinfer.serve.app import create_app
from turboinfer.serve.config import ModelConfig, write_entry
from turboinfer.serve.core import ServerCore, ServerSettings
from turboinfer.serve.metrics import Metrics
from turboinfer.serve.protocol import decode_request
from turboinfer.serve.repository import Repository
from turboinfer.serve.sources import scan_directory

KIB = 1024
PATH = "/v2/models/affine/infer"


def _json_body(rows: int) -> bytes:
    data = np.random.default_rng(0).random((rows, 16)).astype(np.float32).round(4)
    return orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32",
                                     "shape": [rows, 16], "data": data.tolist()}]})


def _binary_body(rows: int) -> tuple[bytes, int]:
    header = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32",
                                       "shape": [rows, 16],
                                       "parameters": {"binary_data_size": rows * 64}}]})
    return header + bytes(rows * 64), len(header)


def test_json_tensor_parsing_peaks_near_the_body_size() -> None:
    body = _json_body(60_000)  # ~10 MB of JSON
    tracemalloc.start()
    try:
        decode_request(body, None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * len(body), f"peak {peak / len(body):.1f}x the body"


async def _call(app: Any, body: bytes, header_length: int | None = None
                ) -> tuple[int, dict[bytes, bytes]]:
    headers = [(b"content-length", str(len(body)).encode())]
    if header_length is not None:
        headers.append((b"inference-header-content-length", str(header_length).encode()))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": PATH, "raw_path": PATH.encode(),
             "root_path": "", "query_string": b"", "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 8000), "headers": headers}
    incoming = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent[0]["status"], dict(sent[0]["headers"])


async def _core(root: Path, settings: ServerSettings) -> ServerCore:
    metrics = Metrics()
    repository = Repository(scan_directory(root), metrics, root=root)
    await repository.load_all()
    core = ServerCore(settings, repository, metrics)
    core.started = True
    return core


@pytest.fixture
def root(tmp_path: Path, model_files: dict[str, Path]) -> Path:
    write_entry(tmp_path / "repo", "affine", model_files["affine1"], ModelConfig())
    return tmp_path / "repo"


def test_an_all_json_body_has_a_smaller_limit_than_a_binary_one(root: Path) -> None:
    settings = ServerSettings(repository=root, grpc_port=None, max_json_body_bytes=64 * KIB,
                              max_body_bytes=1024 * KIB)

    async def scenario() -> None:
        core = await _core(root, settings)
        app = create_app(core)
        try:
            json_body = _json_body(1000)  # ~100 KiB
            assert len(json_body) > settings.max_json_body_bytes
            assert (await _call(app, json_body))[0] == 413
            binary, header = _binary_body(2000)  # ~128 KiB
            assert (await _call(app, binary, header))[0] == 200
        finally:
            await core.close()

    asyncio.run(scenario())


def test_body_bytes_in_flight_over_the_cap_are_refused_at_once(
        root: Path, hold: Callable[[Any], threading.Event]) -> None:
    settings = ServerSettings(repository=root, grpc_port=None, max_json_body_bytes=64 * KIB,
                              max_body_bytes=64 * KIB, max_body_bytes_in_flight=100 * KIB)

    async def scenario() -> None:
        core = await _core(root, settings)
        app = create_app(core)
        gate = hold(core.repository.get("affine", None))
        try:
            body, header = _binary_body(900)  # ~58 KiB: one fits, two do not
            first = asyncio.create_task(_call(app, body, header))
            while core.in_flight == 0:
                await asyncio.sleep(0.01)
            status, headers = await _call(app, body, header)
            assert status == 503 and b"retry-after" in headers
            gate.set()
            assert (await first)[0] == 200
            assert (await _call(app, body, header))[0] == 200  # the bytes were given back
        finally:
            gate.set()
            await core.close()

    asyncio.run(scenario())
