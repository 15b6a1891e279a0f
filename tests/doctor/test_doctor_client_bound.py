"""client_bound: a real load run from one process with 64 connections, and a recorded
report of a load generator that could not keep up with an idle server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from turboinfer.doctor.rules.batching import CLIENT_CPU, IDLE_QUEUE_SHARE, SEND_LAG_MS

MODEL = "linear"  # the model the unbatched_server fixture serves


def doctor_json(*args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "turboinfer", "doctor", *args, "--json"],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONWARNINGS="error"))
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = orjson.loads(done.stdout)
    return doc


def test_real_load_run_is_judged_by_who_was_behind(unbatched_server: str,
                                                   tmp_path: Path) -> None:
    """One client process, 64 connections, a server with batching off on the same cores:
    whichever side was behind, the finding (or its absence) must agree with the
    report's own client CPU, send lateness and server queue time."""
    report = tmp_path / "load.json"
    subprocess.run([sys.executable, "-m", "turboinfer", "load", unbatched_server,
                    "--model", MODEL, "--scenario", "concurrency", "--concurrency", "64",
                    "--window", "1s", "--max-windows", "3", "--warmup", "0.5", "--quiet",
                    "--output", str(report)],
                   capture_output=True, text=True, timeout=300, check=True)
    run = orjson.loads(report.read_bytes())["runs"][0]
    server = run["server"]
    client_saturated = (run["client_cpu"] >= CLIENT_CPU
                        or (run.get("send_lag_p99_ms") or 0.0) >= SEND_LAG_MS)
    server_queued = server["queue_ms"] / server["request_ms"] > IDLE_QUEUE_SHARE
    doc = doctor_json("--load", str(report))
    found = {f["rule"]: f for f in doc["findings"]}
    assert ("client_bound" in found) == (client_saturated and not server_queued), run
    if "client_bound" in found:
        assert f"load generator at {run['client_cpu']:.0%} of a core" in \
            found["client_bound"]["evidence"]
    else:
        assert "client_bound" in doc["passed"]


def test_recorded_saturated_client_beside_an_idle_server(tmp_path: Path) -> None:
    run = {"label": "rate 5000/s", "mode": "open", "qps": 3100.0, "client_cpu": 0.98,
           "send_lag_p99_ms": 42.0,
           "server": {"queue_ms": 0.02, "request_ms": 0.35, "cpu_cores": 0.31}}
    report = {"url": "http://127.0.0.1:8000", "model": MODEL, "scenario": "poisson",
              "runs": [run]}
    path = tmp_path / "load.json"
    path.write_bytes(orjson.dumps(report))
    finding = {f["rule"]: f for f in doctor_json("--load", str(path))["findings"]}[
        "client_bound"]
    assert finding["symptom"] == "rate 5000/s: 3100 requests/s"
    assert finding["evidence"] == ("load generator at 98% of a core, sends 42.0 ms late "
                                   "(p99); the server queued 0.02 ms per request and used "
                                   "0.31 cores")
    assert "--protocol grpc" in finding["fix"]
