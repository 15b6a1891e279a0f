"""Symptoms provoked for real on a running ``turboinfer serve``, then named by ``doctor
URL``: one slow client (client_bound), a busy-loop process pinned to the server's core
(cpu_contention), batches formed without waiting (batch_efficiency), and a batch too
large for the server's address space (out_of_memory).

Each provocation is generous (a 10 ms think per request against a sub-millisecond model,
a hog taking half the server's only core, 16 clients against max_batch_size 64, a 4 GiB
output under a 1 GiB allowance), and
the assertions are on the rule that fired and the evidence it quotes, not on timings.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import psutil
import pytest
from onnx import TensorProto, helper, numpy_helper

from real_server import RealServer, serve_repository
from turboinfer.doctor import Diagnosis, Finding
from turboinfer.doctor.api import DoctorRequest, run_doctor
from turboinfer.serve.config import DynamicBatching, ModelConfig, write_entry

pytestmark = pytest.mark.slow  # real servers, real windows of a few seconds

MODEL = "linear"        # the unbatched fixture's model: input [batch, 16]
THINK_MS = 10.0         # the slow client's CPU work before each request
WINDOW_S = 3.0

# A client process: THREADS loops, each sending one request at a time after THINK_MS of
# CPU work (a real client's pre-processing), until it is stopped. It prints "ready" once
# its first answer is back, so the window opens on a client already sending.
CLIENT = """
import json, sys, threading, time, urllib.request
url, think = sys.argv[1], float(sys.argv[2]) / 1e3
threads, width = int(sys.argv[3]), int(sys.argv[4])
body = json.dumps({"inputs": [{"name": "input", "shape": [1, width], "datatype": "FP32",
                               "data": [0.5] * width}]}).encode()
first = threading.Event()

def loop():
    while True:
        start = time.process_time()
        while time.process_time() - start < think:
            pass
        request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
        first.set()

for _ in range(threads):
    threading.Thread(target=loop, daemon=True).start()
first.wait()
print("ready", flush=True)
threading.Event().wait()
"""


@contextlib.contextmanager
def client(url: str, model: str, *, think_ms: float, threads: int, width: int
           ) -> Iterator[subprocess.Popen[str]]:
    """The CLIENT process, sending by the time this yields; killed on exit."""
    process = subprocess.Popen(
        [sys.executable, "-c", CLIENT, f"{url}/v2/models/{model}/infer", str(think_ms),
         str(threads), str(width)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready"
        yield process
        assert process.poll() is None, "the client stopped during the window"
    finally:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


def findings(diagnosis: Diagnosis) -> dict[str, Finding]:
    return {f.rule: f for f in diagnosis.findings}


def test_one_slow_client_is_named_as_the_bottleneck(unbatched: RealServer) -> None:
    # A longer window: a slow client on a loaded machine must still send enough requests
    # for the rule to judge (MIN_REQUESTS).
    with client(unbatched.http_url, MODEL, think_ms=THINK_MS, threads=1, width=16):
        diagnosis = run_doctor(DoctorRequest(url=unbatched.http_url, model=MODEL,
                                             window_s=2 * WINDOW_S))
    found = findings(diagnosis)
    assert "client_bound" in found, diagnosis.to_dict()
    assert "queueing" not in found
    finding = found["client_bound"]
    assert finding.cause.startswith("the server waits for work")
    match = re.search(r"([\d.]+) ms per request in the server, one every ([\d.]+) ms; "
                      r"queue ([\d.]+) ms, at most (\d+) pending; the server used "
                      r"([\d.]+) cores", finding.evidence)
    assert match, finding.evidence
    in_server, every = float(match[1]), float(match[2])
    # One client that thinks THINK_MS of CPU before each request cannot send more often.
    assert every >= THINK_MS
    assert in_server < every
    assert re.search(r"requests/s kept the server busy \d+% of \d+ s", finding.symptom)
    assert f"turboinfer load {unbatched.http_url} --model {MODEL}" in finding.fix


def _pin(pid: int, cores: set[int]) -> None:
    """Every thread of ``pid`` onto ``cores`` (sched_setaffinity moves one thread)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except ProcessLookupError:
            continue  # the thread exited meanwhile


DEEP, LAYERS = 1024, 8   # the busy model: 8 MatMul+Relu of 1024x1024, a few ms a request
BATCH = 64               # deep-batched's max_batch_size, far above its clients' number
CLIENTS = 16


def deep_onnx(path: Path) -> Path:
    """Enough arithmetic per request that a server under load wants its core all the time."""
    rng = np.random.default_rng(0)
    nodes, weights, previous = [], [], "input"
    for i in range(LAYERS):
        nodes += [helper.make_node("MatMul", [previous, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]
        weights.append(numpy_helper.from_array(
            (rng.standard_normal((DEEP, DEEP)) / DEEP**0.5).astype(np.float32), f"w{i}"))
        previous = f"r{i}"
    nodes.append(helper.make_node("Identity", [previous], ["output"]))
    graph = helper.make_graph(
        nodes, "deep",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", DEEP])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", DEEP])],
        initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def busy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    """``deep`` twice: batching off, and batches of up to BATCH formed without waiting."""
    root = tmp_path_factory.mktemp("doctor-busy")
    model = deep_onnx(root / "deep.onnx")
    write_entry(root / "repo", "deep", model, ModelConfig(max_batch_size=0))
    write_entry(root / "repo", "deep-batched", model, ModelConfig(
        max_batch_size=BATCH, dynamic_batching=DynamicBatching(max_queue_delay_ms=0)))
    with serve_repository(root / "repo", root / "serve.log") as server:
        yield server


def test_a_hog_pinned_to_the_servers_core_is_named(busy_server: RealServer) -> None:
    if not os.path.exists("/proc/self/schedstat"):
        pytest.skip("this kernel has no schedstat: the server exports no CPU wait")
    everywhere = os.sched_getaffinity(0)
    core = min(everywhere)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(hog.pid, {core})
        _pin(busy_server.process.pid, {core})
        # Four requests always in: the server wants its one core all the window.
        with client(busy_server.http_url, "deep", think_ms=0, threads=4, width=DEEP) as load:
            if len(everywhere) > 1:
                _pin(load.pid, everywhere - {core})
            diagnosis = run_doctor(DoctorRequest(url=busy_server.http_url, model="deep",
                                                 window_s=WINDOW_S))
    finally:
        hog.kill()
        hog.wait()
        _pin(busy_server.process.pid, everywhere)
    found = findings(diagnosis)
    assert "cpu_contention" in found, diagnosis.to_dict()
    finding = found["cpu_contention"]
    match = re.search(r"waited ([\d.]+) s for a CPU while running ([\d.]+) s",
                      finding.symptom)
    assert match, finding.symptom
    waited, ran = float(match[1]), float(match[2])
    assert waited > 0 and ran > 0
    per_second = re.match(r"([\d.]+) s runnable but waiting per CPU second \(schedstat "
                          r"run-queue wait\); the server used [\d.]+ cores", finding.evidence)
    assert per_second, finding.evidence
    # The evidence's ratio is the symptom's two figures divided (they are rounded).
    assert float(per_second[1]) == pytest.approx(waited / ran, rel=0.05, abs=0.02)
    assert finding.fix.startswith("give the server cores of its own: taskset -c")


def test_batches_that_do_not_fill_while_requests_wait_are_named(
        busy_server: RealServer) -> None:
    """Sixteen clients against max_batch_size 64 with no queue delay: each batch takes
    what is queued at that instant, the rest wait for the next."""
    with client(busy_server.http_url, "deep-batched", think_ms=0, threads=CLIENTS,
                width=DEEP):
        diagnosis = run_doctor(DoctorRequest(url=busy_server.http_url, model="deep-batched",
                                             window_s=WINDOW_S))
    found = findings(diagnosis)
    assert "batch_efficiency" in found, diagnosis.to_dict()
    finding = found["batch_efficiency"]
    match = re.fullmatch(rf"deep-batched: average batch ([\d.]+) of max_batch_size {BATCH} "
                         r"\((\d+)%\)", finding.symptom)
    assert match, finding.symptom
    # Clients with one request each in flight cannot make a batch above their number.
    assert 1 <= float(match[1]) <= CLIENTS
    assert abs(int(match[2]) - 100 * float(match[1]) / BATCH) <= 1  # both rounded
    assert re.fullmatch(r"up to \d+ requests pending while batches averaged [\d.]+ rows",
                        finding.evidence), finding.evidence
    assert finding.fix.startswith("config.yaml: dynamic_batching: {max_queue_delay_ms: 5}")


WIDTH, WIDE = 16, 1 << 16   # input [batch, 16] -> output [batch, 65536]
HUGE_BATCH = 16384          # a 4 GiB output
ALLOWANCE = 1 << 30         # address space granted beyond what the server holds at start


def wide_onnx(path: Path) -> Path:
    """One MatMul that widens each row 4096-fold: a batch's output outgrows its input."""
    weight = np.random.default_rng(0).standard_normal((WIDTH, WIDE)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "weight"], ["output"])], "wide",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", WIDE])],
        initializer=[numpy_helper.from_array(weight, "weight")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def wide_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RealServer, Path]]:
    """``wide`` served with max_batch_size HUGE_BATCH, its address space capped (RLIMIT_AS)
    once it is up: a batch that size cannot be allocated, smaller ones can."""
    root = tmp_path_factory.mktemp("doctor-oom")
    write_entry(root / "repo", "wide", wide_onnx(root / "wide.onnx"),
                ModelConfig(max_batch_size=HUGE_BATCH))
    log = root / "serve.log"
    with serve_repository(root / "repo", log) as server:
        limit = psutil.Process(server.process.pid).memory_info().vms + ALLOWANCE
        resource.prlimit(server.process.pid, resource.RLIMIT_AS, (limit, limit))
        yield server, log


def _infer(url: str, batch: int) -> int:
    data = np.full((batch, WIDTH), 0.5, np.float32)
    body = {"inputs": [{"name": "input", "shape": [batch, WIDTH], "datatype": "FP32",
                        "data": data.ravel().tolist()}]}
    request = urllib.request.Request(f"{url}/v2/models/wide/infer", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_a_batch_that_cannot_be_allocated_is_named(
        wide_server: tuple[RealServer, Path]) -> None:
    server, log = wide_server
    result: list[Diagnosis] = []
    doctor = threading.Thread(target=lambda: result.append(run_doctor(DoctorRequest(
        url=server.http_url, model="wide", window_s=WINDOW_S, server_log=log))))
    doctor.start()
    try:
        statuses = [_infer(server.http_url, 4), _infer(server.http_url, HUGE_BATCH),
                    _infer(server.http_url, 4)]
    finally:
        doctor.join()
    assert statuses[0] == statuses[2] == 200      # the server kept serving
    assert statuses[1] == 500  # the server could not allocate: its fault, not the request's
    finding = findings(result[0])["out_of_memory"]
    assert finding.severity.label == "critical"
    assert re.fullmatch(rf"\d+ allocation-failure line\(s\) in {re.escape(str(log))} "
                        r"\(\d+ lines\)", finding.symptom), finding.symptom
    # ONNX Runtime's own words, with the size it asked for: 16384 x 65536 x 4 bytes.
    assert "Failed to allocate memory for requested buffer of size 4294967296" in \
        finding.evidence
    assert re.search(r"; 1 failed request\(s\) of wide in the \d+ s window \(backend: 1\)",
                     finding.evidence), finding.evidence
    assert finding.fix.startswith(f"config.yaml: max_batch_size: {HUGE_BATCH // 2} ")
