"""What stalled the tail under open-loop (Poisson) load, each cause measured on its own.

    python benchmarks/serving_server/stalls.py [--baseline-src OLD/src] [--rounds 3]

1. ``client_summary``: the load generator summarizes a window's HdrHistogram twice a
   second on its event loop (progress line, window hooks). hdrh's own mean and
   percentile walk are pure Python over ~23,000 buckets; the numpy summary reads the
   same counts. Both timed on a window like one second at 1,000 req/s.
2. ``client_lag``: ``turboinfer load --scenario poisson --rate 1000`` against the instant
   server (``turboinfer.load.instant``: no model, no batching) with this checkout's
   client and, with ``--baseline-src``, the other checkout's, in alternating rounds: the
   p99 of how late the sends left (the client's own stall) and the p99 latency.
3. ``full_collection``: one full garbage collection in a process holding what the
   server holds (the server modules, torch, a loaded session), before and after
   ``gc.freeze()``: a collection during serving blocks the event loop that long.
4. ``gil_hop``: a worker thread comes back from a GIL-free call (as an instance does
   from its engine run, or from waiting for its next batch) while the event loop is in
   a long iteration of Python work (a loaded server's), with the default 5 ms GIL
   switch interval and with the server's 0.5 ms: p50/p99 of how late it got the GIL.

Raw results go to ``stalls.json`` beside this script.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from turboinfer.load.stats import Recorder, summarize

HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent / "src"
PERCENTILES = [50.0, 90.0, 95.0, 99.0, 99.9]


def client_summary(repeats: int = 5) -> dict[str, float]:
    window = Recorder(0)
    latencies_us = np.random.default_rng(0).lognormal(np.log(3000), 0.8, 1000)
    for us in np.append(latencies_us, 150_000).astype(int):
        window.histogram.record_value(int(us))
    times: dict[str, list[float]] = {"hdrh_ms": [], "numpy_ms": []}
    for _ in range(repeats):
        start = time.perf_counter()
        window.histogram.get_mean_value()
        window.histogram.get_percentile_to_value_dict(PERCENTILES)
        times["hdrh_ms"].append((time.perf_counter() - start) * 1e3)
        start = time.perf_counter()
        summarize(window.histogram)
        times["numpy_ms"].append((time.perf_counter() - start) * 1e3)
    return {name: float(np.median(values)) for name, values in times.items()}


def client_lag(baseline: Path | None, rounds: int) -> dict[str, list[dict[str, float]]]:
    sides = {"current": SRC} | ({"baseline": baseline} if baseline else {})
    server = subprocess.Popen([sys.executable, "-m", "turboinfer.load.instant", "--port",
                               "18890"], env=dict(os.environ, PYTHONPATH=str(SRC)),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(2)
    results: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for round_ in range(rounds):
                order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
                for side in order:
                    out = Path(tmp) / "report.json"
                    subprocess.run(
                        [sys.executable, "-m", "turboinfer", "load", "http://127.0.0.1:18890",
                         "--model", "instant", "--scenario", "poisson", "--rate", "1000",
                         "--duration", "8", "--warmup", "1", "--no-metrics", "--quiet",
                         "--output", str(out)],
                        env=dict(os.environ, PYTHONPATH=str(sides[side])),
                        capture_output=True, timeout=300, check=False)
                    run = json.loads(out.read_text())["runs"][-1]
                    results[side].append({
                        "send_lag_p99_ms": run["send_lag_p99_ms"],
                        "latency_p99_ms": run["latency"]["p99_ms"],
                        "latency_p50_ms": run["latency"]["p50_ms"],
                        "load_average_1m": os.getloadavg()[0]})
                    print(f"client_lag round {round_} {side}: {results[side][-1]}", flush=True)
    finally:
        server.terminate()
        server.wait()
    return results


def full_collection() -> dict[str, float]:
    code = """
import gc, json, time
import turboinfer.serve.server, turboinfer.serve.grpc_service
from turboinfer.engines import EngineSettings, load_session
from turboinfer.models import resolve_model
session = load_session(resolve_model("builtin:digits-cnn").artifact, "onnxruntime",
                       EngineSettings(intra_op_threads=1))
def timed():
    times = []
    for _ in range(3):
        start = time.perf_counter(); gc.collect(); times.append(time.perf_counter() - start)
    return sorted(times)[1] * 1e3
result = {"objects_tracked": len(gc.get_objects()), "full_collection_ms": timed()}
gc.freeze()
result["full_collection_after_freeze_ms"] = timed()
print(json.dumps(result))
"""
    done = subprocess.run([sys.executable, "-c", code], env=dict(os.environ,
                          PYTHONPATH=str(SRC)), capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def gil_hop(switch_s: float, hops: int = 400) -> dict[str, float]:
    """How late a worker thread gets the GIL back from a busy event loop."""
    async def scenario() -> list[float]:
        loop = asyncio.get_running_loop()
        delays: list[float] = []
        stop = False

        def busy() -> None:
            # A loaded loop's iteration: many handlers' Python work, ~10 ms, in which
            # the loop never blocks (blocking would release the GIL at once).
            if not stop:
                total = 0
                for i in range(300_000):  # bytecode: a switch request can land between
                    total += i
                loop.call_soon(busy)

        def worker() -> None:
            for _ in range(hops):
                # The engine run, GIL released; the thread needs the GIL back to go on
                # (to answer, or to take its next batch): how long did it wait for it?
                due = time.perf_counter() + 0.001
                time.sleep(0.001)
                delays.append(time.perf_counter() - due)

        loop.call_soon(busy)
        thread = threading.Thread(target=worker)
        thread.start()
        while thread.is_alive():
            await asyncio.sleep(0.01)
        stop = True
        return delays

    previous = sys.getswitchinterval()
    sys.setswitchinterval(switch_s)
    try:
        delays = np.array(asyncio.run(scenario())) * 1e3
    finally:
        sys.setswitchinterval(previous)
    return {"switch_interval_ms": switch_s * 1e3, "p50_ms": float(np.percentile(delays, 50)),
            "p99_ms": float(np.percentile(delays, 99))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-src", type=Path, default=None,
                        help="the src/ folder of another checkout, for client_lag")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    result: dict[str, object] = {"load_average_1m_before": os.getloadavg()[0],
                                 "cores": os.cpu_count()}
    result["client_summary"] = client_summary()
    print("client_summary", result["client_summary"], flush=True)
    result["full_collection"] = full_collection()
    print("full_collection", result["full_collection"], flush=True)
    result["gil_hop"] = [gil_hop(0.005), gil_hop(0.0005)]
    print("gil_hop", result["gil_hop"], flush=True)
    baseline = args.baseline_src.resolve() if args.baseline_src else None
    result["client_lag"] = client_lag(baseline, args.rounds)
    result["load_average_1m_after"] = os.getloadavg()[0]
    gc.collect()
    (HERE / "stalls.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
