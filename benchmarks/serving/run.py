"""Serve one ONNX model with turboinfer and with peer servers, load each the same way
with ``turboinfer load``, and print the Markdown table recorded in benchmarks/README.md.

Peers run from their own virtual environments (never this Python):

    python -m venv /tmp/peers/mlserver && /tmp/peers/mlserver/bin/pip install \\
        mlserver 'uvloop<0.22' onnxruntime numpy
    python -m venv /tmp/peers/pytriton && /tmp/peers/pytriton/bin/pip install \\
        nvidia-pytriton onnxruntime numpy
    python -m venv /tmp/peers/ray && /tmp/peers/ray/bin/pip install \\
        'ray[serve]' onnxruntime numpy

    python benchmarks/serving/run.py [--systems turboinfer,mlserver,pytriton,ray]

Every load report is kept, as ``turboinfer load`` wrote it, in ``results.json`` beside
this script (``--output`` elsewhere): the table is printed from those reports and the
README's figures are read from that file. A peer whose venv is missing is skipped with a
note. Every system batches up to 32 rows with a 2 ms window and runs onnxruntime with 2
intra-op threads.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from model import write_mlp  # noqa: E402

PEERS = Path(os.environ.get("PEERS_DIR", "/tmp/peers"))
MODEL = "mlp"
SCENARIOS = {
    "c1": ["--scenario", "concurrency", "--concurrency", "1"],
    "c16": ["--scenario", "concurrency", "--concurrency", "16"],
    "maxrate": ["--scenario", "maxrate", "--p99-ms", "25", "--trial-duration", "3",
                "--max-trials", "6", "--probe-concurrency", "16"],
}
COMMON = ["--window", "2", "--max-windows", "5", "--warmup", "1", "--timeout", "10",
          "--quiet"]


@dataclass
class System:
    name: str
    port: int
    start: Callable[[Path, Path, int], subprocess.Popen[bytes]]
    json_only: bool = False


def _turboinfer(model: Path, work: Path, port: int) -> subprocess.Popen[bytes]:
    from turboinfer.serve.config import (
        DynamicBatching,
        EngineSettingsConfig,
        ModelConfig,
        write_entry,
    )

    repo = work / "repo"
    write_entry(repo, MODEL, model, ModelConfig(
        max_batch_size=32, dynamic_batching=DynamicBatching(max_queue_delay_ms=2.0),
        engine_settings=EngineSettingsConfig(intra_op_threads=2)))
    return _spawn([sys.executable, "-m", "turboinfer", "serve", str(repo), "--http-port",
                   str(port), "--grpc-port", "-1", "--model-control", "none"], work)


def _mlserver(model: Path, work: Path, port: int) -> subprocess.Popen[bytes]:
    folder = work / "mlserver"
    (folder / MODEL).mkdir(parents=True)
    (folder / "runtime.py").write_text((HERE / "peers" / "mlserver_runtime.py").read_text())
    (folder / "settings.json").write_text(json.dumps({
        "http_port": port, "grpc_port": port + 1, "metrics_port": port + 2,
        "parallel_workers": 0}))
    (folder / MODEL / "model-settings.json").write_text(json.dumps({
        "name": MODEL, "implementation": "runtime.OnnxRuntime", "max_batch_size": 32,
        "max_batch_time": 0.002, "parameters": {"uri": str(model)},
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 256]}],
        "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, 10]}]}))
    return _spawn([str(PEERS / "mlserver" / "bin" / "mlserver"), "start", str(folder)], work,
                  cwd=folder)


def _pytriton(model: Path, work: Path, port: int) -> subprocess.Popen[bytes]:
    # Triton's Python stub links the system libpython, which need not match the venv's
    # standard library ("'_thread.RLock' object has no attribute '_recursion_count'"):
    # this interpreter's own libpython goes first.
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env = dict(os.environ, LD_LIBRARY_PATH=f"{libdir}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    return _spawn([str(PEERS / "pytriton" / "bin" / "python"),
                   str(HERE / "peers" / "pytriton_serve.py"), str(model), str(port)], work,
                  env=env)


def _ray(model: Path, work: Path, port: int) -> subprocess.Popen[bytes]:
    return _spawn([str(PEERS / "ray" / "bin" / "python"), str(HERE / "peers" / "ray_serve.py"),
                   str(model), str(port)], work)


def _spawn(command: list[str], work: Path, cwd: Path | None = None,
           env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    log = (work / f"{Path(command[1]).stem}.log").open("wb")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                            start_new_session=True, env=env)


SYSTEMS = {
    "turboinfer": System("turboinfer", 18500, _turboinfer),
    # MLServer reads JSON tensors only (binary bodies are answered 422).
    "mlserver": System("mlserver", 18510, _mlserver, json_only=True),
    "pytriton": System("pytriton", 18520, _pytriton),
    "ray": System("ray", 18530, _ray, json_only=True),
}
VENVS = {"mlserver": "mlserver", "pytriton": "pytriton", "ray": "ray"}


def wait_ready(port: int, process: subprocess.Popen[bytes], timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", f"/v2/models/{MODEL}")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError("server not ready in time")


def load(system: System, scenario: str, work: Path) -> dict:
    out = work / f"{system.name}-{scenario}.json"
    encoding = ["--json-tensors"] if system.json_only else ["--binary"]
    command = [sys.executable, "-m", "turboinfer", "load", f"http://127.0.0.1:{system.port}",
               "--model", MODEL, *encoding, *COMMON, *SCENARIOS[scenario], "--output",
               str(out)]
    subprocess.run(command, capture_output=True, timeout=600)
    return json.loads(out.read_text())


def row(system: str, scenario: str, report: dict) -> str:
    runs = report["runs"]
    if report.get("maxrate"):
        best = report["maxrate"]["max_rate"]
        return f"| {system} | maxrate (p99 <= 25 ms) | {best:,.0f} | - | - | {best:,.0f} |"
    run = runs[-1]
    lat = run["latency"]
    errors = f" ({run['failed']} errors)" if run["failed"] else ""
    return (f"| {system} | {run['label']}{errors} | {run['qps']:,.0f} | {lat['p50_ms']:.2f} "
            f"| {lat['p99_ms']:.2f} | - |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", default="turboinfer,mlserver,pytriton,ray")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--output", type=Path, default=HERE / "results.json",
                        help="where the raw load reports go (default: results.json here)")
    args = parser.parse_args()
    print("| system | scenario | throughput (req/s) | p50 (ms) | p99 (ms) | max rate (req/s) |")
    print("|---|---|---|---|---|---|")
    # The servers' scratch files (model, configs) are temporary; the results are not.
    results: dict[str, dict] = {"load_average_before": os.getloadavg(), "systems": {}}
    with tempfile.TemporaryDirectory(prefix="serving-bench-") as tmp:
        model = write_mlp(Path(tmp) / "mlp.onnx")
        for name in args.systems.split(","):
            results["systems"][name] = run_system(SYSTEMS[name], model, Path(tmp),
                                                  args.scenarios.split(","))
            # Written after every system, so a run cut short keeps what it measured.
            results["load_average_after"] = os.getloadavg()
            args.output.write_text(json.dumps(results, indent=1) + "\n")
    print(f"raw results: {args.output}")


def run_system(system: System, model: Path, tmp: Path, scenarios: list[str]) -> dict:
    """Each scenario's load report (or why there is none), keyed by scenario."""
    venv = VENVS.get(system.name)
    if venv and not (PEERS / venv / "bin" / "python").exists():
        print(f"| {system.name} | skipped: no venv at {PEERS / venv} | | | | |", flush=True)
        return {"skipped": f"no venv at {PEERS / venv}"}
    work = tmp / system.name
    work.mkdir()
    reports: dict = {}
    process = system.start(model, work, system.port)
    try:
        wait_ready(system.port, process)
        for scenario in scenarios:
            reports[scenario] = load(system, scenario, work)
            print(row(system.name, scenario, reports[scenario]), flush=True)
    except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError) as exc:
        print(f"| {system.name} | failed: {exc} | | | | |", flush=True)
        reports["failed"] = str(exc)
    finally:
        stop(process)
    return reports


def stop(process: subprocess.Popen[bytes]) -> None:
    """The server and whatever it started (Triton, Ray workers) go together."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, 15)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.wait()


if __name__ == "__main__":
    main()
