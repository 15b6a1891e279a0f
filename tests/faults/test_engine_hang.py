"""Fault: an engine that hangs past the request timeout, against a real ``turboinfer serve``.

The model runs an ONNX ``Loop`` of MatMuls as many times as its ``spin`` input asks, so
one request can hold its instance's thread inside ONNX Runtime for seconds, as a hung
engine would. Such a request gets its timeout error (504 over HTTP, DEADLINE_EXCEEDED
over gRPC) once its deadline passes, while the engine goes on in the background; the
other instance serves the steady load meanwhile; with every instance stuck, a request
whose deadline passes in the queue times out too, and one without a short deadline is
answered once an instance is free again; stopped while a hung run goes on, the server
exits cleanly. Prints requests sent / answered / failed and the server's RSS before /
peak / after.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import onnx
import orjson
import psutil
import pytest
from fault_helpers import RssWatch, serve_fixtures
from onnx import TensorProto, helper, numpy_helper
from tritonclient.grpc import service_pb2, service_pb2_grpc

from turboinfer.serve.config import (
    DynamicBatching,
    EngineSettingsConfig,
    ModelConfig,
    write_entry,
)

if TYPE_CHECKING:
    from conftest import Server

start_server = serve_fixtures.start_server

WIDTH, ROWS = 256, 64  # each Loop trip: a [64, 256] x [256, 256] MatMul, well under 1 ms
TIMEOUT_MS = 100  # the model's default_timeout_ms: a twentieth of a hang
LONG_TIMEOUT_US = 60_000_000  # what the steady clients ask for: never reached
CALIBRATION_TRIPS, CALIBRATION_RUNS, HANG_S = 1000, 3, 2.0
STEADY_CLIENTS, AFTER_TIMEOUT = 2, 5  # requests each steady client completes after the 504
# Two single-threaded instances, batching off: a hung request holds one instance only.
CONFIG = ModelConfig(max_batch_size=0, instances=2,
                     engine_settings=EngineSettingsConfig(intra_op_threads=1),
                     dynamic_batching=DynamicBatching(default_timeout_ms=TIMEOUT_MS))
INFER = "/v2/models/spin/infer"
CLIENT_TIMEOUT_S = 60.0  # only so that a lost answer cannot hang the test


def make_spin_onnx(path: Path) -> Path:
    """``output = mean(tanh(... tanh(v0 @ w) ... @ w))`` with ``spin[0]`` MatMul rounds."""
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
    state = [ROWS, WIDTH]
    body = helper.make_graph(
        [helper.make_node("MatMul", ["v_in", "w"], ["product"]),
         helper.make_node("Tanh", ["product"], ["v_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "spin_round",
        [helper.make_tensor_value_info("trip", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, state)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, state)])
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["spin", "scalar"], ["trips"]),
         helper.make_node("Loop", ["trips", "true", "v0"], ["v"], body=body),
         helper.make_node("ReduceMean", ["v"], ["output"], axes=[0], keepdims=1)],
        "spin",
        [helper.make_tensor_value_info("spin", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, WIDTH])],
        initializer=[numpy_helper.from_array(weight, "w"),
                     numpy_helper.from_array(np.array([], np.int64), "scalar"),
                     numpy_helper.from_array(np.array(True), "true"),
                     numpy_helper.from_array(np.ones(state, np.float32), "v0")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _body(trips: int, timeout_us: int | None = None) -> bytes:
    request: dict[str, Any] = {"inputs": [{"name": "spin", "datatype": "INT64",
                                           "shape": [1], "data": [trips]}]}
    if timeout_us is not None:
        request["parameters"] = {"timeout": timeout_us}
    return orjson.dumps(request)


def _post(connection: http.client.HTTPConnection, body: bytes) -> tuple[int, Any]:
    connection.request("POST", INFER, body)
    response = connection.getresponse()
    return response.status, orjson.loads(response.read())


def _post_once(port: int, body: bytes) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_TIMEOUT_S)
    try:
        return _post(connection, body)
    finally:
        connection.close()


class Steady:
    """Closed-loop clients of one-trip requests with a long deadline, until stopped."""

    def __init__(self, port: int, clients: int) -> None:
        self.port = port
        self.statuses: list[list[int]] = [[] for _ in range(clients)]
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(s,), daemon=True)
                        for s in self.statuses]

    def _run(self, statuses: list[int]) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port,
                                                timeout=CLIENT_TIMEOUT_S)
        try:
            while not self.stop.is_set():
                statuses.append(_post(connection, _body(1, LONG_TIMEOUT_US))[0])
        finally:
            connection.close()

    def answered(self) -> list[int]:
        return [len(s) for s in self.statuses]

    def wait_each(self, counts: list[int]) -> None:
        """Until each client has at least ``counts[i]`` answers (or stopped early)."""
        _until(lambda: all(len(s) >= n or not t.is_alive() for s, n, t in
                           zip(self.statuses, counts, self.threads, strict=True)))

    def finish(self) -> list[int]:
        self.stop.set()
        for thread in self.threads:
            thread.join(CLIENT_TIMEOUT_S)
        return [status for statuses in self.statuses for status in statuses]


def _until(condition: Callable[[], bool], limit_s: float = CLIENT_TIMEOUT_S) -> None:
    """Poll ``condition``; the limit only keeps a broken server from hanging the test."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def _runs(server: Server) -> tuple[int, int]:
    """(batches the engine finished, requests answered 200) of the spin model. With
    batching off and no request in flight, they differ by the hung runs that ended."""
    status, body = server.request("GET", "/v2/models/spin/stats")
    assert status == 200
    stats = orjson.loads(body)["model_stats"][0]
    return stats["execution_count"], stats["inference_stats"]["success"]["count"]


def _ended(server: Server) -> int:
    """Hung runs that have ended (no other request in flight)."""
    executions, successes = _runs(server)
    return executions - successes


def _grpc_spin(url: str, trips: int, timeout_us: int) -> grpc.RpcError:
    request = service_pb2.ModelInferRequest(model_name="spin")
    request.inputs.add(name="spin", datatype="INT64", shape=[1])
    request.inputs[0].contents.int64_contents.append(trips)
    request.parameters["timeout"].int64_param = timeout_us
    with grpc.insecure_channel(url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request, timeout=CLIENT_TIMEOUT_S)
    return caught.value


def _hang_trips(server: Server) -> int:
    """Loop trips for at least about HANG_S seconds on this machine: timed on the
    fastest of a few requests, so that other work slowing one of them cannot shorten
    the hang (it can only make the hang longer)."""
    elapsed = []
    for _ in range(CALIBRATION_RUNS):
        start = time.perf_counter()
        status, _ = _post_once(server.http_port, _body(CALIBRATION_TRIPS, LONG_TIMEOUT_US))
        assert status == 200
        elapsed.append(time.perf_counter() - start)
    return max(CALIBRATION_TRIPS, int(HANG_S * CALIBRATION_TRIPS / min(elapsed)))


@pytest.mark.slow
def test_a_hung_engine_times_out_its_requests_and_the_rest_continue(tmp_path: Path) -> None:
    write_entry(tmp_path / "repo", "spin", make_spin_onnx(tmp_path / "spin.onnx"), CONFIG)
    server = start_server(tmp_path / "repo", tmp_path / "server.log")
    rss = RssWatch(psutil.Process(server.process.pid))
    try:
        trips = _hang_trips(server)
        # 1. One request hangs one instance under a steady load.
        steady = Steady(server.http_port, STEADY_CLIENTS)
        for thread in steady.threads:
            thread.start()
        steady.wait_each([AFTER_TIMEOUT] * STEADY_CLIENTS)
        sent = time.perf_counter()
        hang_status, hang_body = _post_once(server.http_port, _body(trips))
        hang_answer_s = time.perf_counter() - sent
        steady.wait_each([n + AFTER_TIMEOUT for n in steady.answered()])
        steady_statuses = steady.finish()
        still_hung = _runs(server)
        _until(lambda: _ended(server) == 1)
        hang_ran_s = time.perf_counter() - sent

        # 2. Both instances hang (one request over HTTP, one over gRPC); a request whose
        # deadline passes in the queue times out there; one with a long deadline waits
        # and is answered once an instance is free.
        grpc_error: list[grpc.RpcError] = []
        over_grpc = threading.Thread(target=lambda: grpc_error.append(
            _grpc_spin(server.grpc_url, trips, TIMEOUT_MS * 1000)))
        over_grpc.start()
        second_status, second_body = _post_once(server.http_port, _body(trips))
        over_grpc.join(CLIENT_TIMEOUT_S)
        queued_status, queued_body = _post_once(server.http_port, _body(1))
        patient_status, _ = _post_once(server.http_port, _body(1, LONG_TIMEOUT_US))
        ready = server.request("GET", "/v2/health/ready")[0]
        # 3. Stop the server while a longer hang still runs.
        last_status, _ = _post_once(server.http_port, _body(3 * trips))
    finally:
        before, peak, after = rss.stop()
        code = server.stop()
    log = server.log.read_text()
    failed = [s for s in steady_statuses if s != 200]
    sent_count = CALIBRATION_RUNS + len(steady_statuses) + 1 + 4 + 1
    print(f"\nengine hang: sent {sent_count} answered {sent_count} failed "
          f"{len(failed) + 5} (the 4 hung requests: HTTP {hang_status}, {second_status}, "
          f"{last_status}, gRPC {grpc_error[0].code().name if grpc_error else None}; one "
          f"queued behind two of them: {queued_status}); {len(steady_statuses)} steady requests "
          f"{sorted(set(steady_statuses))}; timeout {TIMEOUT_MS} ms answered after "
          f"{hang_answer_s * 1000:.0f} ms, the engine ran {hang_ran_s:.1f} s; RSS MiB "
          f"before {before >> 20} peak {peak >> 20} after {after >> 20}")

    assert hang_status == 504, hang_body
    assert hang_body["error"] == (f"request timed out after {TIMEOUT_MS} ms while the "
                                  "engine ran it")
    # The 504 came back while the engine still ran the request, and the other instance
    # answered every steady request meanwhile, after the 504 too.
    executions, successes = still_hung
    assert executions == successes
    assert failed == [] and len(steady_statuses) >= 2 * STEADY_CLIENTS * AFTER_TIMEOUT
    assert second_status == 504 and "while the engine ran it" in second_body["error"]
    assert grpc_error and grpc_error[0].code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert f"timed out after {TIMEOUT_MS} ms while the engine ran it" in grpc_error[0].details()
    assert queued_status == 504
    assert queued_body["error"] == f"request timed out after {TIMEOUT_MS} ms in the queue"
    assert patient_status == 200 and ready == 200
    assert last_status == 504
    # The server stopped with the last hang still running, and exited cleanly, saying so.
    assert code == 0, log[-3000:]
    assert "engine still running on spin-inst" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    # One line for each HTTP timeout (the gRPC door logs its own way).
    timeouts = [line for line in log.splitlines() if line.startswith(f"504 POST {INFER}: ")]
    assert len(timeouts) == 4, log[-3000:]
    assert peak < before + (200 << 20)
