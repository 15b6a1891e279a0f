"""gRPC against HTTP on the same server, at concurrency 1 and 8, in alternating rounds.

    python benchmarks/serving_server/grpc_http.py [--baseline-src OLD/src] [--rounds 4]

builtin:digits-cnn, batch-1 requests, one ``turboinfer serve`` (max batch 32, no queue
delay) loaded by ``turboinfer load --scenario concurrency`` with ``--protocol grpc`` and
with HTTP binary tensors, the two alternating within each round so background load
hits both alike. Besides throughput and latency, each cell records the server's CPU time
per request (its process's user + system time over the run / requests answered): on a
shared machine that cost is steadier than the rate, and it is what the transport adds.
With ``--baseline-src`` (a ``git worktree`` of another commit) that commit's server is
measured the same way in the same rounds. Raw results go to ``grpc_http.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from turboinfer.models import resolve_model
from turboinfer.serve.config import DynamicBatching, ModelConfig, write_entry

HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent / "src"
MODEL = "digits-cnn"
CONFIG = ModelConfig(max_batch_size=32,
                     dynamic_batching=DynamicBatching(max_queue_delay_ms=0.0))
TICKS = os.sysconf("SC_CLK_TCK")
WARMUP_S = 1.0


def start(repo: Path, src: Path, log: Path) -> tuple[subprocess.Popen[str], int, int]:
    process = subprocess.Popen(
        [sys.executable, "-m", "turboinfer", "serve", str(repo), "--http-port", "0",
         "--grpc-port", "0", "--model-control", "none"], stdout=subprocess.PIPE,
        stderr=log.open("w"), text=True, env=dict(os.environ, PYTHONPATH=str(src)))
    assert process.stdout is not None
    fields = dict(part.split("=", 1) for part in process.stdout.readline().split()[2:])
    return (process, int(fields["http"].rsplit(":", 1)[1]),
            int(fields["grpc"].rsplit(":", 1)[1]))


def cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / TICKS  # utime + stime


def measure(pid: int, http_port: int, grpc_port: int, protocol: str, concurrency: int,
            out: Path, seconds: float) -> dict[str, float]:
    target = (["--protocol", "grpc", f"127.0.0.1:{grpc_port}"] if protocol == "grpc"
              else ["--binary", f"http://127.0.0.1:{http_port}"])
    # Three windows, always "stable" (tolerance 1.0): a fixed length per cell.
    command = [sys.executable, "-m", "turboinfer", "load", *target, "--model", MODEL,
               "--scenario", "concurrency", "--concurrency", str(concurrency), "--window",
               f"{seconds / 3:g}", "--max-windows", "3", "--stability", "1.0", "--warmup",
               f"{WARMUP_S:g}", "--no-metrics", "--quiet", "--output", str(out)]
    before = cpu_seconds(pid)
    subprocess.run(command, env=dict(os.environ, PYTHONPATH=str(SRC)), capture_output=True,
                   timeout=600, check=False)
    used = cpu_seconds(pid) - before
    run = json.loads(out.read_text())["runs"][-1]
    # The server's CPU time also paid for the warm-up, at about the same rate.
    answered = run["ok"] + run["qps"] * WARMUP_S
    return {"qps": run["qps"], "p50_ms": run["latency"]["p50_ms"],
            "p99_ms": run["latency"]["p99_ms"], "client_cpu": run["client_cpu"],
            "server_cpu_ms_per_request": 1e3 * used / max(1.0, answered),
            "load_average_1m": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-src", type=Path, default=None,
                        help="the src/ folder of another checkout to measure alongside")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=6.0, help="per cell and round")
    args = parser.parse_args()
    onnx = resolve_model(f"builtin:{MODEL}").artifact.onnx_path
    sides = {"current": SRC}
    if args.baseline_src is not None:
        sides["baseline"] = args.baseline_src.resolve()
    cells: dict[str, list[dict[str, float]]] = {}
    result: dict = {"machine": {"cpu": _cpu(), "cores": os.cpu_count(),
                                "load_average_1m": os.getloadavg()[0]},
                    "rounds": args.rounds, "seconds_per_cell": args.seconds, "cells": cells}
    with tempfile.TemporaryDirectory(prefix="grpc-http-") as tmp:
        work = Path(tmp)
        write_entry(work / "repo", MODEL, onnx, CONFIG)
        servers = {side: start(work / "repo", src, work / f"{side}.log")
                   for side, src in sides.items()}
        try:
            for round_ in range(args.rounds):
                protocols = ("http", "grpc") if round_ % 2 == 0 else ("grpc", "http")
                for side, (process, http_port, grpc_port) in servers.items():
                    for concurrency in (1, 8):
                        for protocol in protocols:
                            key = f"{side} {protocol} c{concurrency}"
                            cell = measure(process.pid, http_port, grpc_port, protocol,
                                           concurrency, work / "report.json", args.seconds)
                            cells.setdefault(key, []).append(cell)
                            print(f"round {round_} {key}: {cell['qps']:.0f} req/s, "
                                  f"{cell['server_cpu_ms_per_request']:.3f} server CPU ms"
                                  f"/req (load {cell['load_average_1m']:.1f})", flush=True)
        finally:
            for process, _, _ in servers.values():
                process.terminate()
                process.wait()
    result["median"] = {key: {name: float(np.median([c[name] for c in values]))
                              for name in values[0]} for key, values in cells.items()}
    ratios = {}
    for side in sides:
        for concurrency in (1, 8):
            grpc_cells = cells[f"{side} grpc c{concurrency}"]
            http_cells = cells[f"{side} http c{concurrency}"]
            # Per round: the two protocols ran back to back, under the same background.
            ratios[f"{side} c{concurrency}"] = {
                "grpc_over_http_qps_per_round": [g["qps"] / h["qps"] for g, h in
                                                 zip(grpc_cells, http_cells, strict=True)],
                "grpc_over_http_server_cpu_per_round": [
                    g["server_cpu_ms_per_request"] / h["server_cpu_ms_per_request"]
                    for g, h in zip(grpc_cells, http_cells, strict=True)]}
            for name in list(ratios[f"{side} c{concurrency}"]):
                values = ratios[f"{side} c{concurrency}"][name]
                ratios[f"{side} c{concurrency}"][name.replace("_per_round", "_median")] = (
                    float(np.median(values)))
    result["ratios"] = ratios
    result["load_average_1m_after"] = os.getloadavg()[0]
    (HERE / "grpc_http.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(ratios, indent=1))


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return ""


if __name__ == "__main__":
    main()
