"""``turboinfer serve`` as a subprocess over a repository, for tests that need the real
server process (load, doctor): free ports, the ready line read without hanging, SIGTERM
at the end."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass
class RealServer:
    process: subprocess.Popen[str]
    http_url: str
    grpc_url: str


@contextlib.contextmanager
def serve_repository(repo: Path, log_path: Path) -> Iterator[RealServer]:
    """``turboinfer serve REPO`` in a subprocess on free ports, stopped with SIGTERM."""
    log = log_path.open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "turboinfer", "serve", str(repo), "--http-port", "0",
         "--grpc-port", "0", "--model-control", "none"],
        stdout=subprocess.PIPE, stderr=log, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    log.close()
    try:
        line = _ready_line(process, timeout_s=120)
        fields = dict(part.split("=", 1) for part in line.split()[2:])
        yield RealServer(process, f"http://{fields['http']}", fields["grpc"])
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def _ready_line(process: subprocess.Popen[str], *, timeout_s: float) -> str:
    """The server's "turboinfer serving http=... grpc=..." line, read without hanging."""
    lines: list[str] = []
    assert process.stdout is not None
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()),  # type: ignore[union-attr]
                              daemon=True)
    reader.start()
    reader.join(timeout_s)
    line = lines[0].strip() if lines else ""
    if not line.startswith("turboinfer serving"):
        process.kill()
        raise RuntimeError(f"turboinfer serve did not start: {line!r}")
    return line
