"""The highest Poisson rate that keeps p99 within a bound, side by side: this checkout's
server, the previous commit's, and PyTriton, all loaded by ``turboinfer load --scenario
maxrate`` in alternating rounds.

    python benchmarks/serving_server/openloop.py --baseline-src OLD/src [--rounds 2]

``OLD`` is a ``git worktree`` of the commit to compare with. Every server serves
builtin:digits-cnn (ONNX) with max batch 32, a 5 ms queue delay and onnxruntime with 2
intra-op threads. Rows:

- ``current``: this checkout's server, loaded by this checkout's ``turboinfer load``;
- ``current_spin``: the same with ``engine_settings: {spin_wait: true}`` (ONNX
  Runtime's spinning intra-op threads, the previous default);
- ``baseline``: the previous commit's server, loaded by this checkout's client;
- ``baseline_whole``: the previous commit's server loaded by its own client (the
  previous commit as a user saw it);
- ``pytriton``: Triton (nvidia-pytriton, its venv at ``$PEERS_DIR/pytriton``, run with
  the pyenv libpython first on ``LD_LIBRARY_PATH``: its bundled Python stub otherwise
  loads the system libpython, which does not match the venv's standard library).

Each round also runs every system at one fixed Poisson rate (``--fixed-rate``, below
all of their capacities) and records the CPU time its processes used per request (the
server's process group: for PyTriton, the Python process, tritonserver and the Python
stub): on a machine shared with other jobs, where the p99 bound fails for reasons
outside the servers, that cost is what bounds each server's rate on given cores.

Raw load reports and the machine go to ``openloop.json`` beside this script.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from turboinfer.models import resolve_model
from turboinfer.serve.config import DynamicBatching, EngineSettingsConfig, ModelConfig, write_entry

HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent / "src"
PEERS = Path(os.environ.get("PEERS_DIR", "/work/peers"))
MODEL = "digits-cnn"
DELAY_MS = 5.0
CONFIG = ModelConfig(max_batch_size=32,
                     dynamic_batching=DynamicBatching(max_queue_delay_ms=DELAY_MS),
                     engine_settings=EngineSettingsConfig(intra_op_threads=2))


def _spawn(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)


def start_turboinfer(repo: Path, src: Path, port: int, work: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(src))
    return _spawn([sys.executable, "-m", "turboinfer", "serve", str(repo), "--http-port",
                   str(port), "--grpc-port", "-1", "--model-control", "none"],
                  work / f"turboinfer-{port}.log", env)


def pytriton_env() -> dict[str, str]:
    """The environment PyTriton starts in: Triton's Python stub links the system
    libpython, which need not match the venv's standard library, so this interpreter's
    own libpython goes first; no PYTHONPATH of this project."""
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env = dict(os.environ, LD_LIBRARY_PATH=f"{libdir}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    env.pop("PYTHONPATH", None)
    return env


def start_pytriton(onnx: Path, port: int, work: Path) -> subprocess.Popen[bytes] | None:
    python = PEERS / "pytriton" / "bin" / "python"
    if not python.exists():
        return None
    env = pytriton_env()
    return _spawn([str(python), str(HERE.parent / "serving" / "peers" / "pytriton_serve.py"),
                   str(onnx), str(port), MODEL, str(int(DELAY_MS * 1000))],
                  work / "pytriton.log", env)


def wait_ready(port: int, process: subprocess.Popen[bytes], timeout_s: float = 240,
               model: str = MODEL) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server on {port} exited with {process.returncode}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", f"/v2/models/{model}/ready")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"server on {port} not ready in time")


def maxrate(port: int, client_src: Path, out: Path, args: argparse.Namespace) -> dict:
    command = [sys.executable, "-m", "turboinfer", "load", f"http://127.0.0.1:{port}",
               "--model", MODEL, "--binary", "--scenario", "maxrate", "--p99-ms",
               str(args.p99_ms), "--trial-duration", str(args.trial_s), "--max-trials",
               str(args.max_trials), "--probe-concurrency", "16", "--warmup", "1",
               "--timeout", "10", "--quiet", "--output", str(out)]
    load_before = os.getloadavg()[0]
    subprocess.run(command, env=dict(os.environ, PYTHONPATH=str(client_src)),
                   capture_output=True, timeout=900, check=False)
    report = json.loads(out.read_text())
    found = report.get("maxrate") or {}
    return {"max_rate": found.get("max_rate"), "capacity_qps": found.get("capacity_qps"),
            "trials": found.get("trials"), "load_average_1m_before": load_before,
            "load_average_1m_after": os.getloadavg()[0],
            "runs": [{"label": r["label"], "qps": r["qps"], "p50_ms": r["latency"]["p50_ms"],
                      "p99_ms": r["latency"]["p99_ms"], "send_lag_p99_ms": r["send_lag_p99_ms"],
                      "client_cpu": r["client_cpu"]} for r in report["runs"]]}


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of every live process in process group ``pgid``."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[2]) == pgid:  # field 5 of stat, after the name: the process group
            total += int(fields[11]) + int(fields[12])
    return total / ticks


def fixed_rate(port: int, pgid: int, out: Path, args: argparse.Namespace) -> dict:
    command = [sys.executable, "-m", "turboinfer", "load", f"http://127.0.0.1:{port}",
               "--model", MODEL, "--binary", "--scenario", "poisson", "--rate",
               str(args.fixed_rate), "--duration", "8", "--warmup", "1", "--timeout", "10",
               "--no-metrics", "--quiet", "--output", str(out)]
    before = group_cpu_seconds(pgid)
    subprocess.run(command, env=dict(os.environ, PYTHONPATH=str(SRC)), capture_output=True,
                   timeout=300, check=False)
    used = group_cpu_seconds(pgid) - before
    run = json.loads(out.read_text())["runs"][-1]
    answered = run["ok"] + args.fixed_rate * 1.0  # and the warm-up's
    return {"rate": args.fixed_rate, "qps": run["qps"], "p50_ms": run["latency"]["p50_ms"],
            "p99_ms": run["latency"]["p99_ms"], "send_lag_p99_ms": run["send_lag_p99_ms"],
            "server_cpu_ms_per_request": 1e3 * used / max(1.0, answered),
            "load_average_1m": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-src", type=Path, required=True,
                        help="the src/ folder of the checkout to compare with")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--p99-ms", type=float, default=50.0)
    parser.add_argument("--trial-s", type=float, default=3.0)
    parser.add_argument("--max-trials", type=int, default=7)
    parser.add_argument("--fixed-rate", type=float, default=200.0)
    parser.add_argument("--systems",
                        default="current,current_spin,baseline,baseline_whole,pytriton")
    args = parser.parse_args()
    # A SIGTERM still stops the servers (their process groups) on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    baseline = args.baseline_src.resolve()
    wanted = args.systems.split(",")
    onnx = resolve_model(f"builtin:{MODEL}").artifact.onnx_path
    machine = {"cpu": _cpu(), "cores": os.cpu_count(), "load_average_1m": os.getloadavg()[0]}
    result: dict = {"machine": machine, "p99_bound_ms": args.p99_ms, "rounds": args.rounds,
                    "queue_delay_ms": DELAY_MS, "systems": {name: [] for name in wanted}}
    with tempfile.TemporaryDirectory(prefix="openloop-") as tmp:
        work = Path(tmp)
        write_entry(work / "repo", MODEL, onnx, CONFIG)
        ports = {"current": 18800, "baseline": 18810, "pytriton": 18820,
                 "current_spin": 18830}
        processes = {"current": start_turboinfer(work / "repo", SRC, ports["current"], work),
                     "baseline": start_turboinfer(work / "repo", baseline, ports["baseline"],
                                                  work)}
        if "current_spin" in wanted:
            spin = CONFIG.model_copy(update={"engine_settings": EngineSettingsConfig(
                intra_op_threads=2, spin_wait=True)})
            write_entry(work / "spin", MODEL, onnx, spin)
            processes["current_spin"] = start_turboinfer(work / "spin", SRC,
                                                         ports["current_spin"], work)
        if "pytriton" in wanted:
            peer = start_pytriton(onnx, ports["pytriton"], work)
            if peer is None:
                result["systems"]["pytriton"] = f"skipped: no venv at {PEERS / 'pytriton'}"
                wanted.remove("pytriton")
            else:
                processes["pytriton"] = peer
        try:
            for name, process in processes.items():
                wait_ready(ports[name], process)
            for round_ in range(args.rounds):
                order = wanted[round_ % len(wanted):] + wanted[:round_ % len(wanted)]
                for name in order:
                    server = "baseline" if name.startswith("baseline") else name
                    client = baseline if name == "baseline_whole" else SRC
                    found = maxrate(ports[server], client, work / f"{name}-{round_}.json", args)
                    found["fixed_rate"] = fixed_rate(ports[server], processes[server].pid,
                                                     work / "fixed.json", args)
                    result["systems"][name].append(found)
                    print(f"round {round_} {name}: max rate {found['max_rate']} req/s "
                          f"(load {found['load_average_1m_before']:.1f}), "
                          f"{found['fixed_rate']['server_cpu_ms_per_request']:.3f} CPU ms "
                          "per request at the fixed rate", flush=True)
                    (HERE / "openloop.json").write_text(json.dumps(result, indent=1) + "\n")
        finally:
            for process in processes.values():
                _stop(process)
    result["load_average_1m_after"] = os.getloadavg()[0]
    (HERE / "openloop.json").write_text(json.dumps(result, indent=1) + "\n")


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return ""


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, 15)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()


if __name__ == "__main__":
    main()
