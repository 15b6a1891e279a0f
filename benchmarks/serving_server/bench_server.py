"""Server benchmarks behind the numbers in benchmarks/README.md ("Server").

    python benchmarks/serving_server/bench_server.py overhead [--requests 3000]
    python benchmarks/serving_server/bench_server.py batching [--seconds 15 --clients 32]
    python benchmarks/serving_server/bench_server.py ab --baseline-src OLD/src [--rounds 7]
    python benchmarks/serving_server/bench_server.py adaptive [--model mlp|mlp-wide|digits-cnn]
        [--baseline-src OLD/src] [--seconds 24 --rounds 4 --clients 32]

``overhead``: builtin:digits-cnn, one client, batch 1. The engine's in-process p50 (same
session settings as the server's single instance) against the p50 of the same request
sent over HTTP (binary tensors and JSON from a keep-alive raw-socket client, and binary
from tritonclient.http) and gRPC (tritonclient.grpc). Client time is included.

``batching``: builtin:resnet18, batch-1 requests over HTTP (binary) from 1 and from N
concurrent clients, against a server with dynamic batching (max_batch_size 32,
opportunistic: no queue delay) and one without (max_batch_size 0). Both servers run side
by side and the measurement windows alternate between them (``--rounds``), so drift in
the machine's background load hits both alike.

``ab``: the ``overhead`` HTTP paths against two servers started side by side, this
checkout's and another checkout's (``--baseline-src``, e.g. a ``git worktree`` of the
previous commit), in alternating rounds; per path the median over rounds of each
server's p50 and their ratio. It is how a change to the server is shown not to cost
request overhead.

``adaptive``: the adaptive batch window. A small model (the MLP of
``benchmarks/serving/model.py``, or builtin:digits-cnn) or the wide MLP of the same
file (``mlp-wide``: a memory-bound row, where batching amortises the engine), batch-1
HTTP requests from 1 and N clients, batching on (max batch 32,
``max_queue_delay_ms: 2``) against batching off, side by side in alternating windows as
in ``batching``; with ``--baseline-src`` also the other checkout's server with the same
batching configuration (before the adaptive window it always waited the whole delay).
Written to ``adaptive-MODEL.json``.

Each server is ``python -m turboinfer serve`` on 127.0.0.1 in a subprocess and writes
a JSON result next to this file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

from turboinfer.engines import EngineSettings, load_session
from turboinfer.hardware import profile
from turboinfer.models import resolve_model
from turboinfer.serve.config import DynamicBatching, ModelConfig, write_entry
from turboinfer.serve.instances import available_cores

HERE = Path(__file__).parent
BATCHING_ON = ModelConfig(max_batch_size=32,
                          dynamic_batching=DynamicBatching(max_queue_delay_ms=0.0))
BATCHING_OFF = ModelConfig(max_batch_size=0)
ADAPTIVE_ON = ModelConfig(max_batch_size=32,
                          dynamic_batching=DynamicBatching(max_queue_delay_ms=2.0))


def start_server(repo: Path, src: Path | None = None
                 ) -> tuple[subprocess.Popen[str], int, int]:
    """``turboinfer serve`` on free ports; from the source tree ``src`` when given."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    process = subprocess.Popen(
        [sys.executable, "-m", "turboinfer", "serve", str(repo), "--http-port", "0",
         "--grpc-port", "0"], stdout=subprocess.PIPE, text=True, env=env)
    assert process.stdout is not None
    line = process.stdout.readline().split()
    fields = dict(part.split("=", 1) for part in line[2:])
    return (process, int(fields["http"].rsplit(":", 1)[1]),
            int(fields["grpc"].rsplit(":", 1)[1]))


def binary_request(model: str, x: np.ndarray) -> bytes:
    header = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32",
                                       "shape": list(x.shape),
                                       "parameters": {"binary_data_size": x.nbytes}}],
                           "parameters": {"binary_data_output": True}})
    body = header + x.tobytes()
    return (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Length: {len(body)}\r\nInference-Header-Content-Length: {len(header)}"
            f"\r\n\r\n").encode() + body


def json_request(model: str, x: np.ndarray) -> bytes:
    body = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32",
                                     "shape": list(x.shape), "data": x.reshape(-1).tolist()}]})
    return (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Length: {len(body)}\r\nContent-Type: application/json\r\n\r\n"
            ).encode() + body


def _read_response(sock: socket.socket, buffer: bytearray) -> int:
    """Read one HTTP response from ``sock``; returns the status code."""
    while b"\r\n\r\n" not in buffer:
        buffer += sock.recv(65536)
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(int(v) for k, _, v in (line.partition(b":") for line in lines[1:])
                  if k.lower() == b"content-length")
    while len(rest) < length:
        rest += sock.recv(65536)
    buffer[:] = rest[length:]
    return int(lines[0].split()[1])


def http_latencies(port: int, request: bytes, count: int) -> np.ndarray:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buffer = bytearray()
    times = np.empty(count)
    for i in range(count + 200):  # the first 200 warm up
        start = time.perf_counter()
        sock.sendall(request)
        assert _read_response(sock, buffer) == 200
        if i >= 200:
            times[i - 200] = time.perf_counter() - start
    sock.close()
    return times


def grpc_latencies(port: int, x: np.ndarray, count: int) -> np.ndarray:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    tensor = grpcclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    times = np.empty(count)
    for i in range(count + 200):
        start = time.perf_counter()
        client.infer("digits-cnn", [tensor])
        if i >= 200:
            times[i - 200] = time.perf_counter() - start
    client.close()
    return times


def tritonclient_http_latencies(port: int, x: np.ndarray, count: int) -> np.ndarray:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    tensor = httpclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    times = np.empty(count)
    for i in range(count + 200):
        start = time.perf_counter()
        client.infer("digits-cnn", [tensor])
        if i >= 200:
            times[i - 200] = time.perf_counter() - start
    client.close()
    return times


def in_process(model_path: Path, x: np.ndarray, count: int) -> np.ndarray:
    session = load_session(resolve_model("builtin:digits-cnn").artifact, "onnxruntime",
                           EngineSettings(intra_op_threads=available_cores()))
    del model_path
    times = np.empty(count)
    for i in range(count + 200):
        start = time.perf_counter()
        session.run({"input": x})
        if i >= 200:
            times[i - 200] = time.perf_counter() - start
    return times


def summary(times: np.ndarray) -> dict[str, float]:
    return {"p50_ms": float(np.percentile(times, 50) * 1e3),
            "p90_ms": float(np.percentile(times, 90) * 1e3),
            "p99_ms": float(np.percentile(times, 99) * 1e3),
            "requests": int(times.size)}


def overhead(args: argparse.Namespace) -> dict[str, object]:
    model = resolve_model("builtin:digits-cnn")
    assert model.entry is not None
    x = np.ascontiguousarray(model.entry.example_inputs(1)["input"])
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        write_entry(repo, "digits-cnn", model.artifact.onnx_path, BATCHING_ON)
        process, http_port, grpc_port = start_server(repo)
        try:
            results = {
                "in_process": summary(in_process(model.artifact.onnx_path, x, args.requests)),
                "http_binary": summary(http_latencies(http_port, binary_request(
                    "digits-cnn", x), args.requests)),
                "http_json": summary(http_latencies(http_port, json_request("digits-cnn", x),
                                                    args.requests)),
                "tritonclient_http_binary": summary(tritonclient_http_latencies(
                    http_port, x, args.requests)),
                "grpc": summary(grpc_latencies(grpc_port, x, args.requests)),
            }
        finally:
            process.terminate()
            process.wait()
    base = results["in_process"]["p50_ms"]
    results["http_binary_overhead_p50_ms"] = results["http_binary"]["p50_ms"] - base
    results["http_json_overhead_p50_ms"] = results["http_json"]["p50_ms"] - base
    return results


def ab(args: argparse.Namespace) -> dict[str, object]:
    """This checkout's server against ``--baseline-src``'s, in alternating rounds."""
    if args.baseline_src is None:
        raise SystemExit("ab needs --baseline-src (the src/ folder of the other checkout)")
    model = resolve_model("builtin:digits-cnn")
    assert model.entry is not None
    x = np.ascontiguousarray(model.entry.example_inputs(1)["input"])
    requests = {"http_binary": binary_request("digits-cnn", x),
                "http_json": json_request("digits-cnn", x)}
    p50s: dict[tuple[str, str], list[float]] = {
        (side, path): [] for side in ("current", "baseline") for path in requests}
    with tempfile.TemporaryDirectory() as tmp:
        write_entry(Path(tmp), "digits-cnn", model.artifact.onnx_path, BATCHING_ON)
        current, current_port, _ = start_server(Path(tmp))
        baseline, baseline_port, _ = start_server(Path(tmp), Path(args.baseline_src))
        ports = {"current": current_port, "baseline": baseline_port}
        try:
            for round_ in range(args.rounds):
                order = ("current", "baseline") if round_ % 2 == 0 else ("baseline", "current")
                for path, request in requests.items():
                    for side in order:
                        times = http_latencies(ports[side], request, args.requests)
                        p50s[side, path].append(float(np.percentile(times, 50)) * 1e3)
        finally:
            for process in (current, baseline):
                process.terminate()
                process.wait()
    result: dict[str, object] = {"baseline_src": str(args.baseline_src),
                                 "rounds": args.rounds, "requests_per_round": args.requests}
    for path in requests:
        now, before = (float(np.median(p50s[side, path])) for side in ("current", "baseline"))
        result[path] = {"current_p50_ms": now, "baseline_p50_ms": before,
                        "ratio": now / before,
                        "current_rounds_ms": p50s["current", path],
                        "baseline_rounds_ms": p50s["baseline", path]}
    return result


async def _client(port: int, request: bytes, stop_at: float, latencies: list[float],
                  errors: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    while time.perf_counter() < stop_at:
        start = time.perf_counter()
        writer.write(request)
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        await reader.readexactly(length)
        if status == 200:
            latencies.append(time.perf_counter() - start)
        else:
            errors.append(status)
    writer.close()


async def _window(port: int, request: bytes, clients: int, seconds: float
                  ) -> tuple[list[float], int, float]:
    """Latencies, error count and measured seconds of one closed-loop window."""
    latencies: list[float] = []
    errors: list[int] = []
    warm_until = time.perf_counter() + min(2.0, seconds / 2)
    await asyncio.gather(*(_client(port, request, warm_until, [], [])
                           for _ in range(clients)))
    start = time.perf_counter()
    await asyncio.gather(*(_client(port, request, start + seconds, latencies, errors)
                           for _ in range(clients)))
    return latencies, len(errors), time.perf_counter() - start


def _stats(port: int, model: str = "resnet18") -> dict[str, int]:
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port)
    connection.request("GET", f"/v2/models/{model}/stats")
    stats: dict[str, int] = orjson.loads(connection.getresponse().read())["model_stats"][0]
    connection.close()
    return stats


class Cell:
    """One (server, clients) measurement, accumulated over interleaved windows."""

    def __init__(self, clients: int, model: str = "resnet18") -> None:
        self.clients = clients
        self.model = model
        self.latencies: list[float] = []
        self.errors = 0
        self.seconds = 0.0
        self.inferences = 0
        self.executions = 0

    def measure(self, port: int, request: bytes, seconds: float) -> None:
        before = _stats(port, self.model)
        latencies, errors, elapsed = asyncio.run(_window(port, request, self.clients, seconds))
        after = _stats(port, self.model)
        self.latencies += latencies
        self.errors += errors
        self.seconds += elapsed
        # Includes the window's warm-up: same clients, same batching.
        self.inferences += after["inference_count"] - before["inference_count"]
        self.executions += after["execution_count"] - before["execution_count"]

    def summary(self) -> dict[str, float]:
        result = summary(np.array(self.latencies))
        result.update(clients=self.clients, errors=self.errors,
                      throughput_rps=len(self.latencies) / self.seconds,
                      average_batch_size=self.inferences / max(1, self.executions))
        return result


def engine_ceiling(onnx: Path, rounds: int) -> dict[str, float]:
    """In-process ms per image at batch 1 and 32: what batching can gain at most."""
    session = load_session(resolve_model("builtin:resnet18").artifact, "onnxruntime",
                           EngineSettings(intra_op_threads=available_cores()))
    del onnx
    result = {}
    for batch, runs in ((1, 20 * rounds), (32, rounds)):
        x = np.random.default_rng(0).random((batch, 3, 224, 224), dtype=np.float32)
        session.run({"input": x})
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            session.run({"input": x})
            times.append(time.perf_counter() - start)
        result[f"ms_per_image_batch_{batch}"] = float(np.median(times)) * 1e3 / batch
    result["ceiling_ratio"] = result["ms_per_image_batch_1"] / result["ms_per_image_batch_32"]
    return result


def batching(args: argparse.Namespace) -> dict[str, object]:
    """Both servers run side by side (an idle one costs nothing) and the windows
    alternate between them, so a change in the machine's background load hits both."""
    onnx = resolve_model("builtin:resnet18").artifact.onnx_path
    x = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    request = binary_request("resnet18", x)
    cells = {(label, clients): Cell(clients) for label in ("on", "off")
             for clients in (1, args.clients)}
    with tempfile.TemporaryDirectory() as tmp:
        ports, processes = {}, []
        for label, config in (("on", BATCHING_ON), ("off", BATCHING_OFF)):
            write_entry(Path(tmp) / label, "resnet18", onnx, config)
            process, ports[label], _ = start_server(Path(tmp) / label)
            processes.append(process)
        try:
            for round_ in range(args.rounds):
                order = ("on", "off") if round_ % 2 == 0 else ("off", "on")
                for clients in (1, args.clients):
                    for label in order:
                        cells[label, clients].measure(ports[label], request,
                                                      args.seconds / args.rounds)
            ceiling = engine_ceiling(onnx, args.rounds)  # both servers idle meanwhile
        finally:
            for process in processes:
                process.terminate()
                process.wait()
    on, off = cells["on", args.clients].summary(), cells["off", args.clients].summary()
    off_1 = cells["off", 1].summary()
    return {"batching_on": on, "batching_off": off, "batching_off_1_client": off_1,
            "batching_on_1_client": cells["on", 1].summary(), "engine_in_process": ceiling,
            "throughput_ratio": on["throughput_rps"] / off["throughput_rps"],
            "p99_ratio_vs_unbatched_1_client": on["p99_ms"] / off_1["p99_ms"]}


def _small_model(name: str, folder: Path) -> tuple[Path, np.ndarray]:
    """The ONNX file and one batch-1 input of the small model ``name``."""
    if name in ("mlp", "mlp-wide"):
        sys.path.insert(0, str(HERE.parent / "serving"))
        from model import WIDE_WIDTHS, WIDTHS, write_mlp  # why: the serving benchmarks' model

        widths = WIDE_WIDTHS if name == "mlp-wide" else WIDTHS
        x = np.random.default_rng(0).random((1, widths[0]), dtype=np.float32)
        return write_mlp(folder / f"{name}.onnx", widths), x
    model = resolve_model(f"builtin:{name}")
    assert model.entry is not None
    return (model.artifact.onnx_path,
            np.ascontiguousarray(model.entry.example_inputs(1)["input"]))


def adaptive(args: argparse.Namespace) -> dict[str, object]:
    """Batching on (the adaptive window under a 2 ms bound) against off, at 1 and N
    clients, windows alternating between the servers; optionally the other checkout's
    server with the same batching configuration."""
    clients = (1, args.clients)
    with tempfile.TemporaryDirectory() as tmp:
        onnx, x = _small_model(args.model, Path(tmp))
        request = binary_request(args.model, x)
        servers = {"on": (ADAPTIVE_ON, None), "off": (BATCHING_OFF, None)}
        if args.baseline_src is not None:
            servers["on_baseline"] = (ADAPTIVE_ON, Path(args.baseline_src))
        cells = {(label, n): Cell(n, args.model) for label in servers for n in clients}
        ports, processes = {}, []
        for label, (config, src) in servers.items():
            write_entry(Path(tmp) / label, args.model, onnx, config)
            process, ports[label], _ = start_server(Path(tmp) / label, src)
            processes.append(process)
        try:
            labels = list(servers)
            for round_ in range(args.rounds):
                order = labels[round_ % len(labels):] + labels[:round_ % len(labels)]
                for n in clients:
                    for label in order:
                        cells[label, n].measure(ports[label], request,
                                                args.seconds / args.rounds)
                        print(f"round {round_} {label} {n} clients", flush=True)
        finally:
            for process in processes:
                process.terminate()
                process.wait()
    summaries = {f"{label}_{n}_clients": cell.summary() for (label, n), cell in cells.items()}
    on_1, off_1 = summaries["on_1_clients"], summaries["off_1_clients"]
    on_n, off_n = summaries[f"on_{args.clients}_clients"], summaries[f"off_{args.clients}_clients"]
    result: dict[str, object] = {
        "model": args.model, "max_queue_delay_ms": 2.0, "cells": summaries,
        "on_over_off_throughput_1_client": on_1["throughput_rps"] / off_1["throughput_rps"],
        f"on_over_off_throughput_{args.clients}_clients":
            on_n["throughput_rps"] / off_n["throughput_rps"],
        f"on_over_off_p99_{args.clients}_clients": on_n["p99_ms"] / off_n["p99_ms"]}
    if args.baseline_src is not None:
        result["baseline_src"] = str(args.baseline_src)
        result["on_over_baseline_on_throughput_1_client"] = (
            on_1["throughput_rps"] / summaries["on_baseline_1_clients"]["throughput_rps"])
    return result


def machine() -> dict[str, object]:
    cpu = profile(engines=False, gpus=False).cpu.model_name or platform.processor()
    return {"cpu": cpu, "cores": available_cores(), "python": platform.python_version(),
            "load_average_1m": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=["overhead", "batching", "ab", "adaptive"])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3,
                        help="batching, ab: windows per cell, alternating the two servers")
    parser.add_argument("--baseline-src", default=None,
                        help="ab, adaptive: the src/ folder of the checkout to compare "
                             "with")
    parser.add_argument("--model", choices=["mlp", "mlp-wide", "digits-cnn"], default="mlp",
                        help="adaptive: the small model served")
    args = parser.parse_args()
    before = machine()
    result = {"overhead": overhead, "batching": batching, "ab": ab,
              "adaptive": adaptive}[args.scenario](args)
    output = {"scenario": args.scenario, "machine": before,
              "load_average_1m_after": os.getloadavg()[0], "result": result}
    text = json.dumps(output, indent=2)
    name = f"adaptive-{args.model}" if args.scenario == "adaptive" else args.scenario
    (HERE / f"{name}.json").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
