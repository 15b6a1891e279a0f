"""What gRPC itself costs here: bare transports against the real server, side by side.

    python benchmarks/serving_server/grpc_floor.py [--rounds 3] [--seconds 4]
        [--grpclib-python VENV/bin/python] [--env-cells] [--only CELL ...]

Cells, each loaded by one closed-loop client process at concurrency 1 and 8 (the same
transports ``turboinfer load`` uses: its raw asyncio HTTP/1.1 client with binary
tensors, and ``grpc.aio`` with prepared request bytes; for streaming one
``ModelStreamInfer`` stream per concurrent client, one request in flight on each):

- ``bare-http``: uvicorn as ``turboinfer serve`` runs it (uvloop, httptools), with an
  ASGI app that reads the body and answers the real server's response bytes; no model.
- ``bare-grpc-aio``: ``grpc.aio`` on uvloop as the real server runs it, with a handler
  that answers the real server's ModelInferResponse bytes (raw bytes in and out: no
  protobuf work); ``bare-grpc-aio-stream`` the same over ``ModelStreamInfer``.
- ``bare-grpc-sync``: ``grpc.server`` with a thread pool of 8, the same handler.
- ``bare-grpclib`` (with ``--grpclib-python``, a Python that has grpclib): grpclib's
  pure-Python HTTP/2 server with the same handlers, raw bytes through a pass-through
  codec.
- ``real-http``, ``real-grpc``, ``real-grpc-stream``: one ``turboinfer serve`` of
  builtin:digits-cnn (max batch 32, no queue delay).

Every cell records throughput, p50, and the CPU time per request of the server process
(user + system of all its threads from /proc over the client's whole run, warm-up
included, divided by all requests answered) and of the client process (its own
``getrusage`` over the measured window, divided by the requests in it): on a shared
2-core machine the CPU per request is the steadier figure, and client plus server CPU
per request is what bounds throughput when both share the cores. For the real server
also the rows per engine run (from its statistics). Cells run in an order that reverses
every round. Raw results go to ``grpc_floor.json``.

``--env-cells`` adds ``bare-grpc-aio`` variants under gRPC's environment switches
(``GRPC_POLL_STRATEGY=poll``, ``GRPC_ENABLE_FORK_SUPPORT=0``) and server options.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent / "src"
MODEL = "digits-cnn"
TICKS = os.sysconf("SC_CLK_TCK")
WARMUP_S = 1.0
SERVICE = "inference.GRPCInferenceService"
# Per bare gRPC variant: extra environment and server options.
GRPC_VARIANTS: dict[str, tuple[dict[str, str], list[tuple[str, Any]]]] = {
    "bare-grpc-aio": ({}, []),
    "bare-grpc-aio-poll": ({"GRPC_POLL_STRATEGY": "poll"}, []),
    "bare-grpc-aio-nofork": ({"GRPC_ENABLE_FORK_SUPPORT": "0"}, []),
    "bare-grpc-aio-options": ({}, [("grpc.optimization_target", "throughput"),
                                   ("grpc.max_concurrent_streams", 1000),
                                   ("grpc.so_reuseport", 0),
                                   ("grpc.http2.bdp_probe", 0),
                                   ("grpc.default_compression_algorithm", 0)]),
}


# --- bare servers (each its own process, started by main) ---------------------------

def bare_http(response: Path, headers: str) -> None:
    import uvicorn  # why: only the bare HTTP server process needs it

    from turboinfer.listening import JsonErrorHttp, QuietUvicorn, listen

    body = response.read_bytes()
    head = [(b"content-type", b"application/octet-stream"),
            *[(k.encode(), v.encode()) for k, v in json.loads(headers).items()],
            (b"content-length", str(len(body)).encode())]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": body})

    async def serve() -> None:
        sock = listen("127.0.0.1", 0)
        print(f"port={sock.getsockname()[1]}", flush=True)
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                loop="none", http=JsonErrorHttp, timeout_keep_alive=30,
                                proxy_headers=False, server_header=False)
        await QuietUvicorn(config).serve(sockets=[sock])

    _run_uvloop(serve())


def _grpc_handlers(response: bytes, stream_response: bytes) -> Any:
    import grpc  # why: only the gRPC processes need it

    def infer(request: bytes, context: Any) -> bytes:
        return response

    async def infer_aio(request: bytes, context: Any) -> bytes:
        return response

    async def stream_aio(requests: Any, context: Any) -> Any:
        async for _ in requests:
            yield stream_response

    def stream(requests: Any, context: Any) -> Any:
        for _ in requests:
            yield stream_response

    sync = os.environ.get("BARE_GRPC_SYNC") == "1"
    return grpc.method_handlers_generic_handler(SERVICE, {
        "ModelInfer": grpc.unary_unary_rpc_method_handler(infer if sync else infer_aio),
        "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(
            stream if sync else stream_aio)})


def _stream_bytes(response: bytes) -> bytes:
    from tritonclient.grpc import service_pb2  # why: only the gRPC processes need it

    wrapped = service_pb2.ModelStreamInferResponse(
        infer_response=service_pb2.ModelInferResponse.FromString(response))
    return bytes(wrapped.SerializeToString())


def bare_grpc_aio(response_path: Path, variant: str) -> None:
    import grpc  # why: only the gRPC processes need it

    response = response_path.read_bytes()
    options = GRPC_VARIANTS[variant][1]

    async def serve() -> None:
        server = grpc.aio.server(options=options)
        server.add_generic_rpc_handlers((_grpc_handlers(response, _stream_bytes(response)),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(f"port={port}", flush=True)
        await server.wait_for_termination()

    _run_uvloop(serve())


def bare_grpc_sync(response_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor  # why: only this process

    import grpc  # why: only the gRPC processes need it

    response = response_path.read_bytes()
    server = grpc.server(ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((_grpc_handlers(response, _stream_bytes(response)),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"port={port}", flush=True)
    server.wait_for_termination()


def bare_grpclib(response_path: Path) -> None:
    """grpclib (pure-Python HTTP/2 on asyncio, h2's state machine) with the same
    handlers; raw bytes through a codec that passes them as they are."""
    from grpclib.const import Cardinality, Handler  # why: only this process
    from grpclib.encoding.base import CodecBase
    from grpclib.server import Server

    response = response_path.read_bytes()
    stream_response = _stream_bytes(response)

    class RawCodec(CodecBase):
        __content_subtype__ = "proto"

        def encode(self, message: Any, message_type: Any) -> bytes:
            return bytes(message)

        def decode(self, data: bytes, message_type: Any) -> bytes:
            return data

    async def infer(stream: Any) -> None:
        await stream.recv_message()
        await stream.send_message(response)

    async def stream_infer(stream: Any) -> None:
        async for _ in stream:
            await stream.send_message(stream_response)

    class Service:
        def __mapping__(self) -> dict[str, Any]:
            return {f"/{SERVICE}/ModelInfer": Handler(infer, Cardinality.UNARY_UNARY,
                                                      bytes, bytes),
                    f"/{SERVICE}/ModelStreamInfer": Handler(
                        stream_infer, Cardinality.STREAM_STREAM, bytes, bytes)}

    async def serve() -> None:
        server = Server([Service()], codec=RawCodec())
        await server.start("127.0.0.1", 0)
        port = server._server.sockets[0].getsockname()[1]
        print(f"port={port}", flush=True)
        await server.wait_closed()

    _run_uvloop(serve())


def _run_uvloop(main: Any) -> None:
    import uvloop  # why: the server runs on uvloop; so do the bare ones

    uvloop.run(main)


# --- the client process ------------------------------------------------------------

async def _drive(kind: str, target: str, request: bytes, concurrency: int,
                 seconds: float) -> dict[str, Any]:
    from turboinfer.load.client import make_client  # why: client process only

    client: Any
    if kind == "stream":
        client = StreamClient(target, concurrency)
    else:
        client = make_client(target, protocol=kind, timeout_s=30.0,
                             max_connections=concurrency)
    latencies: list[float] = []
    counts = {"all": 0, "failed": 0}
    start = time.perf_counter()
    measure_from = start + WARMUP_S
    stop_at = measure_from + seconds
    usage: list[resource.struct_rusage] = []

    async def worker(slot: int) -> None:
        infer = client.infer_on(slot) if kind == "stream" else client.infer
        while True:
            began = time.perf_counter()
            if began >= stop_at:
                return
            if began >= measure_from and not usage:
                usage.append(resource.getrusage(resource.RUSAGE_SELF))
            failed = await infer(request)
            done = time.perf_counter()
            counts["all"] += 1
            if failed is not None:
                counts["failed"] += 1
            elif began >= measure_from:
                latencies.append(done - began)

    await asyncio.gather(*(worker(slot) for slot in range(concurrency)))
    end = resource.getrusage(resource.RUSAGE_SELF)
    window_cpu = (end.ru_utime + end.ru_stime) - (usage[0].ru_utime + usage[0].ru_stime)
    await client.close()
    lat = np.array(latencies) * 1e3
    return {"qps": len(latencies) / seconds, "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)), "requests_all": counts["all"],
            "failed": counts["failed"],
            "client_cpu_ms_per_request": 1e3 * window_cpu / max(1, len(latencies))}


class StreamClient:
    """One ``ModelStreamInfer`` stream per concurrent slot, one request in flight on
    each (as perf_analyzer's ``--streaming`` runs at a given concurrency)."""

    def __init__(self, target: str, concurrency: int) -> None:
        import grpc  # why: client process only
        from tritonclient.grpc import service_pb2  # why: client process only

        self._parse = service_pb2.ModelStreamInferResponse.FromString
        self._channel = grpc.aio.insecure_channel(target)
        method = self._channel.stream_stream(f"/{SERVICE}/ModelStreamInfer")
        self._calls = [method() for _ in range(concurrency)]

    def infer_on(self, slot: int) -> Any:
        call = self._calls[slot]

        async def infer(request: bytes) -> str | None:
            await call.write(request)
            reply = self._parse(await call.read())
            return "stream_error" if reply.error_message else None
        return infer

    async def close(self) -> None:
        for call in self._calls:
            await call.done_writing()
        await self._channel.close()


def client_main(kind: str, target: str, request_path: Path, concurrency: int,
                seconds: float) -> None:
    # asyncio's own loop, as ``turboinfer load`` runs.
    result = asyncio.run(_drive(kind, target, request_path.read_bytes(), concurrency,
                                seconds))
    print(json.dumps(result), flush=True)


# --- the orchestration ---------------------------------------------------------------

def _cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / TICKS


def _port_of(process: subprocess.Popen[str]) -> int:
    assert process.stdout is not None
    while True:
        line = process.stdout.readline()
        if not line:
            raise RuntimeError("a server exited before printing its port")
        if line.startswith("port="):
            return int(line.split("=", 1)[1])


def _spawn(args: list[str], env: dict[str, str], log: Path,
           python: str = sys.executable) -> subprocess.Popen[str]:
    return subprocess.Popen([python, *args], stdout=subprocess.PIPE,
                            stderr=log.open("w"), text=True,
                            env=dict(os.environ, PYTHONPATH=str(SRC), **env))


def _start_real(work: Path, src: Path) -> tuple[subprocess.Popen[str], int, int]:
    from turboinfer.models import resolve_model  # why: orchestration only
    from turboinfer.serve.config import DynamicBatching, ModelConfig, write_entry

    onnx = resolve_model(f"builtin:{MODEL}").artifact.onnx_path
    write_entry(work / "repo", MODEL, onnx, ModelConfig(
        max_batch_size=32, dynamic_batching=DynamicBatching(max_queue_delay_ms=0.0)))
    process = subprocess.Popen(
        [sys.executable, "-m", "turboinfer", "serve", str(work / "repo"), "--http-port",
         "0", "--grpc-port", "0", "--model-control", "none"], stdout=subprocess.PIPE,
        stderr=(work / "real.log").open("w"), text=True,
        env=dict(os.environ, PYTHONPATH=str(src)))
    assert process.stdout is not None
    fields = dict(part.split("=", 1) for part in process.stdout.readline().split()[2:])
    return (process, int(fields["http"].rsplit(":", 1)[1]),
            int(fields["grpc"].rsplit(":", 1)[1]))


def _prepare(work: Path, http_port: int, grpc_port: int) -> dict[str, Any]:
    """Request bytes for each transport, and the real server's answers to them."""
    import grpc  # why: orchestration only

    from turboinfer.load.grpc_client import encode_grpc  # why: orchestration only
    from turboinfer.load.inputs import random_inputs
    from turboinfer.load.protocol import encode_http

    async def info() -> Any:
        from turboinfer.load.client import make_client  # why: orchestration only

        client = make_client(f"http://127.0.0.1:{http_port}", protocol="http",
                             timeout_s=30.0, max_connections=1)
        try:
            return await client.model_info(MODEL, "")
        finally:
            await client.close()

    model = asyncio.run(info())
    tensors = random_inputs(model, batch_size=1, seed=0)
    grpc_request = encode_grpc(model, tensors)
    (work / "grpc.req").write_bytes(grpc_request)
    payload = encode_http(model, tensors, binary=True)
    (work / "http.body").write_bytes(payload.body)
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        answer = channel.unary_unary(f"/{SERVICE}/ModelInfer")(grpc_request, timeout=30)
    (work / "grpc.resp").write_bytes(answer)
    post = urllib.request.Request(f"http://127.0.0.1:{http_port}{payload.path}",
                                  data=payload.body, headers=dict(payload.headers))
    with urllib.request.urlopen(post, timeout=30) as reply:
        (work / "http.resp").write_bytes(reply.read())
        header = reply.headers.get("Inference-Header-Content-Length")
    return {"http_path": payload.path, "http_headers": dict(payload.headers),
            "http_response_headers": {"inference-header-content-length": header}
            if header else {}, "grpc_request_bytes": len(grpc_request),
            "grpc_response_bytes": len(answer), "http_request_body_bytes": len(payload.body)}


def _http_request(port: int, prepared: dict[str, Any], body: bytes) -> bytes:
    from turboinfer.load.endpoint import Endpoint  # why: orchestration only
    from turboinfer.load.http_client import build_request

    endpoint = Endpoint.parse(f"http://127.0.0.1:{port}")
    return build_request(endpoint, "POST", prepared["http_path"], body,
                         list(prepared["http_headers"].items()))


def _batches(stats_url: str | None) -> tuple[int, int]:
    """The real server's (inference_count, execution_count) of the model so far."""
    if stats_url is None:
        return 0, 0
    with urllib.request.urlopen(stats_url, timeout=30) as reply:
        stats = json.loads(reply.read())["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def _measure(server_pid: int, kind: str, target: str, request: Path, concurrency: int,
             seconds: float, work: Path, stats_url: str | None) -> dict[str, Any]:
    rows_before, runs_before = _batches(stats_url)
    before = _cpu_seconds(server_pid)
    client = _spawn([str(Path(__file__)), "client", kind, target, str(request),
                     str(concurrency), str(seconds)], {}, work / "client.log")
    out, _ = client.communicate(timeout=seconds + 120)
    if client.returncode != 0:
        raise RuntimeError(f"the {kind} client failed: "
                           f"{(work / 'client.log').read_text()[-2000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    server_used = _cpu_seconds(server_pid) - before
    result["server_cpu_ms_per_request"] = 1e3 * server_used / max(1, result["requests_all"])
    if stats_url is not None:
        # Rows per engine run: gRPC and HTTP may arrive spread or clumped differently.
        rows_after, runs_after = _batches(stats_url)
        result["mean_batch_rows"] = ((rows_after - rows_before)
                                     / max(1, runs_after - runs_before))
    result["load_average_1m"] = os.getloadavg()[0]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="per cell and round")
    parser.add_argument("--env-cells", action="store_true",
                        help="add the bare grpc.aio variants under gRPC's switches")
    parser.add_argument("--grpclib-python", default=None,
                        help="a Python with grpclib installed: adds the bare-grpclib cells")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--only", nargs="*", default=None, help="measure these cells only")
    parser.add_argument("--output", type=Path, default=HERE / "grpc_floor.json")
    args = parser.parse_args()
    cells: dict[str, list[dict[str, Any]]] = {}
    result: dict[str, Any] = {
        "machine": {"cpu": _cpu(), "cores": os.cpu_count(),
                    "load_average_1m_before": os.getloadavg()[0]},
        "rounds": args.rounds, "seconds_per_cell": args.seconds, "cells": cells}
    with tempfile.TemporaryDirectory(prefix="grpc-floor-") as tmp:
        work = Path(tmp)
        real, http_port, grpc_port = _start_real(work, SRC)
        servers: dict[str, subprocess.Popen[str]] = {"real": real}
        try:
            prepared = _prepare(work, http_port, grpc_port)
            result["payload"] = prepared
            resp = work / "grpc.resp"
            servers["bare-http"] = _spawn(
                [str(Path(__file__)), "bare-http", str(work / "http.resp"),
                 json.dumps(prepared["http_response_headers"])], {}, work / "bh.log")
            variants = list(GRPC_VARIANTS) if args.env_cells else ["bare-grpc-aio"]
            for name in variants:
                servers[name] = _spawn([str(Path(__file__)), "bare-grpc-aio", str(resp),
                                        name], GRPC_VARIANTS[name][0], work / f"{name}.log")
            servers["bare-grpc-sync"] = _spawn(
                [str(Path(__file__)), "bare-grpc-sync", str(resp)],
                {"BARE_GRPC_SYNC": "1"}, work / "bs.log")
            if args.grpclib_python:
                servers["bare-grpclib"] = _spawn(
                    [str(Path(__file__)), "bare-grpclib", str(resp)], {}, work / "gl.log",
                    python=args.grpclib_python)
            ports = {name: _port_of(p) for name, p in servers.items() if name != "real"}
            body = (work / "http.body").read_bytes()
            http_req = work / "http-real.req"
            http_req.write_bytes(_http_request(http_port, prepared, body))
            (work / "http-bare.req").write_bytes(_http_request(ports["bare-http"],
                                                               prepared, body))
            grpc_req = work / "grpc.req"
            plan: list[tuple[str, str, str, str, Path]] = [
                ("bare-http", "bare-http", "http", f"http://127.0.0.1:{ports['bare-http']}",
                 work / "http-bare.req")]
            extra = ["bare-grpclib"] if args.grpclib_python else []
            for name in [*variants, "bare-grpc-sync", *extra]:
                plan.append((name, name, "grpc", f"127.0.0.1:{ports[name]}", grpc_req))
                if name in ("bare-grpc-aio", "bare-grpc-sync", "bare-grpclib"):
                    plan.append((f"{name}-stream", name, "stream",
                                 f"127.0.0.1:{ports[name]}", grpc_req))
            plan += [("real-http", "real", "http", f"http://127.0.0.1:{http_port}", http_req),
                     ("real-grpc", "real", "grpc", f"127.0.0.1:{grpc_port}", grpc_req),
                     ("real-grpc-stream", "real", "stream", f"127.0.0.1:{grpc_port}",
                      grpc_req)]
            if args.only:
                plan = [step for step in plan if step[0] in args.only]
            stats_url = f"http://127.0.0.1:{http_port}/v2/models/{MODEL}/stats"
            for round_ in range(args.rounds):
                order = plan if round_ % 2 == 0 else plan[::-1]
                for concurrency in args.concurrency:
                    for cell, server, kind, target, request in order:
                        measured = _measure(servers[server].pid, kind, target, request,
                                            concurrency, args.seconds, work,
                                            stats_url if server == "real" else None)
                        key = f"{cell} c{concurrency}"
                        cells.setdefault(key, []).append(measured)
                        print(f"round {round_} {key}: {measured['qps']:.0f} req/s, "
                              f"server {measured['server_cpu_ms_per_request']:.3f} + client "
                              f"{measured['client_cpu_ms_per_request']:.3f} CPU ms/req, "
                              f"p50 {measured['p50_ms']:.2f} ms, failed "
                              f"{measured['failed']}, rows/run "
                              f"{measured.get('mean_batch_rows', 0):.2f} (load "
                              f"{measured['load_average_1m']:.1f})", flush=True)
        finally:
            for process in servers.values():
                process.terminate()
                process.wait()
    result["median"] = {key: {name: float(np.median([c[name] for c in values]))
                              for name in ("qps", "p50_ms", "server_cpu_ms_per_request",
                                           "client_cpu_ms_per_request", "mean_batch_rows")
                              if name in values[0]}
                        for key, values in cells.items()}
    result["ratios_to_http_per_round"] = _ratios(cells)
    result["load_average_1m_after"] = os.getloadavg()[0]
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["median"], indent=1))
    print(json.dumps(result["ratios_to_http_per_round"], indent=1))


def _ratios(cells: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per round, each cell's throughput over its HTTP counterpart's (bare over bare,
    real over real), measured in the same round."""
    ratios: dict[str, Any] = {}
    for key, values in cells.items():
        cell, concurrency = key.rsplit(" ", 1)
        base = f"{'real' if cell.startswith('real') else 'bare'}-http {concurrency}"
        if key == base or base not in cells:
            continue
        per_round = [v["qps"] / h["qps"] for v, h in zip(values, cells[base], strict=False)]
        ratios[key] = {"qps_over_http": per_round,
                       "qps_over_http_median": float(np.median(per_round))}
    return ratios


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return ""


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "bare-http":
        bare_http(Path(sys.argv[2]), sys.argv[3])
    elif len(sys.argv) > 1 and sys.argv[1] == "bare-grpc-aio":
        bare_grpc_aio(Path(sys.argv[2]), sys.argv[3])
    elif len(sys.argv) > 1 and sys.argv[1] == "bare-grpclib":
        bare_grpclib(Path(sys.argv[2]))
    elif len(sys.argv) > 1 and sys.argv[1] == "bare-grpc-sync":
        bare_grpc_sync(Path(sys.argv[2]))
    elif len(sys.argv) > 1 and sys.argv[1] == "client":
        client_main(sys.argv[2], sys.argv[3], Path(sys.argv[4]), int(sys.argv[5]),
                    float(sys.argv[6]))
    else:
        main()
