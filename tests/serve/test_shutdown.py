"""Shutdown through signals on a real ``turboinfer serve``: a signal while the models are
still loading stops the server at once."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Far below the time a first export of ResNet-50 takes on any machine here.
STOP_WITHIN_S = 10.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _live(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/v2/health/live")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_loading_stops_at_once(tmp_path: Path, sig: signal.Signals) -> None:
    # An empty model cache: ResNet-50 is exported from scratch, which takes far longer
    # than the bound below.
    env = dict(os.environ, TURBOINFER_CACHE_DIR=str(tmp_path / "cache"))
    port = _free_port()
    log = (tmp_path / "server.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "turboinfer", "serve", "--zoo-models", "resnet50",
         "--http-port", str(port), "--grpc-port", "-1"],
        stdout=subprocess.DEVNULL, stderr=log, env=env)
    log.close()
    try:
        for _ in range(600):  # the socket answers before the models load
            if _live(port) or process.poll() is not None:
                break
            time.sleep(0.1)
        assert process.poll() is None, (tmp_path / "server.log").read_text()
        signalled = time.monotonic()
        process.send_signal(sig)
        code = process.wait(STOP_WITHIN_S + 60)
        assert time.monotonic() - signalled < STOP_WITHIN_S
        assert code == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
