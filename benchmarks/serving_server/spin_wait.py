"""ONNX Runtime's spinning intra-op threads against a serving event loop.

    python benchmarks/serving_server/spin_wait.py [--rounds 3] [--concurrency 16]

Two ``turboinfer serve`` processes side by side, identical but for ``engine_settings:
{spin_wait: true}`` (ONNX Runtime's default: intra-op threads spin between runs) and
``{spin_wait: false}`` (the server's default), each serving the serving benchmarks' MLP
and builtin:digits-cnn with max batch 32 and a 2 ms queue delay, loaded in alternating
closed-loop cells over HTTP. Per cell: throughput, p50/p99 and the server's CPU time
per request. Raw results go to ``spin_wait.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from turboinfer.models import resolve_model
from turboinfer.serve.config import (
    DynamicBatching,
    EngineSettingsConfig,
    ModelConfig,
    write_entry,
)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "serving"))
from grpc_http import SRC, cpu_seconds, start  # noqa: E402
from model import write_mlp  # noqa: E402


def config(spin: bool) -> ModelConfig:
    return ModelConfig(max_batch_size=32,
                       dynamic_batching=DynamicBatching(max_queue_delay_ms=2.0),
                       engine_settings=EngineSettingsConfig(spin_wait=spin))


def measure(pid: int, port: int, model: str, concurrency: int, out: Path) -> dict[str, float]:
    import subprocess  # why: only the load runs need it

    command = [sys.executable, "-m", "turboinfer", "load", f"http://127.0.0.1:{port}",
               "--model", model, "--binary", "--scenario", "concurrency", "--concurrency",
               str(concurrency), "--window", "2", "--max-windows", "3", "--stability", "1.0",
               "--warmup", "1", "--no-metrics", "--quiet", "--output", str(out)]
    before = cpu_seconds(pid)
    subprocess.run(command, env=dict(os.environ, PYTHONPATH=str(SRC)), capture_output=True,
                   timeout=600, check=False)
    used = cpu_seconds(pid) - before
    run = json.loads(out.read_text())["runs"][-1]
    return {"qps": run["qps"], "p50_ms": run["latency"]["p50_ms"],
            "p99_ms": run["latency"]["p99_ms"],
            "server_cpu_ms_per_request": 1e3 * used / max(1.0, run["ok"] + run["qps"]),
            "load_average_1m": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    cells: dict[str, list[dict[str, float]]] = {}
    result: dict = {"load_average_1m_before": os.getloadavg()[0], "cores": os.cpu_count(),
                    "concurrency": args.concurrency, "cells": cells}
    with tempfile.TemporaryDirectory(prefix="spin-") as tmp:
        work = Path(tmp)
        mlp = write_mlp(work / "mlp.onnx")
        cnn = resolve_model("builtin:digits-cnn").artifact.onnx_path
        servers = {}
        for label, spin in (("spin", True), ("no_spin", False)):
            write_entry(work / label, "mlp", mlp, config(spin))
            write_entry(work / label, "digits-cnn", cnn, config(spin))
            servers[label] = start(work / label, SRC, work / f"{label}.log")
        try:
            for round_ in range(args.rounds):
                order = ["spin", "no_spin"] if round_ % 2 == 0 else ["no_spin", "spin"]
                for model in ("mlp", "digits-cnn"):
                    for label in order:
                        process, port, _ = servers[label]
                        cell = measure(process.pid, port, model, args.concurrency,
                                       work / "report.json")
                        cells.setdefault(f"{label} {model}", []).append(cell)
                        print(f"round {round_} {label} {model}: {cell}", flush=True)
        finally:
            for process, _, _ in servers.values():
                process.terminate()
                process.wait()
    result["median"] = {key: {name: float(np.median([c[name] for c in values]))
                              for name in values[0]} for key, values in cells.items()}
    result["no_spin_over_spin_qps_median"] = {
        model: float(np.median([n["qps"] / s["qps"] for n, s in zip(
            cells[f"no_spin {model}"], cells[f"spin {model}"], strict=True)]))
        for model in ("mlp", "digits-cnn")}
    result["load_average_1m_after"] = os.getloadavg()[0]
    (HERE / "spin_wait.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["median"], indent=1))


if __name__ == "__main__":
    main()
