"""Fault: slow clients against a real ``turboinfer serve``: one sends its body a byte at a
time over a few seconds, others send many large requests and never read the answers.
Meanwhile normal clients keep getting answers, and the server's memory stays bounded.
Prints requests sent / answered / failed and RSS before / peak / after."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections import Counter
from pathlib import Path

import orjson
import psutil
import pytest
from fault_helpers import serve_fixtures

from turboinfer.serve.config import DynamicBatching, ModelConfig, write_entry

start_server, make_affine_onnx = serve_fixtures.start_server, serve_fixtures.make_affine_onnx

CONFIG = ModelConfig(max_batch_size=8,
                     dynamic_batching=DynamicBatching(max_queue_delay_ms=2.0))
WIDE = 65536  # 256 KiB in and out per row: the unread answers fill the socket buffers
NORMAL_CLIENTS = 2
DRIP_S = 3.0  # the byte-by-byte body takes this long
READERLESS_SOCKETS, READERLESS_REQUESTS = 4, 40
CLIENT_TIMEOUT_S = 30.0  # only so that a stuck request cannot hang the test
RSS_HEADROOM = 300 << 20

NORMAL_BODY = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32",
                                        "shape": [1, 16], "data": [1.0] * 16}]})


def _wide_request() -> bytes:
    """A pipelinable raw HTTP request with a binary input and a binary output."""
    tensor = b"\x00\x00\x80\x3f" * WIDE  # 1.0 in little-endian FP32
    header = orjson.dumps({
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, WIDE],
                    "parameters": {"binary_data_size": len(tensor)}}],
        "outputs": [{"name": "output", "parameters": {"binary_data": True}}]})
    return (f"POST /v2/models/wide/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(header)}\r\n"
            f"Content-Length: {len(header) + len(tensor)}\r\n\r\n").encode() + header + tensor


def _normal(port: int, until: float, statuses: list[int]) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_TIMEOUT_S)
    try:
        while time.perf_counter() < until:
            connection.request("POST", "/v2/models/affine/infer", NORMAL_BODY)
            response = connection.getresponse()
            response.read()
            statuses.append(response.status)
    finally:
        connection.close()


def _drip(port: int, outcome: list[int]) -> None:
    """The body a byte at a time, spread over DRIP_S; then read the answer."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_TIMEOUT_S)
    try:
        connection.putrequest("POST", "/v2/models/affine/infer")
        connection.putheader("Content-Length", str(len(NORMAL_BODY)))
        connection.endheaders()
        pause = DRIP_S / len(NORMAL_BODY)
        for byte in NORMAL_BODY:
            connection.send(bytes([byte]))
            time.sleep(pause)
        response = connection.getresponse()
        response.read()
        outcome.append(response.status)
    finally:
        connection.close()


def _readerless(port: int, sent: list[int]) -> socket.socket:
    """A connection that sends READERLESS_REQUESTS pipelined requests and never reads;
    sending stops early when the server stops reading (its answers are not taken)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=2.0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once
    request = _wide_request()
    for _ in range(READERLESS_REQUESTS):
        try:
            sock.sendall(request)
        except TimeoutError:  # the server reads no more from a client that reads nothing
            break
        sent.append(1)
    return sock


def _run(port: int, process: psutil.Process
         ) -> tuple[list[int], list[int], int, list[socket.socket], int]:
    """Normal clients through a byte-by-byte body and connections that never read;
    their statuses, the drip's status, the unread requests sent, those sockets, peak RSS."""
    normal: list[int] = []
    drip: list[int] = []
    unread: list[int] = []
    sockets: list[socket.socket] = []
    until = time.perf_counter() + DRIP_S + 0.5
    threads = [threading.Thread(target=_normal, args=(port, until, normal))
               for _ in range(NORMAL_CLIENTS)]
    threads.append(threading.Thread(target=_drip, args=(port, drip)))
    threads += [threading.Thread(target=lambda: sockets.append(_readerless(port, unread)))
                for _ in range(READERLESS_SOCKETS)]
    for thread in threads:
        thread.start()
    peak = 0
    while any(t.is_alive() for t in threads):
        peak = max(peak, process.memory_info().rss)
        time.sleep(0.05)
    return normal, drip, len(unread), sockets, peak


@pytest.mark.slow
def test_slow_clients_do_not_block_the_others(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_entry(repo, "affine", make_affine_onnx(tmp_path / "a.onnx", 2.0, 1.0), CONFIG)
    write_entry(repo, "wide", make_affine_onnx(tmp_path / "w.onnx", 2.0, 1.0, WIDE), CONFIG)
    server = start_server(repo, tmp_path / "server.log")
    process = psutil.Process(server.process.pid)
    try:
        before = process.memory_info().rss
        normal, drip, unread, sockets, peak = _run(server.http_port, process)
        for sock in sockets:
            sock.close()
        ready = server.request("GET", "/v2/health/ready")[0]
        after = process.memory_info().rss
        statuses = normal + drip
        print(f"\nslow clients: sent {len(statuses) + unread} answered {len(statuses)} "
              f"(+{unread} never read by their client) failed "
              f"{sum(s != 200 for s in statuses)} ({dict(Counter(statuses))}; "
              f"byte-by-byte body {drip}); RSS MiB before {before >> 20} "
              f"peak {max(peak, before) >> 20} after {after >> 20}")
        assert normal and set(normal) == {200}
        assert drip == [200]
        assert unread > 0
        assert peak < before + RSS_HEADROOM
        assert ready == 200
    finally:
        assert server.stop() == 0
