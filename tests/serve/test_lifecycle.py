"""Hot reload, blue-green swaps under load, canary split, queue limits and the drain."""

from __future__ import annotations

import http.client
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import orjson
import psutil
import pytest

from turboinfer.serve.config import Canary, ModelConfig, VersionPolicy, write_entry

if TYPE_CHECKING:
    from conftest import Server

Launch = Callable[..., "Server"]

AFFINE_BODY = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32",
                                        "shape": [1, 16], "data": [0.0] * 16}]})


def _wait(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


class Load:
    """Threads sending requests back to back on keep-alive connections, recording
    (status, served version) until stopped."""

    def __init__(self, server: Server, threads: int = 2) -> None:
        self.server = server
        self.results: list[list[tuple[int, str]]] = [[] for _ in range(threads)]
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(r,), daemon=True)
                         for r in self.results]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _run(self, results: list[tuple[int, str]]) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.server.http_port, timeout=30)
        while not self._stop.is_set():
            connection.request("POST", "/v2/models/affine/infer", AFFINE_BODY)
            response = connection.getresponse()
            body = response.read()
            version = orjson.loads(body).get("model_version", "") if response.status == 200 \
                else body.decode()
            results.append((response.status, version))
        connection.close()

    def latest(self) -> set[str]:
        return {r[-1][1] for r in self.results if r}


def _index(server: Server) -> dict[tuple[str, str | None], dict[str, str]]:
    status, body = server.request("POST", "/v2/repository/index")
    assert status == 200
    return {(m["name"], m.get("version")): m for m in orjson.loads(body)}


@pytest.fixture
def poll_server(tmp_path: Path, model_files: dict[str, Path], launch: Launch,
                affine_config: ModelConfig) -> Iterator[Server]:
    root = tmp_path / "repo"
    write_entry(root, "affine", model_files["affine1"], affine_config)
    server = launch(root, tmp_path / "server.log", "--model-control", "poll",
                          "--poll-seconds", "0.1")
    yield server
    assert server.stop() == 0


def test_version_swap_under_load_loses_nothing(poll_server: Server,
                                               model_files: dict[str, Path], tmp_path: Path,
                                               affine_config: ModelConfig) -> None:
    root = tmp_path / "repo"
    with Load(poll_server) as load:
        _wait(lambda: all(load.results))
        write_entry(root, "affine", model_files["affine2"], affine_config)
        _wait(lambda: load.latest() == {"2"})
        # A broken version 3: the index reports it, version 2 keeps serving.
        write_entry(root, "affine", model_files["broken"], affine_config)
        _wait(lambda: _index(poll_server).get(("affine", "3"), {}).get("state") == "UNAVAILABLE")
        # An invalid config: reported with file and key, the served version stays.
        (root / "affine" / "config.yaml").write_text("max_batch_sise: 4\n")
        _wait(lambda: "max_batch_sise" in _index(poll_server)[("affine", "2")]["reason"])
        time.sleep(0.3)
    for results in load.results:
        assert [status for status, _ in results if status != 200] == []
        versions = [version for _, version in results]
        assert versions == sorted(versions)  # once moved to 2, never back to 1
        assert versions[-1] == "2"
    index = _index(poll_server)
    assert "cannot load" in index[("affine", "3")]["reason"]
    assert ("affine", "1") not in index


def test_invalid_config_and_canary(tmp_path: Path, model_files: dict[str, Path],
                                   launch: Launch, affine_config: ModelConfig) -> None:
    root = tmp_path / "repo"
    canary = ModelConfig(max_batch_size=8, version_policy=VersionPolicy(latest=2),
                         canary=Canary(version=2, percent=25))
    write_entry(root, "affine", model_files["affine1"], canary)
    write_entry(root, "affine", model_files["affine2"], canary)
    write_entry(root, "typo", model_files["affine1"], affine_config)
    (root / "typo" / "config.yaml").write_text("dynamic_batching: {max_queue_delay_ms: x}\n")
    server = launch(root, tmp_path / "server.log")
    try:
        reason = _index(server)[("typo", None)]["reason"]
        assert str(root / "typo" / "config.yaml") in reason
        assert "dynamic_batching.max_queue_delay_ms" in reason
        versions = [server.post_json("/v2/models/affine/infer", orjson.loads(AFFINE_BODY))[1]
                    ["model_version"] for _ in range(40)]
        assert versions.count("2") == 10 and versions.count("1") == 30
        status, body = server.post_json("/v2/models/affine/versions/1/infer",
                                        orjson.loads(AFFINE_BODY))
        assert status == 200 and body["outputs"][0]["data"][0] == 1.0
        # Explicit mode: a model added after the start loads through the API.
        write_entry(root, "late", model_files["affine3"], affine_config)
        assert server.request("GET", "/v2/models/late/ready")[0] == 404
        assert server.request("POST", "/v2/repository/models/late/load")[0] == 200
        status, body = server.post_json("/v2/models/late/infer", orjson.loads(AFFINE_BODY))
        assert status == 200 and body["outputs"][0]["data"][0] == 3.0
    finally:
        assert server.stop() == 0


def _slow_body(rows: int) -> tuple[bytes, dict[str, str]]:
    x = np.ones((rows, 512), np.float32)
    header = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32",
                                       "shape": [rows, 512],
                                       "parameters": {"binary_data_size": x.nbytes}}]})
    return header + x.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


@pytest.fixture
def slow_server(tmp_path: Path, model_files: dict[str, Path], launch: Launch,
                slow_config: ModelConfig) -> Iterator[Server]:
    root = tmp_path / "repo"
    write_entry(root, "slow", model_files["slow"], slow_config)
    server = launch(root, tmp_path / "server.log", "--grpc-port", "-1")
    yield server
    server.stop()


def _timed_post(server: Server, body: bytes, headers: dict[str, str]) -> tuple[int, float]:
    start = time.perf_counter()
    status, _ = server.request("POST", "/v2/models/slow/infer", body, headers)
    return status, time.perf_counter() - start


def test_full_queue_rejects_fast_with_bounded_memory(slow_server: Server) -> None:
    body, headers = _slow_body(400)  # ~0.8 MB, tens of ms of compute per request
    process = psutil.Process(slow_server.process.pid)
    _timed_post(slow_server, body, headers)
    rss_before = process.memory_info().rss
    with ThreadPoolExecutor(40) as pool:  # 10x the queue of 4
        results = list(pool.map(lambda _: _timed_post(slow_server, body, headers), range(40)))
    rejected = [seconds for status, seconds in results if status == 503]
    accepted = [seconds for status, seconds in results if status == 200]
    assert {status for status, _ in results} <= {200, 503}
    assert len(rejected) >= 20 and accepted
    # Rejected at the door: sooner than the requests that waited in the queue and ran.
    assert np.median(rejected) < np.median(accepted)
    assert process.memory_info().rss - rss_before < 100 * 1024 * 1024
    assert _timed_post(slow_server, body, headers)[0] == 200


def _pending(server: Server) -> float:
    text = server.request("GET", "/metrics")[1].decode()
    for line in text.splitlines():
        if line.startswith("turboinfer_pending_requests{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_sigterm_drains_in_flight_requests(slow_server: Server) -> None:
    body, headers = _slow_body(3000)  # each request holds the instance for a while
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(_timed_post, slow_server, body, headers) for _ in range(3)]
        # SIGTERM only once all three are inside: one running, two queued.
        _wait(lambda: _pending(slow_server) == 2, 30)
        slow_server.process.send_signal(signal.SIGTERM)
        _wait(lambda: slow_server.request("GET", "/v2/health/ready")[0] == 503, 5)
        statuses = [future.result()[0] for future in futures]
    assert statuses == [200, 200, 200]
    assert slow_server.stop() == 0


def test_repo_add_command(tmp_path: Path, model_files: dict[str, Path]) -> None:
    from turboinfer.cli import main

    onnx_file = tmp_path / "affine.onnx"
    shutil.copyfile(model_files["affine1"], onnx_file)
    root = tmp_path / "repo"
    assert main(["repo", "add", str(root), str(onnx_file), "--max-batch-size", "16",
                 "--max-queue-delay-ms", "1.5", "--instances", "2"]) == 0
    assert main(["repo", "add", str(root), str(onnx_file), "--name", "affine"]) == 0
    from turboinfer.serve.config import load_config

    config = load_config(root / "affine" / "config.yaml")
    assert config.max_batch_size == 16 and config.instances == 2
    assert config.dynamic_batching is not None
    assert config.dynamic_batching.max_queue_delay_ms == 1.5
    assert sorted(p.name for p in (root / "affine").iterdir()) == ["1", "2", "config.yaml"]
