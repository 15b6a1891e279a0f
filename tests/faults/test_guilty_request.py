"""Fault: one request with out-of-range token ids in the middle of a steady load against
a real ``turboinfer serve``. Only it fails; the rest complete; the server stays ready.
Prints requests sent / answered / failed and the server's RSS before / peak / after."""

from __future__ import annotations

import http.client
import threading
from pathlib import Path

import orjson
import psutil
import pytest
from fault_helpers import serve_fixtures

from serve_modules import serve_module
from turboinfer.serve.config import DynamicBatching, ModelConfig, write_entry

start_server = serve_fixtures.start_server
_gather = serve_module("serve_gather", "test_batch_isolation.py")
VOCAB, ids_request, make_gather_onnx = _gather.VOCAB, _gather.ids_request, _gather.make_gather_onnx

CLIENTS, PER_CLIENT = 4, 150
CONFIG = ModelConfig(max_batch_size=8,
                     dynamic_batching=DynamicBatching(max_queue_delay_ms=2.0))


def _client(port: int, statuses: list[int], guilty_at: int | None) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        for i in range(PER_CLIENT):
            ids = [1, VOCAB + 5, 2, 3] if i == guilty_at else [1, 2, 3, 4]
            connection.request("POST", "/v2/models/gather/infer",
                               orjson.dumps(ids_request(ids)))
            response = connection.getresponse()
            response.read()
            statuses.append(response.status)
    finally:
        connection.close()


@pytest.mark.slow
def test_only_the_guilty_request_fails_under_steady_load(tmp_path: Path) -> None:
    write_entry(tmp_path / "repo", "gather", make_gather_onnx(tmp_path / "g.onnx"), CONFIG)
    server = start_server(tmp_path / "repo", tmp_path / "server.log")
    process = psutil.Process(server.process.pid)
    try:
        before = peak = process.memory_info().rss
        results: list[list[int]] = [[] for _ in range(CLIENTS)]
        threads = [threading.Thread(target=_client, args=(
            server.http_port, results[c], PER_CLIENT // 2 if c == 0 else None))
            for c in range(CLIENTS)]
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads):
            peak = max(peak, process.memory_info().rss)
            threads[0].join(0.05)
        for thread in threads:
            thread.join()
        after = process.memory_info().rss
        statuses = [s for r in results for s in r]
        failed = [s for s in statuses if s != 200]
        print(f"\nguilty request: sent {CLIENTS * PER_CLIENT} answered {len(statuses)} "
              f"failed {len(failed)} ({failed}); RSS MiB before {before >> 20} "
              f"peak {peak >> 20} after {after >> 20}")
        assert len(statuses) == CLIENTS * PER_CLIENT
        assert failed == [400]
        assert server.request("GET", "/v2/health/ready")[0] == 200
        assert peak < before + (200 << 20)
    finally:
        assert server.stop() == 0
