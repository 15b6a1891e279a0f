"""Fault: broken new versions written into the repository of a real ``turboinfer serve``
while a steady bounded load runs on version 1 (poll mode, and the explicit load API).
Not one request fails: version 1 answers them all while version 2 (a truncated model
file) and version 3 (a model that loads but cannot run) fail to load; each failure is
reported (the load API's 422 naming the version, the repository index, one log line)
and leaves no metric series behind; then a good version 4 takes over, still with no
failed request. Prints requests sent / answered / failed and RSS before / peak / after.
"""

from __future__ import annotations

import http.client
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
import orjson
import psutil
import pytest
from fault_helpers import RssWatch, serve_fixtures
from onnx import TensorProto, helper, numpy_helper

from turboinfer.serve.config import DynamicBatching, ModelConfig, write_entry

if TYPE_CHECKING:
    from conftest import Server

start_server, make_affine_onnx = serve_fixtures.start_server, serve_fixtures.make_affine_onnx

CONFIG = ModelConfig(max_batch_size=8, dynamic_batching=DynamicBatching(max_queue_delay_ms=2.0))
INFER = "/v2/models/affine/infer"
ROW = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16],
                                "data": [0.5] * 16}]})
CLIENTS, PER_PHASE = 3, 10  # requests each client completes between two steps
POLL_S = "0.2"
CLIENT_TIMEOUT_S = 60.0  # only so that a lost answer cannot hang the test


def make_unrunnable_onnx(path: Path) -> Path:
    """A valid model that ONNX Runtime loads, whose every run fails: it reshapes the
    16 values of a row into 3 x 5."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["input", "shape"], ["output"])], "unrunnable",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [3, 5])],
        initializer=[numpy_helper.from_array(np.array([3, 5]), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


class Load:
    """Closed-loop clients on the model's default route; each answer kept as
    (status, version, first output value)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.answers: list[list[tuple[int, str, float]]] = [[] for _ in range(CLIENTS)]
        self.sent = [0] * CLIENTS
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(c,), daemon=True)
                        for c in range(CLIENTS)]
        for thread in self.threads:
            thread.start()

    def _run(self, client: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port,
                                                timeout=CLIENT_TIMEOUT_S)
        try:
            while not self.stop.is_set():
                self.sent[client] += 1
                connection.request("POST", INFER, ROW)
                response = connection.getresponse()
                body = orjson.loads(response.read())
                version, value = "", float("nan")
                if response.status == 200:
                    version, value = body["model_version"], body["outputs"][0]["data"][0]
                self.answers[client].append((response.status, version, value))
        finally:
            connection.close()

    def more(self, count: int = PER_PHASE) -> None:
        """Until each client has ``count`` more answers."""
        targets = [len(a) + count for a in self.answers]
        _until(lambda: all(len(a) >= n or not t.is_alive() for a, n, t in
                           zip(self.answers, targets, self.threads, strict=True)))

    def finish(self) -> list[tuple[int, str, float]]:
        self.stop.set()
        for thread in self.threads:
            thread.join(CLIENT_TIMEOUT_S)
        return [answer for answers in self.answers for answer in answers]


def _until(condition: Callable[[], bool], limit_s: float = CLIENT_TIMEOUT_S) -> None:
    """Poll ``condition``; the limit only keeps a broken server from hanging the test."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def _index(server: Server) -> dict[str, tuple[str, str]]:
    status, index = server.post_json("/v2/repository/index", {})
    assert status == 200
    return {entry.get("version", ""): (entry["state"], entry["reason"]) for entry in index}


def _state(server: Server, version: str) -> str:
    return _index(server).get(version, ("", ""))[0]


def _versions_in_metrics(server: Server) -> set[str]:
    text = server.request("GET", "/metrics")[1].decode()
    return set(re.findall(r'^turboinfer_\w+\{[^}]*model="affine"[^}]*version="(\d+)"',
                          text, re.M))


@pytest.mark.slow
def test_broken_new_versions_under_load_fail_no_request(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    write_entry(root, "affine", make_affine_onnx(tmp_path / "v1.onnx", 2.0, 1.0), CONFIG)
    good = (tmp_path / "v1.onnx").read_bytes()
    server = start_server(root, tmp_path / "server.log", "--model-control", "poll",
                          "--poll-seconds", POLL_S)
    rss = RssWatch(psutil.Process(server.process.pid))
    try:
        load = Load(server.http_port)
        load.more()
        # Version 2: a model file cut in half, moved in whole (so the poller sees it
        # once), picked up by the poller; then asked for through the load API.
        staging = root / "affine" / "staging"
        staging.mkdir()
        (staging / "model.onnx").write_bytes(good[: len(good) // 2])
        staging.rename(root / "affine" / "2")
        _until(lambda: _state(server, "2") == "UNAVAILABLE")
        load.more()
        load_status, load_body = server.post_json("/v2/repository/models/affine/load", {})
        load.more()
        # Version 3: a model that loads but fails its warm-up run.
        write_entry(root, "affine", make_unrunnable_onnx(tmp_path / "v3.onnx"), CONFIG)
        _until(lambda: _state(server, "3") == "UNAVAILABLE")
        broken_index = _index(server)
        broken_metrics = _versions_in_metrics(server)
        load.more()
        # Version 4: a good model takes over under the same load.
        write_entry(root, "affine", make_affine_onnx(tmp_path / "v4.onnx", 2.0, 4.0), CONFIG)
        _until(lambda: _state(server, "4") == "READY" and "1" not in _index(server))
        load.more()
        answers = load.finish()
    finally:
        before, peak, after = rss.stop()
        code = server.stop()
    log = server.log.read_text()
    sent = sum(load.sent)
    failed = [a for a in answers if a[0] != 200]
    by_version = Counter(version for _, version, _ in answers)
    print(f"\nhot reload: sent {sent} answered {len(answers)} failed {len(failed)}; "
          f"answered by version {dict(sorted(by_version.items()))}; load API on the broken "
          f"version {load_status}; RSS MiB before {before >> 20} peak {peak >> 20} after "
          f"{after >> 20}")

    assert len(answers) == sent and failed == []
    # Version 1 answered everything until version 4 took over, with its own outputs.
    assert set(by_version) == {"1", "4"}
    assert all(value == {"1": 2.0, "4": 5.0}[version] for _, version, value in answers)
    assert [version for _, version, _ in load.answers[0]] == sorted(
        version for _, version, _ in load.answers[0])  # never back to 1 after 4
    assert load_status == 422
    assert "version 2" in load_body["error"] and "still serving version(s) 1" in \
        load_body["error"]
    assert broken_index["1"] == ("READY", "")
    assert broken_index["3"][0] == "UNAVAILABLE" and broken_index["3"][1]
    assert "2" not in broken_index  # the newest version alone is wanted: 3 replaced it
    assert broken_metrics == {"1"}  # no series for versions that never served
    # One line per failed load (the poller's and the load API's for version 2, the
    # poller's for version 3), and one for the load API's 422.
    lines = log.splitlines()
    assert len([line for line in lines if line.startswith(
        "model affine version 2 failed to load: ")]) == 2, log[-3000:]
    assert len([line for line in lines if line.startswith(
        "model affine version 3 failed to load: ")]) == 1, log[-3000:]
    assert len([line for line in lines if line.startswith(
        "422 POST /v2/repository/models/affine/load: ")]) == 1, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert code == 0
    assert peak < before + (300 << 20)

