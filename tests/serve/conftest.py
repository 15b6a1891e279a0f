"""Fixtures for the server tests: tiny ONNX models, repositories, a server subprocess.

The server runs in a subprocess: tritonclient.http is built on gevent, and a server
sharing the test process would share its patched sockets and threads.
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import orjson
import pytest
from onnx import TensorProto, helper, numpy_helper

from turboinfer.serve.config import DynamicBatching, ModelConfig, write_entry

# Runs the ``serve`` command module exactly as the CLI does, with its own arguments.
RUNNER = """
import argparse, sys
from turboinfer.commands import serve
parser = argparse.ArgumentParser()
serve.add_arguments(parser)
sys.exit(serve.run(parser.parse_args(sys.argv[1:])))
"""


def make_affine_onnx(path: Path, scale: float, bias: float, width: int = 16) -> Path:
    """``output = input * scale + bias`` over ``[batch, width]`` float32."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["input", "scale"], ["scaled"]),
         helper.make_node("Add", ["scaled", "bias"], ["output"])],
        "affine",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", width])],
        initializer=[numpy_helper.from_array(np.array(scale, np.float32), "scale"),
                     numpy_helper.from_array(np.array(bias, np.float32), "bias")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def make_slow_onnx(path: Path, width: int = 512, depth: int = 24) -> Path:
    """``depth`` chained MatMuls of ``width``: a few ms per row, for queueing tests."""
    rng = np.random.default_rng(1)
    weight = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    nodes, previous = [], "input"
    for i in range(depth):
        nodes.append(helper.make_node("MatMul", [previous, "w"], [f"h{i}"]))
        previous = f"h{i}"
    nodes.append(helper.make_node("Identity", [previous], ["output"]))
    graph = helper.make_graph(
        nodes, "slow",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", width])],
        initializer=[numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="session")
def model_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("serve-models")
    files = {}
    for version in (1, 2, 3):
        # The bias tells the versions apart in the outputs: 2 * x + version.
        files[f"affine{version}"] = make_affine_onnx(folder / f"affine{version}.onnx",
                                                     2.0, float(version))
    files["slow"] = make_slow_onnx(folder / "slow.onnx")
    broken = folder / "broken.onnx"
    broken.write_bytes(b"this is not an onnx model")
    files["broken"] = broken
    return files


AFFINE_CONFIG = ModelConfig(max_batch_size=8,
                            dynamic_batching=DynamicBatching(max_queue_delay_ms=2.0))
SLOW_CONFIG = ModelConfig(max_batch_size=0, instances=1,
                          dynamic_batching=DynamicBatching(max_queue_size=4))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, model_files: dict[str, Path]) -> Path:
    root = tmp_path_factory.mktemp("repo")
    write_entry(root, "affine", model_files["affine1"], AFFINE_CONFIG)
    write_entry(root, "slow", model_files["slow"], SLOW_CONFIG)
    return root


@dataclass
class Server:
    process: subprocess.Popen[str]
    http_port: int
    grpc_port: int
    log: Path

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=30)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def post_json(self, path: str, doc: Any) -> tuple[int, Any]:
        status, body = self.request("POST", path, orjson.dumps(doc))
        return status, orjson.loads(body) if body else None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()
        finally:
            if self.process.stdout is not None:
                self.process.stdout.close()


def start_server(repo: Path | None, log: Path, *args: str, timeout: float = 120,
                 cli: bool = False) -> Server:
    """Start the server; ``cli`` runs it through ``python -m turboinfer serve``."""
    command = [sys.executable, "-m", "turboinfer", "serve"] if cli else [
        sys.executable, "-c", RUNNER]
    if repo is not None:
        command.append(str(repo))
    command += ["--http-port", "0", "--grpc-port", "0", *args]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    stderr = log.open("w")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True,
                               env=env)
    stderr.close()
    line = _first_line(process, timeout)
    if not line.startswith("turboinfer serving"):
        process.kill()
        raise RuntimeError(f"server did not start: {line!r}\n{log.read_text()[-3000:]}")
    fields = dict(part.split("=", 1) for part in line.split()[2:])
    grpc = fields.get("grpc", ":-1")
    return Server(process, int(fields["http"].rsplit(":", 1)[1]),
                  int(grpc.rsplit(":", 1)[1]), log)


def _first_line(process: subprocess.Popen[str], timeout: float) -> str:
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(process.stdout.readline()),  # type: ignore[union-attr]
                              daemon=True)
    reader.start()
    reader.join(timeout)
    return result[0].strip() if result else ""


@pytest.fixture(scope="session")
def launch() -> Callable[..., Server]:
    """``launch(repo, log, *args)``: start a server subprocess (tests stop it)."""
    return start_server


@pytest.fixture(scope="session")
def affine_config() -> ModelConfig:
    return AFFINE_CONFIG


@pytest.fixture(scope="session")
def slow_config() -> ModelConfig:
    return SLOW_CONFIG


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server(repo, tmp_path_factory.mktemp("log") / "server.log",
                           "--max-body-mb", "1")
    yield running
    assert running.stop() == 0


class _HeldSession:
    """A session whose runs wait at a gate (on the instance's thread, as a slow model
    would), never longer than ``limit_s`` so that a failing test cannot hang."""

    def __init__(self, session: Any, gate: threading.Event, limit_s: float = 60.0) -> None:
        self.session, self.gate, self.limit_s = session, gate, limit_s

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.gate.wait(self.limit_s)
        result: dict[str, np.ndarray] = self.session.run(feeds)
        return result


@pytest.fixture
def hold() -> Callable[[Any], threading.Event]:
    """``hold(served)``: the version's batches wait until the returned event is set."""
    def gate(served: Any) -> threading.Event:
        event = threading.Event()
        for instance in served.pool.instances:
            instance.session = _HeldSession(instance.session, event)
        return event

    return gate
