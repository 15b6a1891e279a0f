"""A real ``turboinfer serve`` with batching off, for the doctor's URL mode."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from turboinfer.serve.config import ModelConfig, write_entry

MODEL = "linear"


def _ready_line(process: subprocess.Popen[str], timeout_s: float) -> str:
    lines: list[str] = []
    stdout = process.stdout
    assert stdout is not None
    reader = threading.Thread(target=lambda: lines.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    line = lines[0].strip() if lines else ""
    if not line.startswith("turboinfer serving"):
        process.kill()
        raise RuntimeError(f"turboinfer serve did not start: {line!r}")
    return line


@pytest.fixture(scope="module")
def unbatched_server(linear_onnx: Path, tmp_path_factory: pytest.TempPathFactory
                     ) -> Iterator[str]:
    """The HTTP URL of ``turboinfer serve`` over ``linear`` with max_batch_size 0."""
    repo = tmp_path_factory.mktemp("doctor-repo")
    write_entry(repo, MODEL, linear_onnx, ModelConfig(max_batch_size=0))
    process = subprocess.Popen(
        [sys.executable, "-m", "turboinfer", "serve", str(repo), "--http-port", "0",
         "--grpc-port", "0", "--model-control", "none"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        line = _ready_line(process, 120)
        fields = dict(part.split("=", 1) for part in line.split()[2:])
        yield f"http://{fields['http']}"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
