"""Throughput of one compute-bound model on Ray Serve, 2 replicas of one thread each vs
1 replica, beside the single-process ``turboinfer serve`` (1 instance, and 2 instances, of one
thread each), under the same closed-loop load (``turboinfer load --scenario
concurrency``), on this machine.

    python benchmarks/scaleout/run.py [--rounds 3] [--concurrency 16] [--rows 1]
        [--window 3] [--max-windows 4] [--warmup 2] [--calm-load 3 --calm-wait 120]

One ``turboinfer serve REPO --ray`` serves the model twice, as two entries whose
autoscaling section pins the replica count (chain-r1: 1 replica, chain-r2: 2); two plain
``turboinfer serve`` processes serve the 1- and 2-instance entries. All four stay up;
the rounds visit them in turn (the order rotating each round), so background load on
this shared machine falls on all of them alike. Raw load reports and the machine go to
``results.json`` beside this script.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import psutil
from onnx import TensorProto, helper, numpy_helper

from turboinfer.serve.config import (
    AutoscalingConfig,
    DynamicBatching,
    EngineSettingsConfig,
    ModelConfig,
    write_entry,
)

HERE = Path(__file__).resolve().parent
WIDTH, DEPTH = 1024, 64  # 67 M multiply-adds per row: compute-bound once batched

READY = "turboinfer serving"


def write_chain(path: Path) -> Path:
    """``DEPTH`` layers of ``relu(x @ W)`` with one shared ``WIDTH`` x ``WIDTH`` weight
    (4 MiB, cache-resident): the time goes into arithmetic, not into the server, so the
    replicas' compute dominates and the serving path's own cost shows as the gap to 2x."""
    rng = np.random.default_rng(1)
    weight = (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
    nodes, previous = [], "input"
    for i in range(DEPTH):
        nodes.append(helper.make_node("MatMul", [previous, "w"], [f"m{i}"]))
        nodes.append(helper.make_node("Relu", [f"m{i}"], [f"h{i}"]))
        previous = f"h{i}"
    nodes.append(helper.make_node("Identity", [previous], ["output"]))
    graph = helper.make_graph(
        nodes, "chain",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", WIDTH])],
        initializer=[numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def entry(instances: int = 1, replicas: int | None = None, max_batch: int = 8) -> ModelConfig:
    """One thread per instance, batches of up to ``max_batch`` rows within 2 ms."""
    scaling = (AutoscalingConfig(enabled=True, min_instances=replicas, max_instances=replicas)
               if replicas else AutoscalingConfig())
    return ModelConfig(max_batch_size=max_batch, instances=instances,
                       dynamic_batching=DynamicBatching(max_queue_delay_ms=2.0),
                       engine_settings=EngineSettingsConfig(intra_op_threads=1),
                       autoscaling=scaling)


def start(command: list[str], log: Path) -> tuple[subprocess.Popen[str], int]:
    with log.open("w") as err:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True,
                                   env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if not line.startswith(READY):
        process.kill()
        raise RuntimeError(f"{command}: {line!r}\n{log.read_text()[-2000:]}")
    return process, int(line.split("http=")[1].split()[0].rsplit(":", 1)[1])


def load(port: int, model: str, args: argparse.Namespace, out: Path) -> dict:
    subprocess.run([sys.executable, "-m", "turboinfer", "load", f"http://127.0.0.1:{port}",
                    "--model", model, "--binary", "--batch-size", str(args.rows),
                    "--scenario", "concurrency", "--concurrency", str(args.concurrency),
                    "--window", str(args.window), "--max-windows", str(args.max_windows),
                    "--warmup", str(args.warmup), "--timeout", "60", "--quiet", "--no-metrics",
                    "--output", str(out)], check=True, capture_output=True, timeout=600)
    return json.loads(out.read_text())


def wait_for_calm(threshold: float, longest: float) -> float:
    """Wait up to ``longest`` seconds for the 1-minute load average to drop below
    ``threshold`` (other jobs share this machine); return the seconds waited."""
    began = time.monotonic()
    while os.getloadavg()[0] >= threshold and time.monotonic() - began < longest:
        time.sleep(5)
    return round(time.monotonic() - began, 1)


def engine_rate(model: Path, rows: int, start_at: float, seconds: float) -> float:
    """Requests/s of one bare one-thread onnxruntime session over ``rows``-row inputs,
    no server in the way, from wall-clock ``start_at`` (so parallel workers overlap)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    batch = np.random.default_rng(0).standard_normal((rows, WIDTH)).astype(np.float32)
    session.run(None, {"input": batch})
    time.sleep(max(0.0, start_at - time.time()))
    began, done = time.perf_counter(), 0
    while time.perf_counter() - began < seconds:
        session.run(None, {"input": batch})
        done += 1
    return done / (time.perf_counter() - began)


def bare_engines(model: Path, rows: int, processes: int, seconds: float) -> float:
    """Requests/s of ``processes`` bare engines side by side: the machine's own ceiling
    for the scale-out ratio (what two cores give two one-thread engines right now)."""
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        rates = pool.starmap(engine_rate,
                             [(model, rows, time.time() + 5, seconds)] * processes)
    return sum(rates)


def cpu_seconds(roots: list[int]) -> dict[str, float]:
    """CPU seconds so far of each serving process under ``roots``, by role: the Ray
    workers by their title (ray::ProxyActor, ray::ServeReplica:APP:DEPLOYMENT), every
    other process of a tree under its root's name."""
    seconds: dict[str, float] = {}
    for root in roots:
        try:
            parent = psutil.Process(root)
            tree = [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for process in tree:
            try:
                title = process.cmdline()[0] if process.cmdline() else process.name()
                times = process.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            role = title.split(":")[-1] if title.startswith("ray::") else f"pid{root}"
            if title.startswith("ray::ProxyActor"):
                role = "ray-proxy"
            seconds[role] = seconds.get(role, 0.0) + times.user + times.system
    return seconds


def cpu_per_request(before: dict[str, float], after: dict[str, float],
                    requests: int) -> dict[str, float]:
    """Milliseconds of CPU per request, by role, over one load run (warm-up included)."""
    return {role: round(1000 * (after[role] - before.get(role, 0.0)) / max(1, requests), 2)
            for role in after if after[role] - before.get(role, 0.0) > 0.05}


def summary(report: dict) -> dict:
    run = report["runs"][-1]
    return {"qps": run["qps"], "p50_ms": run["latency"]["p50_ms"],
            "p99_ms": run["latency"]["p99_ms"], "failed": run["failed"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rows", type=int, default=1,
                        help="rows per request: more makes each request's compute outweigh "
                             "the serving path's own cost")
    parser.add_argument("--window", type=float, default=3.0,
                        help="seconds per measurement window of each load run")
    parser.add_argument("--max-windows", type=int, default=4)
    parser.add_argument("--warmup", type=float, default=2.0,
                        help="unmeasured seconds of load before each run")
    parser.add_argument("--calm-load", type=float, default=0.0,
                        help="before each round, wait for the 1-minute load average to "
                             "drop below this (0: do not wait)")
    parser.add_argument("--calm-wait", type=float, default=120.0,
                        help="longest wait for --calm-load, in seconds")
    parser.add_argument("--output", type=Path, default=HERE / "results.json")
    args = parser.parse_args()
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    machine = {"cpu": next((line.split(":", 1)[1].strip() for line in cpu.splitlines()
                            if line.startswith("Model name")), platform.processor()),
               "cores": os.cpu_count(), "python": platform.python_version()}
    results: dict = {"machine": machine, "concurrency": args.concurrency,
                     "rows_per_request": args.rows, "model": f"chain {WIDTH}x{DEPTH}",
                     "command": " ".join([Path(sys.executable).name, *sys.argv]),
                     "rounds": []}
    max_batch = max(8, 2 * args.rows)
    processes: list[subprocess.Popen[str]] = []
    with tempfile.TemporaryDirectory(prefix="scaleout-bench-") as tmp:
        work = Path(tmp)
        model = write_chain(work / "chain.onnx")
        ray_repo, one, two = work / "ray", work / "one", work / "two"
        write_entry(ray_repo, "chain-r1", model, entry(replicas=1, max_batch=max_batch))
        write_entry(ray_repo, "chain-r2", model, entry(replicas=2, max_batch=max_batch))
        write_entry(one, "chain", model, entry(instances=1, max_batch=max_batch))
        write_entry(two, "chain", model, entry(instances=2, max_batch=max_batch))
        serve = [sys.executable, "-m", "turboinfer", "serve"]
        try:
            ray, ray_port = start([*serve, str(ray_repo), "--ray", "--http-port", "0",
                                   "--ray-cpus", "3"], work / "ray.log")
            processes.append(ray)
            single1, port1 = start([*serve, str(one), "--http-port", "0", "--grpc-port",
                                    "-1", "--model-control", "none"], work / "one.log")
            processes.append(single1)
            single2, port2 = start([*serve, str(two), "--http-port", "0", "--grpc-port",
                                    "-1", "--model-control", "none"], work / "two.log")
            processes.append(single2)
            systems = {"ray-1-replica": (ray_port, "chain-r1"),
                       "ray-2-replicas": (ray_port, "chain-r2"),
                       "serve-1-instance": (port1, "chain"),
                       "serve-2-instances": (port2, "chain"),
                       "engine-1-process": (0, ""), "engine-2-processes": (0, "")}
            names = list(systems)
            for number in range(args.rounds):
                order = names[number % len(names):] + names[:number % len(names)]
                waited = (wait_for_calm(args.calm_load, args.calm_wait)
                          if args.calm_load else 0.0)
                record: dict = {"waited_for_calm_s": waited,
                                "load_average_before": os.getloadavg(), "systems": {}}
                for name in order:
                    port, model_name = systems[name]
                    if name.startswith("engine"):
                        load_before = os.getloadavg()
                        rate = bare_engines(model, args.rows, 1 if name.endswith("process")
                                            else 2, args.window * args.max_windows)
                        record["systems"][name] = {
                            "summary": {"qps": rate}, "load_average_before": load_before,
                            "load_average_after": os.getloadavg()}
                        print(f"round {number + 1} {name}: {rate:.2f}/s", flush=True)
                        continue
                    roots = [ray.pid] if name.startswith("ray") else [
                        single1.pid if name == "serve-1-instance" else single2.pid]
                    before, load_before = cpu_seconds(roots), os.getloadavg()
                    report = load(port, model_name, args, work / f"{name}-{number}.json")
                    sent = sum(run["ok"] + run["failed"] for run in report["runs"])
                    record["systems"][name] = {
                        "summary": summary(report), "load_average_before": load_before,
                        "load_average_after": os.getloadavg(), "report": report,
                        "cpu_ms_per_request": cpu_per_request(before, cpu_seconds(roots),
                                                              sent)}
                    print(f"round {number + 1} {name}: {summary(report)}", flush=True)
                record["load_average_after"] = os.getloadavg()
                results["rounds"].append(record)
                args.output.write_text(json.dumps(results, indent=1) + "\n")
        finally:
            for process in processes:
                process.send_signal(signal.SIGTERM)
            for process in processes:
                try:
                    process.wait(60)
                except subprocess.TimeoutExpired:
                    process.kill()
    results["median_qps"] = {name: statistics.median(
        r["systems"][name]["summary"]["qps"] for r in results["rounds"]) for name in names}
    results["ratio_per_round_2_vs_1_replica"] = [
        r["systems"]["ray-2-replicas"]["summary"]["qps"]
        / r["systems"]["ray-1-replica"]["summary"]["qps"] for r in results["rounds"]]
    results["ratio_per_round_2_vs_1_instance"] = [
        r["systems"]["serve-2-instances"]["summary"]["qps"]
        / r["systems"]["serve-1-instance"]["summary"]["qps"] for r in results["rounds"]]
    results["ratio_per_round_2_vs_1_bare_engine"] = [
        r["systems"]["engine-2-processes"]["summary"]["qps"]
        / r["systems"]["engine-1-process"]["summary"]["qps"] for r in results["rounds"]]
    args.output.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps({k: results[k] for k in ("median_qps", "ratio_per_round_2_vs_1_replica",
                                              "ratio_per_round_2_vs_1_instance",
                                              "ratio_per_round_2_vs_1_bare_engine")},
                     indent=1))


if __name__ == "__main__":
    main()
