"""``turboinfer serve REPO --ray``: the HTTP conformance tests of ``turboinfer serve``
(tests/serve/test_http.py, the same functions, not copies) run against the Ray Serve
ingress, with two replicas per model so that statistics and /metrics must add up over
replicas; then one replica is killed under load.

One Ray instance for the whole module (it takes ~20 s and ~1 GiB to start).
"""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from scaleout_helpers import http_conformance, serve_fixtures

from turboinfer.scaleout.requires import LOOPBACK_ONLY

pytestmark = pytest.mark.slow

# The conformance tests, run here against the Ray ingress (``server`` below). Left out:
# test_repository_index_load_unload, since on Ray a model is a deployment and the load
# and unload API answers 400 (test_model_control_is_the_deployment's).
client = http_conformance.client
test_health_and_metadata = http_conformance.test_health_and_metadata
test_infer = http_conformance.test_infer
test_compressed_requests = http_conformance.test_compressed_requests
test_concurrent_requests_are_batched_and_counted = (
    http_conformance.test_concurrent_requests_are_batched_and_counted)
test_bad_requests = http_conformance.test_bad_requests
test_compressed_body_over_the_limit = http_conformance.test_compressed_body_over_the_limit
test_metrics = http_conformance.test_metrics

REPLICAS = 2


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository of tests/serve: affine (batching) and slow (no batching)."""
    folder = tmp_path_factory.mktemp("ray-models")
    root = tmp_path_factory.mktemp("ray-repo")
    write_entry = serve_fixtures.write_entry
    write_entry(root, "affine", serve_fixtures.make_affine_onnx(folder / "a.onnx", 2.0, 1.0),
                serve_fixtures.AFFINE_CONFIG)
    write_entry(root, "slow", serve_fixtures.make_slow_onnx(folder / "s.onnx"),
                serve_fixtures.SLOW_CONFIG)
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    # Four one-CPU replicas on a 2-core machine: --ray-cpus lets Ray place them all.
    running = serve_fixtures.start_server(
        repo, tmp_path_factory.mktemp("ray-log") / "server.log", "--ray", "--ray-cpus", "4",
        "--replicas", str(REPLICAS), "--max-body-mb", "1", cli=True, timeout=240)
    yield running
    assert running.stop(timeout=90) == 0


def test_model_control_is_the_deployment(server: Any) -> None:
    for action in ("load", "unload"):
        status, body = server.post_json(f"/v2/repository/models/affine/{action}", {})
        assert status == 400 and "deploy it again" in body["error"]
    status, index = server.post_json("/v2/repository/index", {})
    assert status == 200
    assert {(m["name"], m["state"]) for m in index} == {("affine", "READY"), ("slow", "READY")}


@dataclass
class Outcome:
    start: float
    end: float
    status: int


class ClosedLoop:
    """``clients`` threads, each sending one affine request after another."""

    def __init__(self, port: int, clients: int) -> None:
        self.port = port
        self.outcomes: list[Outcome] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True)
                         for _ in range(clients)]

    def __enter__(self) -> ClosedLoop:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _client(self) -> None:
        body = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32",
                                         "shape": [1, 16], "data": [1.0] * 16}]})
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        while not self._stop.is_set():
            start = time.perf_counter()
            try:
                connection.request("POST", "/v2/models/affine/infer", body)
                response = connection.getresponse()
                response.read()
                status = response.status
            except (OSError, http.client.HTTPException):
                status = 0
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            self.outcomes.append(Outcome(start, time.perf_counter(), status))
        connection.close()


def _driver_says(driver: subprocess.Popen[str]) -> dict[str, Any]:
    assert driver.stdout is not None
    line = driver.stdout.readline()
    assert line, "the Ray driver process ended early"
    return dict(orjson.loads(line))


def test_a_killed_replica_is_replaced_and_only_requests_in_flight_fail(server: Any) -> None:
    gcs = re.search(r"ray cluster: (\S+)", server.log.read_text())
    assert gcs is not None
    # The server's local instance is on loopback: so is the driver (read at import); it
    # authenticates with the token the instance wrote to ~/.ray/auth_token.
    env = {**os.environ, LOOPBACK_ONLY: "0", "RAY_AUTH_MODE": "token"}
    with subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("ray_driver.py")), gcs.group(1),
             "model-affine", str(REPLICAS)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env) as driver:
        assert driver.stdin is not None
        try:
            before = _driver_says(driver)["replicas"]
            assert len(before) == REPLICAS
            with ClosedLoop(server.http_port, clients=8) as load:
                time.sleep(2.0)
                killed_at = time.perf_counter()
                driver.stdin.write("kill\n")
                driver.stdin.flush()
                assert _driver_says(driver)["killed"]
                killed_by = time.perf_counter()
                outcome = _driver_says(driver)
                replaced_at = time.perf_counter()
                time.sleep(2.0)
            driver.stdin.close()
            assert driver.wait(timeout=60) == 0
        finally:
            if driver.poll() is None:
                driver.kill()
    after = outcome["replicas"]
    assert outcome["replaced"] and before[0] not in after and len(after) == REPLICAS, after
    failed = [o for o in load.outcomes if o.status != 200]
    # In flight: any request open at some moment between sending the kill and its answer.
    in_flight = [o for o in load.outcomes if o.start < killed_by and o.end > killed_at]
    print(f"{len(load.outcomes)} requests, {len(in_flight)} in flight at the kill, "
          f"{len(failed)} failed ({sorted({o.status for o in failed})}); replaced in "
          f"{replaced_at - killed_at:.1f} s")
    # No more requests fail than were in flight when the replica died (the ingress
    # sends a request whose replica died again, so usually none does); everything
    # after the replacement succeeds.
    assert len(failed) <= len(in_flight), failed
    assert all(o.status == 200 for o in load.outcomes if o.start > replaced_at)
    assert sum(o.start > replaced_at for o in load.outcomes) > 0
