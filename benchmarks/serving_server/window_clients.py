"""The batch window as clients are added: this checkout's server against another
checkout's (``--baseline-src``, a ``git worktree`` of the commit to compare with), side by
side, loaded by this checkout's ``turboinfer load``.

    python benchmarks/serving_server/window_clients.py --baseline-src OLD/src [--rounds 3]

Both servers serve the same two small CNNs with max batch 32 and a 5 ms queue delay:
builtin:digits-cnn (1x8x8 digits) and ``small-cnn``, a CIFAR-sized CNN built here
(3x32x32 -> conv 16 -> conv 32 stride 2 -> pool -> 10). Each round, for every model:

- closed loop (``--scenario concurrency``) at 1, 2, 4, 8, 16 and 32 clients, one level
  per call, the two servers alternating (which goes first alternates by round);
- open loop (``--scenario poisson``) at a few fixed rates, alternating the same way.

Per cell the median over rounds of throughput, p50 and p99. Then ``doctor URL`` watches
each server for a few seconds while 2 clients load it, and the rules it fired are
recorded: the baseline's fixed wait is the symptom ``batch_window`` names.

Raw figures, the machine and the load averages go to ``window_clients.json`` (or
``--output``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from openloop import _cpu, _stop, start_turboinfer, wait_ready

from turboinfer.models import resolve_model
from turboinfer.serve.config import DynamicBatching, ModelConfig, write_entry

HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent / "src"
CONFIG = ModelConfig(max_batch_size=32, dynamic_batching=DynamicBatching(max_queue_delay_ms=5.0))
CLIENTS = (1, 2, 4, 8, 16, 32)
MODELS = ("digits-cnn", "small-cnn")


def small_cnn(path: Path) -> Path:
    """A CIFAR-sized CNN with random weights: [batch, 3, 32, 32] -> [batch, 10]."""
    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        fan_in = int(np.prod(shape[1:]))
        data = (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
        return numpy_helper.from_array(data, name)

    nodes = [
        helper.make_node("Conv", ["input", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "w3"], ["output"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "small_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 10])],
        initializer=[weight("w1", 16, 3, 3, 3), weight("w2", 32, 16, 3, 3),
                     weight("w3", 10, 32)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _load(port: int, model: str, extra: list[str], out: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "turboinfer", "load", f"http://127.0.0.1:{port}",
               "--model", model, "--binary", "--quiet", "--output", str(out), *extra]
    out.unlink(missing_ok=True)
    done = subprocess.run(command, env=dict(os.environ, PYTHONPATH=str(SRC)),
                          capture_output=True, text=True, timeout=300, check=False)
    if not out.exists():
        raise RuntimeError(f"turboinfer load failed: {done.stderr.strip()}")
    run = json.loads(out.read_text())["runs"][0]
    server = run.get("server") or {}
    return {"qps": run["qps"], "p50_ms": run["latency"]["p50_ms"],
            "p99_ms": run["latency"]["p99_ms"], "failed": run["failed"],
            "send_lag_p99_ms": run.get("send_lag_p99_ms"),
            "avg_batch": server.get("avg_batch_size"), "queue_ms": server.get("queue_ms")}


def closed(port: int, model: str, clients: int, args: argparse.Namespace, out: Path
           ) -> dict[str, Any]:
    return _load(port, model, ["--scenario", "concurrency", "--concurrency", str(clients),
                               "--window", f"{args.window_s}s", "--max-windows",
                               str(args.max_windows), "--warmup", "0.5"], out)


def poisson(port: int, model: str, rate: float, args: argparse.Namespace, out: Path
            ) -> dict[str, Any]:
    return _load(port, model, ["--scenario", "poisson", "--rate", str(rate), "--duration",
                               f"{args.poisson_s}s", "--warmup", "0.5", "--seed", "1"], out)


def doctor_fires(port: int, model: str, out: Path) -> dict[str, Any]:
    """The rules ``doctor URL`` fires over a 5 s window while 2 clients load the server."""
    loader = threading.Thread(target=_load, args=(port, model, [
        "--scenario", "concurrency", "--concurrency", "2", "--window", "3s",
        "--max-windows", "3"], out.with_suffix(".load.json")))
    loader.start()
    time.sleep(1.5)
    done = subprocess.run(
        [sys.executable, "-m", "turboinfer", "doctor", f"http://127.0.0.1:{port}", "--model",
         model, "--window", "5s", "--json"], env=dict(os.environ, PYTHONPATH=str(SRC)),
        capture_output=True, text=True, timeout=120, check=False)
    loader.join()
    report = json.loads(done.stdout)
    return {f["rule"]: {"severity": f["severity"], "evidence": f["evidence"], "fix": f["fix"]}
            for f in report.get("findings", [])}


def _median(cells: list[dict[str, Any]]) -> dict[str, float]:
    keys = ("qps", "p50_ms", "p99_ms", "avg_batch", "queue_ms")
    return {k: statistics.median(c[k] for c in cells if c.get(k) is not None)
            for k in keys if any(c.get(k) is not None for c in cells)}


def verdicts(summary: dict[str, Any]) -> dict[str, Any]:
    """The acceptance points of the batch-window issue, per model, on the medians."""
    out: dict[str, Any] = {}
    for model, servers in summary.items():
        cur, base = servers["current"]["closed"], servers["baseline"]["closed"]
        one = cur["1"]["qps"]
        out[model] = {
            "never_below_1_client": all(cur[str(n)]["qps"] >= one for n in (2, 4, 8, 16)),
            "8_clients_over_1": cur["8"]["qps"] / one,
            "p50_2_to_8_over_1": max(cur[str(n)]["p50_ms"] for n in (2, 4, 8))
            / cur["1"]["p50_ms"],
            "1_client_vs_baseline": one / base["1"]["qps"],
            "32_clients_vs_baseline": cur["32"]["qps"] / base["32"]["qps"],
            "poisson_p99_vs_baseline": {
                rate: servers["current"]["poisson"][rate]["p99_ms"]
                / servers["baseline"]["poisson"][rate]["p99_ms"]
                for rate in servers["current"]["poisson"]},
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline-src", required=True, type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-s", type=float, default=1.0)
    parser.add_argument("--max-windows", type=int, default=3)
    parser.add_argument("--poisson-s", type=float, default=4.0)
    parser.add_argument("--rates", default="200,1000,3000")
    parser.add_argument("--output", default="window_clients.json",
                        help="file name for the raw results, beside this script")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    sources = {"current": SRC, "baseline": args.baseline_src.resolve()}
    loads = [os.getloadavg()[0]]
    raw: dict[str, dict[str, dict[str, dict[str, list[dict[str, Any]]]]]] = {}
    fired: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        files = {"digits-cnn": resolve_model("builtin:digits-cnn").artifact.onnx_path,
                 "small-cnn": small_cnn(work / "small-cnn.onnx")}
        processes, ports = [], {}
        for i, (label, src) in enumerate(sources.items()):
            repo = work / label
            for model, path in files.items():
                write_entry(repo, model, path, CONFIG)
            ports[label] = 8700 + i
            processes.append(start_turboinfer(repo, src, ports[label], work))
        try:
            for label, port in ports.items():
                for model in MODELS:
                    wait_ready(port, processes[list(ports).index(label)], model=model)
            for round_ in range(args.rounds):
                order = list(sources) if round_ % 2 == 0 else list(reversed(sources))
                for model in MODELS:
                    for n in CLIENTS:
                        for label in order:
                            cell = closed(ports[label], model, n, args, work / "out.json")
                            raw.setdefault(model, {}).setdefault(label, {}).setdefault(
                                "closed", {}).setdefault(str(n), []).append(cell)
                            print(f"round {round_} {model} {label} {n} clients "
                                  f"{cell['qps']:.0f} req/s p50 {cell['p50_ms']:.2f} ms",
                                  flush=True)
                    for rate in rates:
                        for label in order:
                            cell = poisson(ports[label], model, rate, args, work / "out.json")
                            raw[model][label].setdefault("poisson", {}).setdefault(
                                f"{rate:g}", []).append(cell)
                            print(f"round {round_} {model} {label} poisson {rate:g}/s "
                                  f"p99 {cell['p99_ms']:.2f} ms", flush=True)
                loads.append(os.getloadavg()[0])
            for label, port in ports.items():
                fired[label] = doctor_fires(port, "digits-cnn", work / f"doctor-{label}.json")
        finally:
            for process in processes:
                _stop(process)
    summary = {model: {label: {kind: {key: _median(cells) for key, cells in by_key.items()}
                               for kind, by_key in kinds.items()}
                       for label, kinds in servers.items()}
               for model, servers in raw.items()}
    result = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "config": {"max_batch_size": 32, "max_queue_delay_ms": 5.0},
        "machine": {"cpu": _cpu(), "cores": os.cpu_count(), "load_average_1m": loads},
        "summary": summary, "verdicts": verdicts(summary), "doctor_at_2_clients": fired,
        "raw": raw,
    }
    (HERE / args.output).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"verdicts": result["verdicts"],
                      "doctor": {k: sorted(v) for k, v in fired.items()}}, indent=1))


if __name__ == "__main__":
    main()
