"""Step load against an autoscaled model, then quiet: the instance count over time.

    python benchmarks/autoscale/run.py [--model digits-cnn --rows 1024] [--rate R]
                                       [--step-seconds 45] [-o results.json]

Serves a built-in model (default builtin:digits-cnn, requests of ``--rows`` rows, each
request its own batch) with ``autoscaling.enabled`` and every other autoscaling key at
its default (scale up at 70% busy over 10 s, down under 5 QPS over 30 s, 30 s
cool-down), one intra-op thread per instance (so the cap on this 2-core machine is 2
instances of 1 thread) and ``idle_unload_s: 20``. Phases, each a ``turboinfer load`` run:

1. probe: closed loop at concurrency 4 for 3 s (too short to scale): one instance kept
   busy, so its throughput is one instance's capacity. The rows per request make the
   engine time dominate the per-request HTTP cost, so the instance is the bottleneck
   (with small requests the event loop and the client on the same 2 cores are, and more
   instances would not help);
2. step: Poisson arrivals at ``--rate`` (default ``--overload`` x the probed capacity:
   more than one instance can hold) for ``--step-seconds``. The machine is shared, and
   the capacity moves 2-3x within a minute with the other jobs' load: a margin small
   enough for two instances to hold may turn out to be one that one instance holds;
3. trickle: ``--trickle-rate`` requests/s for 45 s, under the 5 QPS scale-down
   threshold;
4. quiet until the idle unload takes the model to zero instances, then one request: the
   cold start.

A sampler scrapes /metrics every 0.5 s (instances, answered and failed requests) and the
server's log lines of scale decisions are stamped as they arrive. Everything goes to
``results.json`` beside this script; ``report.py`` draws the HTML report from it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from turboinfer.models import resolve_model
from turboinfer.serve.config import (
    AutoscalingConfig,
    EngineSettingsConfig,
    ModelConfig,
    write_entry,
)

HERE = Path(__file__).resolve().parent
SERIES = re.compile(r'^(turboinfer_[a-z_]+)\{([^}]*)\} ([0-9.eE+-]+)$')
EVENT_LINE = re.compile(r"(autoscale|idle unload|cold start) ")
CONFIG = ModelConfig(max_batch_size=64,
                     engine_settings=EngineSettingsConfig(intra_op_threads=1),
                     autoscaling=AutoscalingConfig(enabled=True), idle_unload_s=20.0)


class Server:
    """``turboinfer serve`` in a subprocess; its log lines of scale decisions stamped."""

    def __init__(self, repo: Path, model: str, origin: float) -> None:
        self.model, self.origin = model, origin
        self.process = subprocess.Popen(
            [sys.executable, "-m", "turboinfer", "-v", "serve", str(repo), "--http-port", "0",
             "--grpc-port", "-1", "--model-control", "none"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"))
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("turboinfer serving"):
            raise SystemExit(f"server did not start: {line!r}")
        self.port = int(line.split("http=")[1].split()[0].rsplit(":", 1)[1])
        self.events: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()

    def _read_log(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            message = line.strip().split(": ", 1)[-1]
            if EVENT_LINE.match(message):
                self.events.append({"t": time.monotonic() - self.origin, "line": message})

    def metrics(self) -> dict[str, float]:
        """This model's series summed over versions ({} when the scrape is refused)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            connection.request("GET", "/metrics")
            response = connection.getresponse()
            text = response.read().decode()
        except OSError:
            return {}
        finally:
            connection.close()
        if response.status != 200:
            return {}
        values: dict[str, float] = {}
        for line in text.splitlines():
            match = SERIES.match(line)
            if match and f'model="{self.model}"' in match.group(2):
                name = match.group(1)
                values[name] = values.get(name, 0.0) + float(match.group(3))
        return values

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(60)


class Sampler(threading.Thread):
    def __init__(self, server: Server, origin: float, every_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.server, self.origin, self.every_s = server, origin, every_s
        self.samples: list[dict[str, float]] = []
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.every_s):
            values = self.server.metrics()
            if "turboinfer_instances" not in values:
                continue  # refused (connection limit) or not yet ticked: no sample
            self.samples.append({
                "t": time.monotonic() - self.origin,
                "instances": values.get("turboinfer_instances", 0.0),
                "success": values.get("turboinfer_request_success_total", 0.0),
                "failure": values.get("turboinfer_request_failure_total", 0.0),
            })

    def latest(self) -> dict[str, float]:
        return self.samples[-1] if self.samples else {}

    def stop(self) -> None:
        self._done.set()
        self.join()


def load(server: Server, rows: int, out: Path, *args: str) -> dict[str, Any]:
    command = [sys.executable, "-m", "turboinfer", "load", f"http://127.0.0.1:{server.port}",
               "--model", server.model, "--batch-size", str(rows), "--window", "1s",
               "--warmup", "0", "--min-requests", "1", "--quiet", "--output", str(out), *args]
    subprocess.run(command, stdout=subprocess.DEVNULL, check=False)
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def phase(name: str, report: dict[str, Any], started: float) -> dict[str, Any]:
    run = report["runs"][0]
    return {"name": name, "start_s": started, "target_rate": run.get("target_rate"),
            "ok": run["ok"], "failed": run["failed"], "qps": run["qps"],
            "p99_ms": run["latency"].get("p99_ms") if run.get("latency") else None,
            "windows": [dict(w, start_s=started + w["start_s"]) for w in run["windows"]],
            "error_messages": report.get("error_messages", [])}


def cold_request(server: Server, rows: int) -> tuple[int, float]:
    """One request after the idle unload; its metadata comes first, answered unloaded."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:
        connection.request("GET", f"/v2/models/{server.model}")
        spec = json.loads(connection.getresponse().read())["inputs"][0]
    finally:
        connection.close()
    shape = [rows, *spec["shape"][1:]]
    body = json.dumps({"inputs": [{"name": spec["name"], "datatype": "FP32", "shape": shape,
                                   "data": np.zeros(int(np.prod(shape))).tolist()}]})
    start = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:
        connection.request("POST", f"/v2/models/{server.model}/infer", body)
        status = connection.getresponse().status
    finally:
        connection.close()
    return status, time.perf_counter() - start


def machine() -> dict[str, Any]:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    model = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines()
                  if line.startswith("Model name")), platform.processor())
    return {"cpu": model, "cores": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)), "python": platform.python_version()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="digits-cnn", help="built-in model")
    parser.add_argument("--rows", type=int, default=1024, help="rows per request")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="step rate in requests/s (0: --overload x the probed capacity)")
    parser.add_argument("--overload", type=float, default=1.6,
                        help="the step rate over one instance's probed capacity")
    parser.add_argument("--trickle-rate", type=float, default=1.0)
    parser.add_argument("--step-seconds", type=float, default=45.0)
    parser.add_argument("-o", "--output", type=Path, default=HERE / "results.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="autoscale-"))
    config = CONFIG.model_copy(update={"max_batch_size": max(1, args.rows)})
    write_entry(work / "repo", args.model,
                resolve_model(f"builtin:{args.model}").artifact.onnx_path, config)
    load_before = os.getloadavg()
    origin = time.monotonic()
    server = Server(work / "repo", args.model, origin)
    sampler = Sampler(server, origin)
    sampler.start()
    phases = []
    try:
        t = time.monotonic() - origin
        probe = phase("probe", load(server, args.rows, work / "probe.json", "--scenario",
                                    "concurrency", "--concurrency", "4",
                                    "--max-windows", "3"), t)
        capacity = probe["qps"]
        rate = args.rate or round(args.overload * capacity, 1)
        print(f"one instance: {capacity:.1f} requests/s; step at {rate:g}/s", flush=True)
        phases.append(probe)
        time.sleep(5)
        for name, rate_s, seconds in (("step", rate, args.step_seconds),
                                      ("trickle", args.trickle_rate, 45.0)):
            t = time.monotonic() - origin
            print(f"{name}: {rate_s:g}/s for {seconds:g} s", flush=True)
            phases.append(phase(name, load(server, args.rows, work / f"{name}.json",
                                           "--scenario", "poisson", "--rate", str(rate_s),
                                           "--duration", f"{seconds}s"), t))
        deadline = time.monotonic() + 60
        while sampler.latest().get("instances", 1.0) > 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        t = time.monotonic() - origin
        status, seconds = cold_request(server, args.rows)
        print(f"cold request: HTTP {status} in {seconds:.3f} s", flush=True)
        time.sleep(2)
        final = server.metrics()
    finally:
        sampler.stop()
        server.stop()
    load_after = os.getloadavg()
    failed = sum(p["failed"] for p in phases) + (status != 200)
    result = {
        "machine": dict(machine(), load_average_before=load_before,
                        load_average_after=load_after),
        "args": {k: str(v) for k, v in vars(args).items()},
        "model": f"builtin:{args.model}",
        "rows_per_request": args.rows,
        "config": config.model_dump(mode="json", exclude_defaults=True),
        "autoscaling_defaults": AutoscalingConfig().model_dump(mode="json"),
        "one_instance_capacity_qps": capacity,
        "step_rate": rate,
        "phases": phases,
        "cold_request": {"t": t, "status": status, "seconds": seconds},
        "cold_start_seconds": final.get("turboinfer_last_cold_start_seconds"),
        "server_failures": final.get("turboinfer_request_failure_total", 0.0),
        "failed_requests": failed,
        "events": server.events,
        "samples": sampler.samples,
    }
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(f"failed requests: {failed} (server: {result['server_failures']:g}); "
          f"events: {len(server.events)}; written {args.output}")
    for event in server.events:
        print(f"  {event['t']:7.1f} s  {event['line']}")


if __name__ == "__main__":
    main()
