"""Fault: SIGTERM against a real ``turboinfer serve`` under steady load, with long
requests in flight. Every request the server accepted before the signal is answered
200, the ones after it are refused cleanly (503, then connection refused once closed),
and the process exits 0. With a drain deadline shorter than a request, the process
still exits 0 soon after the deadline. Prints requests sent / answered / failed and RSS
before / peak / after."""

from __future__ import annotations

import http.client
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import psutil
import pytest
from fault_helpers import serve_fixtures

from turboinfer.serve.config import (
    DynamicBatching,
    EngineSettingsConfig,
    ModelConfig,
    write_entry,
)

if TYPE_CHECKING:
    from conftest import Server


start_server, make_slow_onnx = serve_fixtures.start_server, serve_fixtures.make_slow_onnx

# About 5 ms per row on one thread: a request of LONG_ROWS rows runs for about a second,
# and the short requests queue behind it on the one instance, so both are in flight
# when the signal comes.
WIDTH, DEPTH = 1024, 192
CONFIG = ModelConfig(max_batch_size=0, instances=1,
                     engine_settings=EngineSettingsConfig(intra_op_threads=1),
                     dynamic_batching=DynamicBatching(max_queue_size=256))
STEADY_CLIENTS, LONG_CLIENTS, LONG_ROWS = 3, 2, 200
LONG_AFTER_S, SIGNAL_AFTER_S = 0.3, 0.8
# A request sent this long before the signal has surely reached the server; one sent
# closer to it may arrive after it and be refused, which is as correct.
RACE_S = 0.25
DRAIN_S, EXIT_MARGIN_S = 20.0, 30.0
CLIENT_TIMEOUT_S = 60.0  # only so that a lost request cannot hang the test


def _body(rows: int) -> tuple[bytes, dict[str, str]]:
    """A binary-tensor request of ``rows`` rows (large ones exceed the JSON limit)."""
    tensor = b"\x00\x00\x00\x3f" * (rows * WIDTH)  # 0.5 in little-endian FP32
    header = orjson.dumps({"inputs": [{
        "name": "input", "datatype": "FP32", "shape": [rows, WIDTH],
        "parameters": {"binary_data_size": len(tensor)}}],
        "outputs": [{"name": "output", "parameters": {"binary_data": True}}]})
    return header + tensor, {"Inference-Header-Content-Length": str(len(header)),
                             "Content-Type": "application/octet-stream"}


@dataclass
class Sent:
    at: float  # perf_counter when the request was sent
    outcome: int | str  # the status, or the name of what went wrong instead
    done: float = 0.0


@dataclass
class Record:
    sent: list[Sent] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, item: Sent) -> None:
        with self.lock:
            self.sent.append(item)


def _send(connection: http.client.HTTPConnection, rows: int) -> Sent:
    body, headers = _body(rows)
    item = Sent(time.perf_counter(), "")
    try:
        connection.request("POST", "/v2/models/slow/infer", body, headers)
        response = connection.getresponse()
        response.read()
        item.outcome = response.status
    except OSError as exc:  # refused, reset, or closed without an answer
        item.outcome = type(exc).__name__
    item.done = time.perf_counter()
    return item


def _steady(port: int, record: Record) -> None:
    """One-row requests back to back until the server refuses one."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_TIMEOUT_S)
    try:
        while True:
            item = _send(connection, 1)
            record.add(item)
            if item.outcome != 200:
                return
    finally:
        connection.close()


def _long(port: int, rows: int, record: Record) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_TIMEOUT_S)
    try:
        record.add(_send(connection, rows))
    finally:
        connection.close()


def _refused(port: int) -> bool:
    try:
        http.client.HTTPConnection("127.0.0.1", port, timeout=5).connect()
    except ConnectionRefusedError:
        return True
    return False


def _watch(process: psutil.Process, threads: list[threading.Thread]) -> tuple[int, int]:
    """Peak and last RSS while any thread runs and the process lives."""
    peak = last = 0
    while any(t.is_alive() for t in threads):
        try:
            last = process.memory_info().rss
        except psutil.NoSuchProcess:
            break
        peak = max(peak, last)
        time.sleep(0.05)
    return peak, last


def _start(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.start()


def _run(server: Server, process: psutil.Process
         ) -> tuple[Record, Record, float, int, int, int]:
    """Steady load, then long requests, then SIGTERM; the records, when the signal was
    sent, peak and last RSS, and the exit code."""
    steady, long = Record(), Record()
    steady_threads = [threading.Thread(target=_steady, args=(server.http_port, steady))
                      for _ in range(STEADY_CLIENTS)]
    long_threads = [threading.Thread(target=_long, args=(server.http_port, LONG_ROWS, long))
                    for _ in range(LONG_CLIENTS)]
    _start(steady_threads)
    time.sleep(LONG_AFTER_S)
    _start(long_threads)
    time.sleep(SIGNAL_AFTER_S - LONG_AFTER_S)
    signalled = time.perf_counter()
    server.process.send_signal(signal.SIGTERM)
    peak, after = _watch(process, steady_threads + long_threads)
    code = server.process.wait(DRAIN_S + EXIT_MARGIN_S)
    for thread in steady_threads + long_threads:
        thread.join()
    return steady, long, signalled, peak, after, code


@pytest.mark.slow
def test_sigterm_answers_what_was_accepted_and_refuses_the_rest(tmp_path: Path) -> None:
    write_entry(tmp_path / "repo", "slow", make_slow_onnx(tmp_path / "s.onnx", WIDTH, DEPTH),
                CONFIG)
    server = start_server(tmp_path / "repo", tmp_path / "server.log",
                          "--drain-seconds", str(DRAIN_S))
    process = psutil.Process(server.process.pid)
    try:
        before = process.memory_info().rss
        steady, long, signalled, peak, after, code = _run(server, process)
        exited = time.perf_counter()
    finally:
        server.stop()  # the process has exited by now; this closes its pipe
    everything = steady.sent + long.sent
    early = [s for s in everything if s.at < signalled - RACE_S]
    late = [s for s in everything if s.at >= signalled]
    answered = [s for s in everything if isinstance(s.outcome, int)]
    print(f"\nsigterm: sent {len(everything)} answered {len(answered)} failed "
          f"{sum(s.outcome != 200 for s in everything)} (before the signal "
          f"{len(early)}: {sorted({s.outcome for s in early}, key=str)}; after it {len(late)}: "
          f"{sorted({s.outcome for s in late}, key=str)}); long requests done "
          f"{[round(s.done - signalled, 2) for s in long.sent]} s after the signal; exit "
          f"{code} after {exited - signalled:.1f} s; RSS MiB before {before >> 20} "
          f"peak {peak >> 20} after {after >> 20}")
    assert code == 0
    assert len(long.sent) == LONG_CLIENTS and all(s.outcome == 200 for s in long.sent)
    # The drain did wait: a request in flight at the signal was answered after it.
    assert max(s.done for s in long.sent) > signalled
    assert early and all(s.outcome == 200 for s in early)
    assert all(s.outcome in (200, 503) for s in everything)
    assert late and all(s.outcome == 503 for s in late)
    assert _refused(server.http_port)
    assert peak < before + (300 << 20)


SHORT_DRAIN_S, STUCK_ROWS = 1.0, 4000  # the request would run for about 20 s


@pytest.mark.slow
def test_the_drain_deadline_bounds_shutdown_under_a_longer_request(tmp_path: Path) -> None:
    write_entry(tmp_path / "repo", "slow", make_slow_onnx(tmp_path / "s.onnx", WIDTH, DEPTH),
                CONFIG)
    server = start_server(tmp_path / "repo", tmp_path / "server.log",
                          "--drain-seconds", str(SHORT_DRAIN_S))
    stuck = Record()
    thread = threading.Thread(target=_long, args=(server.http_port, STUCK_ROWS, stuck))
    try:
        thread.start()
        time.sleep(LONG_AFTER_S)
        signalled = time.perf_counter()
        server.process.send_signal(signal.SIGTERM)
        # Generous, yet well below the request's own time: the deadline, not the
        # request, ends the process.
        code = server.process.wait(SHORT_DRAIN_S + 10)
        exited = time.perf_counter()
        thread.join(CLIENT_TIMEOUT_S)
    finally:
        server.stop()
    print(f"\nsigterm past the drain deadline: sent 1 answered "
          f"{sum(isinstance(s.outcome, int) for s in stuck.sent)} failed 1 "
          f"({[s.outcome for s in stuck.sent]}); exit {code} after "
          f"{exited - signalled:.1f} s with --drain-seconds {SHORT_DRAIN_S:g}")
    assert code == 0
    assert len(stuck.sent) == 1 and stuck.sent[0].outcome == 503  # an answer, not a drop
    assert "Traceback" not in server.log.read_text()
