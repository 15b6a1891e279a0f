"""A minimal Open Inference Protocol v2 server on loopback, with knobs for misbehaving.

It answers metadata, config, JSON and binary infer, and ``/metrics`` in either
turboinfer's or Triton's naming, and can stall once, answer errors, die after N requests
or leak memory, so the load tool's verdicts can be checked against known behaviour.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from real_server import RealServer, serve_repository

MODEL = "linear"
METADATA = {
    "name": MODEL,
    "versions": ["1"],
    "platform": "onnxruntime_onnx",
    "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 16]}],
    "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 4]}],
}
MAX_BATCH = 8


@dataclass
class ServerState:
    fail_status: int = 0          # answer every infer with this status
    fail_after: int = -1          # ...or only after this many requests
    stall_after: int = -1         # the request number that starts a server-wide stall
    stall_s: float = 0.0
    delay_s: float = 0.0          # every infer takes this long, one at a time
    batch_every: int = 2          # pretend every N requests ran as one execution
    leak_per_request: int = 0     # bytes the reported memory grows per request
    metrics_style: str = "turboinfer"   # or "triton", or "none"
    requests: int = 0
    stall_until: float = 0.0
    counters: dict[str, float] = field(default_factory=dict)
    # One execution at a time, as a single model instance: delay_s sets the capacity.
    instance: asyncio.Lock = field(default_factory=asyncio.Lock)

    def bump(self, name: str, value: float = 1.0) -> None:
        self.counters[name] = self.counters.get(name, 0.0) + value


def _error(status: int, message: str) -> Response:
    return Response(orjson.dumps({"error": message}), status, media_type="application/json")


def build_app(state: ServerState) -> Starlette:
    async def metadata(request: Request) -> Response:
        if request.path_params["model"] != MODEL:
            return _error(404, f"unknown model {request.path_params['model']!r}")
        return Response(orjson.dumps(METADATA), media_type="application/json")

    async def config(request: Request) -> Response:
        if request.path_params["model"] != MODEL:
            return _error(404, "unknown model")
        return Response(orjson.dumps({"name": MODEL, "max_batch_size": MAX_BATCH}),
                        media_type="application/json")

    async def infer(request: Request) -> Response:
        return await _infer(state, request)

    async def metrics(request: Request) -> Response:
        if state.metrics_style == "none":
            return _error(404, "no metrics")
        return Response(_metrics_text(state), media_type="text/plain")

    return Starlette(routes=[
        Route("/v2/models/{model}", metadata),
        Route("/v2/models/{model}/config", config),
        Route("/v2/models/{model}/infer", infer, methods=["POST"]),
        Route("/metrics", metrics),
    ])


async def _infer(state: ServerState, request: Request) -> Response:
    arrived = time.perf_counter()
    if request.path_params["model"] != MODEL:
        return _error(404, f"unknown model {request.path_params['model']!r}")
    state.requests += 1
    if state.requests == state.stall_after:
        state.stall_until = arrived + state.stall_s
    if arrived < state.stall_until:
        await asyncio.sleep(state.stall_until - arrived)
    if state.delay_s:
        async with state.instance:
            await asyncio.sleep(state.delay_s)
    if state.fail_status and state.requests > state.fail_after:
        state.bump("failure")
        return _error(state.fail_status, "model exploded")
    body = await request.body()
    try:
        batch, binary = _decode(request, body)
    except (ValueError, KeyError) as exc:
        state.bump("failure")
        return _error(400, str(exc))
    _count_success(state, batch, time.perf_counter() - arrived)
    return _encode_logits(batch, binary)


def _decode(request: Request, body: bytes) -> tuple[int, bool]:
    header_length = request.headers.get("inference-header-content-length")
    header = orjson.loads(body[:int(header_length)] if header_length else body)
    (tensor,) = header["inputs"]
    if tensor["name"] != "input" or tensor["datatype"] != "FP32":
        raise ValueError(f"unexpected input {tensor['name']!r} {tensor['datatype']}")
    shape = tensor["shape"]
    if len(shape) != 2 or shape[1] != 16:
        raise ValueError(f"input shape {shape} does not match [-1, 16]")
    count = shape[0] * shape[1]
    if header_length:
        values = np.frombuffer(body[int(header_length):], dtype=np.float32)
    else:
        values = np.asarray(tensor["data"], dtype=np.float32)
    if values.size != count:
        raise ValueError(f"got {values.size} elements for shape {shape}")
    wants_binary = bool(header.get("parameters", {}).get("binary_data_output"))
    return int(shape[0]), wants_binary


def _encode_logits(batch: int, binary: bool) -> Response:
    logits = np.zeros((batch, 4), dtype=np.float32)
    out: dict[str, Any] = {"name": "logits", "datatype": "FP32", "shape": [batch, 4]}
    if not binary:
        out["data"] = logits.reshape(-1).tolist()
        doc = {"model_name": MODEL, "model_version": "1", "outputs": [out]}
        return Response(orjson.dumps(doc), media_type="application/json")
    out["parameters"] = {"binary_data_size": logits.nbytes}
    header = orjson.dumps({"model_name": MODEL, "model_version": "1", "outputs": [out]})
    return Response(header + logits.tobytes(), media_type="application/octet-stream",
                    headers={"Inference-Header-Content-Length": str(len(header))})


def _count_success(state: ServerState, batch: int, seconds: float) -> None:
    state.bump("success")
    state.bump("inferences", batch)
    if state.counters["success"] % state.batch_every == 0:
        state.bump("executions")
    state.bump("queue_s", seconds / 2)
    state.bump("compute_s", seconds / 2)


def _metrics_text(state: ServerState) -> str:
    c = state.counters.get
    memory = 100_000_000 + state.leak_per_request * state.requests
    labels = f'model="{MODEL}",version="1"'
    if state.metrics_style == "triton":
        lines = [
            f"nv_inference_request_success{{{labels}}} {c('success', 0)}",
            f"nv_inference_request_failure{{{labels}}} {c('failure', 0)}",
            f"nv_inference_count{{{labels}}} {c('inferences', 0)}",
            f"nv_inference_exec_count{{{labels}}} {c('executions', 0)}",
            f"nv_inference_queue_duration_us{{{labels}}} {c('queue_s', 0) * 1e6}",
            f"nv_inference_compute_infer_duration_us{{{labels}}} {c('compute_s', 0) * 1e6}",
            f"nv_cpu_memory_used_bytes {memory}",
        ]
        return "\n".join(lines) + "\n"
    lines = [
        "# TYPE turboinfer_inference_request_success counter",
        f"turboinfer_inference_request_success_total{{{labels}}} {c('success', 0)}",
        "# TYPE turboinfer_inference_request_failure counter",
        f'turboinfer_inference_request_failure_total{{{labels},reason="error"}} '
        f"{c('failure', 0)}",
        "# TYPE turboinfer_inference_count counter",
        f"turboinfer_inference_count_total{{{labels}}} {c('inferences', 0)}",
        "# TYPE turboinfer_inference_exec_count counter",
        f"turboinfer_inference_exec_count_total{{{labels}}} {c('executions', 0)}",
    ]
    for name, key in (("queue", "queue_s"), ("compute", "compute_s")):
        metric = f"turboinfer_inference_{name}_duration_seconds"
        lines += [f"# TYPE {metric} histogram",
                  f'{metric}_bucket{{{labels},le="+Inf"}} {c("success", 0)}',
                  f"{metric}_count{{{labels}}} {c('success', 0)}",
                  f"{metric}_sum{{{labels}}} {c(key, 0)}"]
    lines += ["# TYPE process_resident_memory_bytes gauge",
              f"process_resident_memory_bytes {memory}",
              "# TYPE process_cpu_seconds_total counter",
              f"process_cpu_seconds_total {time.process_time()}"]
    return "\n".join(lines) + "\n"


@dataclass
class OipServer:
    url: str
    state: ServerState
    port: int


def _serve(state: ServerState) -> Iterator[OipServer]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(build_app(state), log_level="error", access_log=False,
                            lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("test OIP server did not start")
        time.sleep(0.01)
    try:
        yield OipServer(f"http://127.0.0.1:{port}", state, port)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture(scope="session")
def _shared_server() -> Iterator[OipServer]:
    yield from _serve(ServerState())


@pytest.fixture
def oip_server(_shared_server: OipServer) -> OipServer:
    """The shared test server with its knobs and counters reset for this test."""
    state = _shared_server.state
    for name, value in vars(ServerState()).items():
        setattr(state, name, value)
    return _shared_server


@pytest.fixture
def dead_url() -> str:
    """A loopback URL where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"



@pytest.fixture(scope="module")
def real_server(linear_onnx: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[RealServer]:
    """``turboinfer serve`` in a subprocess over a one-model repository (``linear``)."""
    from turboinfer.serve.config import DynamicBatching, ModelConfig, write_entry

    repo = tmp_path_factory.mktemp("load-repo")
    write_entry(repo, MODEL, linear_onnx, ModelConfig(
        max_batch_size=MAX_BATCH, dynamic_batching=DynamicBatching(max_queue_delay_ms=1.0)))
    with serve_repository(repo, tmp_path_factory.mktemp("load-log") / "serve.log") as server:
        yield server
