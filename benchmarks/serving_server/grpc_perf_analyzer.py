"""gRPC (unary and streamed) against HTTP on one server, driven by NVIDIA's perf_analyzer.

    python benchmarks/serving_server/grpc_perf_analyzer.py --perf-analyzer PATH
        [--preload SHIM.so] [--rounds 3] [--seconds 4]

builtin:digits-cnn, batch-1 requests, one ``turboinfer serve`` (max batch 32, no queue
delay), loaded by perf_analyzer as it comes (``-i http``, ``-i grpc``, ``-i grpc
--streaming``) at concurrency 1 and 8, the three alternating in an order that reverses
every round. Each cell is one perf_analyzer run of one measurement window
(``--stability-percentage 999``: the machine is shared, so a fixed length per cell, and
the rounds give the spread). Besides perf_analyzer's throughput and latencies, each cell
records the server's CPU time per request (its process's user + system time over the
run / the requests the server's statistics counted in it) and perf_analyzer's own CPU
time per request. ``--preload`` is put in ``LD_PRELOAD`` for perf_analyzer (a library
of symbols its binary needs that an older C library lacks). Raw results go to
``grpc_perf_analyzer.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from grpc_http import CONFIG, MODEL, cpu_seconds, start  # the script beside this one

from turboinfer.hardware.cpu import read_cpu
from turboinfer.models import resolve_model
from turboinfer.serve.config import write_entry

HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent / "src"
TRANSPORTS = {"http": ["-i", "http"], "grpc": ["-i", "grpc"],
              "grpc-stream": ["-i", "grpc", "--streaming"]}


def served(http_port: int) -> tuple[int, int]:
    """The model's (inference_count, execution_count) so far, from the server."""
    url = f"http://127.0.0.1:{http_port}/v2/models/{MODEL}/stats"
    with urllib.request.urlopen(url, timeout=30) as reply:
        stats = json.loads(reply.read())["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def measure(binary: str, env: dict[str, str], pid: int, http_port: int, grpc_port: int,
            transport: str, concurrency: int, seconds: float, out: Path) -> dict[str, Any]:
    url = f"127.0.0.1:{http_port if transport == 'http' else grpc_port}"
    command = [binary, "-m", MODEL, "-u", url, *TRANSPORTS[transport],
               "--concurrency-range", str(concurrency), "--measurement-interval",
               str(int(seconds * 1000)), "--stability-percentage", "999",
               "--max-trials", "3", "-f", str(out)]
    rows_before, runs_before = served(http_port)
    server_before = cpu_seconds(pid)
    client_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    client_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_used = cpu_seconds(pid) - server_before
    rows_after, runs_after = served(http_port)
    if done.returncode != 0:
        raise RuntimeError(f"perf_analyzer failed: {done.stdout[-1500:]}{done.stderr[-1500:]}")
    with out.open() as table:
        row = next(csv.DictReader(table))
    requests = max(1, rows_after - rows_before)
    client_used = ((client_after.ru_utime + client_after.ru_stime)
                   - (client_before.ru_utime + client_before.ru_stime))
    return {"qps": float(row["Inferences/Second"]),
            "p50_ms": float(row["p50 latency"]) / 1e3,
            "p99_ms": float(row["p99 latency"]) / 1e3,
            "requests": requests,
            "server_cpu_ms_per_request": 1e3 * server_used / requests,
            "client_cpu_ms_per_request": 1e3 * client_used / requests,
            "mean_batch_rows": requests / max(1, runs_after - runs_before),
            "load_average_1m": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--perf-analyzer", required=True, help="the perf_analyzer binary")
    parser.add_argument("--preload", default=None, help="a library to LD_PRELOAD into it")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0,
                        help="perf_analyzer's measurement window per cell")
    parser.add_argument("--output", type=Path, default=HERE / "grpc_perf_analyzer.json")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.preload:
        env["LD_PRELOAD"] = args.preload
    shown = subprocess.run([args.perf_analyzer, "--version"], env=env, capture_output=True,
                           text=True, check=False)
    version = [line for line in (shown.stdout + shown.stderr).splitlines()
               if "Version" in line]
    onnx = resolve_model(f"builtin:{MODEL}").artifact.onnx_path
    cells: dict[str, list[dict[str, Any]]] = {}
    result: dict[str, Any] = {
        "machine": {"cpu": read_cpu().model_name, "cores": os.cpu_count(),
                    "load_average_1m_before": os.getloadavg()[0]},
        "perf_analyzer": version, "rounds": args.rounds, "seconds_per_cell": args.seconds,
        "cells": cells}
    with tempfile.TemporaryDirectory(prefix="grpc-pa-") as tmp:
        work = Path(tmp)
        write_entry(work / "repo", MODEL, onnx, CONFIG)
        process, http_port, grpc_port = start(work / "repo", SRC, work / "server.log")
        try:
            for round_ in range(args.rounds):
                order = list(TRANSPORTS) if round_ % 2 == 0 else list(TRANSPORTS)[::-1]
                for concurrency in (1, 8):
                    for transport in order:
                        cell = measure(args.perf_analyzer, env, process.pid, http_port,
                                       grpc_port, transport, concurrency, args.seconds,
                                       work / "pa.csv")
                        key = f"{transport} c{concurrency}"
                        cells.setdefault(key, []).append(cell)
                        print(f"round {round_} {key}: {cell['qps']:.0f} req/s, server "
                              f"{cell['server_cpu_ms_per_request']:.3f} + perf_analyzer "
                              f"{cell['client_cpu_ms_per_request']:.3f} CPU ms/req, p50 "
                              f"{cell['p50_ms']:.2f} ms, rows/run "
                              f"{cell['mean_batch_rows']:.2f} (load "
                              f"{cell['load_average_1m']:.1f})", flush=True)
        finally:
            process.terminate()
            process.wait()
    result["median"] = {key: {name: float(np.median([c[name] for c in values]))
                              for name in values[0]} for key, values in cells.items()}
    ratios: dict[str, Any] = {}
    for key, values in cells.items():
        transport, concurrency = key.split(" ")
        if transport == "http":
            continue
        http = cells[f"http {concurrency}"]
        # Per round: the transports ran back to back, under the same background.
        ratios[key] = {
            "qps_over_http": [g["qps"] / h["qps"] for g, h in zip(values, http, strict=True)],
            "server_cpu_over_http": [g["server_cpu_ms_per_request"]
                                     / h["server_cpu_ms_per_request"]
                                     for g, h in zip(values, http, strict=True)]}
    result["ratios_per_round"] = ratios
    result["load_average_1m_after"] = os.getloadavg()[0]
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(ratios, indent=1))


if __name__ == "__main__":
    main()
