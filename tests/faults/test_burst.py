"""Fault: a burst of ten times the sustainable rate for a few seconds against a real
``turboinfer serve``. Every request is answered (200, or 429/503 at once), none is lost
or left hanging, the server's RSS stays bounded, and after the burst a closed loop is
answered normally. Prints requests sent / answered / failed and RSS before / peak / after.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

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

start_server, make_slow_onnx = serve_fixtures.start_server, serve_fixtures.make_slow_onnx

WIDTH, DEPTH = 1024, 192
# One single-threaded instance of a model that takes milliseconds per row: the server's
# capacity is low enough that a Python client can offer ten times it, and one core is
# left for the clients. The bounded queue turns the excess into fast 503s.
CONFIG = ModelConfig(max_batch_size=8, instances=1,
                     engine_settings=EngineSettingsConfig(intra_op_threads=1),
                     dynamic_batching=DynamicBatching(max_queue_delay_ms=2.0,
                                                      max_queue_size=64))
BODY = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, WIDTH],
                                 "data": [0.5] * WIDTH}]})
REQUEST = (f"POST /v2/models/slow/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
           f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
           ).encode() + BODY
CLIENT_TIMEOUT_S = 30.0  # only so that a lost request cannot hang the test
CLOSED_CLIENTS, CLOSED_S = 4, 1.5
BURST_FACTOR, BURST_S, MAX_BURST_RATE = 10, 3.0, 1500.0
RSS_HEADROOM = 300 << 20


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    """Send one request and read its whole response; returns the status."""
    writer.write(REQUEST)
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines
                  if line.lower().startswith("content-length:"))
    await reader.readexactly(length)
    return int(lines[0].split()[1])


async def _closed_client(port: int, until: float, statuses: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.perf_counter() < until:
            statuses.append(await asyncio.wait_for(_exchange(reader, writer),
                                                   CLIENT_TIMEOUT_S))
    finally:
        writer.close()


async def closed_loop(port: int, seconds: float) -> tuple[list[int], float]:
    """Statuses of a closed loop of CLOSED_CLIENTS keep-alive connections, and its rate."""
    statuses: list[int] = []
    start = time.perf_counter()
    await asyncio.gather(*(_closed_client(port, start + seconds, statuses)
                           for _ in range(CLOSED_CLIENTS)))
    return statuses, len(statuses) / (time.perf_counter() - start)


async def _open_request(port: int) -> int | str:
    """One request on its own connection (an open loop never waits for a free one);
    its status, or the name of what went wrong instead of an answer."""
    try:
        async with asyncio.timeout(CLIENT_TIMEOUT_S):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                return await _exchange(reader, writer)
            finally:
                writer.close()
    except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
        return type(exc).__name__


async def open_loop(port: int, rate: float, seconds: float) -> tuple[list[int | str], float]:
    """Requests started on schedule at ``rate`` for ``seconds`` whatever the answers do;
    their outcomes and the rate actually offered."""
    count = int(rate * seconds)
    tasks = []
    start = time.perf_counter()
    for i in range(count):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(_open_request(port)))
    offered = count / (time.perf_counter() - start)
    return list(await asyncio.gather(*tasks)), offered


async def _sample_rss(process: psutil.Process, peak: list[int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], process.memory_info().rss)
        await asyncio.sleep(0.05)


@dataclass
class Outcome:
    warm: list[int]  # the closed loop that measures the sustainable rate
    sustainable: float  # requests per second
    offered: float  # the burst's rate, requests per second
    burst: list[int | str]  # statuses, or what went wrong instead of an answer
    after: list[int]  # the closed loop after the burst
    after_rate: float  # its requests per second
    peak_rss: int


async def _scenario(port: int, process: psutil.Process) -> Outcome:
    peak, stop = [process.memory_info().rss], asyncio.Event()
    sampler = asyncio.create_task(_sample_rss(process, peak, stop))
    warm, sustainable = await closed_loop(port, CLOSED_S)
    rate = min(BURST_FACTOR * sustainable, MAX_BURST_RATE)
    burst, offered = await open_loop(port, rate, BURST_S)
    after, after_rate = await closed_loop(port, CLOSED_S)
    stop.set()
    await sampler
    return Outcome(warm, sustainable, offered, burst, after, after_rate, peak[0])


@pytest.mark.slow
def test_a_burst_is_answered_fast_or_refused_and_the_server_recovers(tmp_path: Path) -> None:
    write_entry(tmp_path / "repo", "slow", make_slow_onnx(tmp_path / "s.onnx", WIDTH, DEPTH),
                CONFIG)
    server = start_server(tmp_path / "repo", tmp_path / "server.log")
    process = psutil.Process(server.process.pid)
    try:
        before = process.memory_info().rss
        result = asyncio.run(_scenario(server.http_port, process))
        after = process.memory_info().rss
        counts = Counter(result.burst)
        answered = sum(n for outcome, n in counts.items() if isinstance(outcome, int))
        failed = len(result.burst) - counts[200]
        print(f"\nburst: sustainable {result.sustainable:.0f} req/s, offered "
              f"{result.offered:.0f} req/s for {BURST_S:g} s; sent {len(result.burst)} "
              f"answered {answered} failed {failed} ({dict(counts)}); after the burst "
              f"{len(result.after)} answered ({dict(Counter(result.after))}, "
              f"{result.after_rate:.0f} req/s); RSS MiB "
              f"before {before >> 20} peak {result.peak_rss >> 20} after {after >> 20}")
        assert set(result.warm) == {200}
        assert answered == len(result.burst), counts  # none lost, none hanging
        assert set(counts) <= {200, 429, 503}, counts
        assert result.offered > 5 * result.sustainable  # it was a burst
        assert result.after and set(result.after) == {200}
        assert result.peak_rss < before + RSS_HEADROOM
        assert server.request("GET", "/v2/health/ready")[0] == 200
    finally:
        assert server.stop() == 0
