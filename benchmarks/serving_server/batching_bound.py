"""How much dynamic batching can gain at most, from three measured costs per request.

    python benchmarks/serving_server/batching_bound.py [--model mlp|digits-cnn|mlp-wide]
        [--seconds 12 --clients 32 --rounds 3]

On a CPU-bound box every request costs ``h`` (the server's CPU outside the engine: HTTP
parse and encode, dispatch, plus the load client's CPU, which runs on the same cores)
and its share of an engine run: ``c1`` for a 1-row run with batching off, ``c32 / 32``
for a full 32-row batch. Throughput is cores over CPU per request, so the best ratio of
batching on over off is

    bound = (h + c1) / (h + c32 / 32)

``c1`` and ``c32`` are measured in process (the server's session settings: all cores,
no spinning), as CPU seconds per run (``time.process_time`` counts every engine thread)
and as wall time. ``h`` is measured end to end: a batching-off server on 127.0.0.1 under
``--clients`` closed-loop HTTP clients (the ``adaptive`` load of ``bench_server.py``),
the server's CPU (its process and children, from psutil) plus this client's CPU, over
the requests answered, less ``c1``. A batching-on server (max batch 32, 2 ms adaptive
window) is measured alike in alternating windows, so the bound can be checked against
the ratio it got and the CPU per request it spent. Written to ``bound-MODEL.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).parent))
from bench_server import (
    ADAPTIVE_ON,
    BATCHING_OFF,
    HERE,
    _client,
    _small_model,
    _window,
    binary_request,
    machine,
    start_server,
)

from turboinfer.engines import EngineSettings, ModelArtifact, load_session
from turboinfer.serve.config import write_entry
from turboinfer.serve.instances import available_cores


def engine_costs(onnx: Path, x: np.ndarray, runs: int) -> dict[str, float]:
    """CPU ms and wall ms per engine run at 1 and 32 rows, medians of 5 repeats."""
    session = load_session(ModelArtifact(onnx.stem, onnx), "onnxruntime",
                           EngineSettings(intra_op_threads=available_cores(),
                                          spin_wait=False))
    result = {}
    for rows in (1, 32):
        batch = {"input": np.ascontiguousarray(np.repeat(x, rows, axis=0))}
        for _ in range(10):
            session.run(batch)
        cpu, wall = [], []
        count = max(5, runs // rows)
        for _ in range(5):
            cpu_start, wall_start = time.process_time(), time.perf_counter()
            for _ in range(count):
                session.run(batch)
            cpu.append((time.process_time() - cpu_start) / count)
            wall.append((time.perf_counter() - wall_start) / count)
        result[f"c{rows}_cpu_ms"] = float(np.median(cpu)) * 1e3
        result[f"c{rows}_wall_ms"] = float(np.median(wall)) * 1e3
    return result


def _cpu_seconds(process: psutil.Process) -> float:
    total = 0.0
    for p in [process, *process.children(recursive=True)]:
        times = p.cpu_times()
        total += times.user + times.system
    return total


def served_cost(pid: int, port: int, request: bytes, clients: int, seconds: float
                ) -> tuple[int, float, float, float]:
    """Requests, server CPU s, client CPU s and seconds of one closed-loop window,
    after a short warm-up outside the readings."""
    server = psutil.Process(pid)
    asyncio.run(_window(port, request, clients, 1.0))

    async def load() -> tuple[list[float], list[int]]:
        latencies: list[float] = []
        errors: list[int] = []
        stop_at = time.perf_counter() + seconds
        await asyncio.gather(*(_client(port, request, stop_at, latencies, errors)
                               for _ in range(clients)))
        return latencies, errors

    server_before, client_before = _cpu_seconds(server), time.process_time()
    start = time.perf_counter()
    latencies, errors = asyncio.run(load())
    elapsed = time.perf_counter() - start
    server_cpu = _cpu_seconds(server) - server_before
    client_cpu = time.process_time() - client_before
    assert not errors, f"{len(errors)} failed requests"
    return len(latencies), server_cpu, client_cpu, elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["mlp", "digits-cnn", "mlp-wide"],
                        default="digits-cnn")
    parser.add_argument("--seconds", type=float, default=12.0,
                        help="measured seconds per server, split over the rounds")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=2000,
                        help="1-row engine runs per repeat (32-row: this over 32)")
    args = parser.parse_args()
    before = machine()
    with tempfile.TemporaryDirectory() as tmp:
        onnx, x = _small_model(args.model, Path(tmp))
        request = binary_request(args.model, x)
        totals = {label: [0.0, 0.0, 0.0, 0.0] for label in ("off", "on")}
        processes, ports = {}, {}
        for label, config in (("off", BATCHING_OFF), ("on", ADAPTIVE_ON)):
            write_entry(Path(tmp) / label, args.model, onnx, config)
            processes[label], ports[label], _ = start_server(Path(tmp) / label)
        try:
            for round_ in range(args.rounds):
                order = ("off", "on") if round_ % 2 == 0 else ("on", "off")
                for label in order:
                    counts = served_cost(processes[label].pid, ports[label], request,
                                         args.clients, args.seconds / args.rounds)
                    for i, value in enumerate(counts):
                        totals[label][i] += value
                    print(f"round {round_} {label}", flush=True)
        finally:
            for process in processes.values():
                process.terminate()
                process.wait()
        engine = engine_costs(onnx, x, args.runs)  # both servers stopped meanwhile
    served = {}
    for label, (requests, server_cpu, client_cpu, seconds) in totals.items():
        served[label] = {"requests": int(requests), "throughput_rps": requests / seconds,
                         "cores_used": (server_cpu + client_cpu) / seconds,
                         "server_cpu_ms_per_request": server_cpu / requests * 1e3,
                         "client_cpu_ms_per_request": client_cpu / requests * 1e3,
                         "cpu_ms_per_request": (server_cpu + client_cpu) / requests * 1e3}
    h = served["off"]["cpu_ms_per_request"] - engine["c1_cpu_ms"]
    per_row_32 = engine["c32_cpu_ms"] / 32
    # With batching on, the per-request cost outside the engine is lower than h: the
    # server's engine hand-off and wake-ups, and the client's, are paid per batch.
    h_on = served["on"]["cpu_ms_per_request"] - per_row_32
    off_cpu = served["off"]["cpu_ms_per_request"]
    result = {
        "model": args.model, "clients": args.clients, "engine": engine, "served": served,
        "h_ms": h,
        "bound_cpu": (h + engine["c1_cpu_ms"]) / (h + per_row_32),
        "bound_wall": (h + engine["c1_wall_ms"]) / (h + engine["c32_wall_ms"] / 32),
        "engine_only_ratio_cpu": engine["c1_cpu_ms"] / per_row_32,
        "h_on_ms": h_on,
        "bound_with_h_on": off_cpu / (h_on + per_row_32),
        "on_cpu_ms_per_request_needed_for_4x": off_cpu / 4,
        "h_on_needed_for_4x_ms": off_cpu / 4 - per_row_32,
        "measured_cpu_per_request_off_over_on": off_cpu / served["on"]["cpu_ms_per_request"],
        "measured_on_over_off_throughput":
            served["on"]["throughput_rps"] / served["off"]["throughput_rps"],
    }
    output = {"machine": before, "load_average_1m_after": os.getloadavg()[0],
              "command": " ".join(["python", *sys.argv]), "result": result}
    text = json.dumps(output, indent=2)
    (HERE / f"bound-{args.model}.json").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
