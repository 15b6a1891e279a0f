"""One real ``turboinfer llm serve`` process on the demo model, shared by the server tests,
and the in-process engine that gives the reference outputs."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from llm_server_helpers import API_KEY, KV_CACHE_TOKENS, MAX_NUM_SEQS, MAX_WAITING, Server

from turboinfer.llm import LLM, EngineConfig


def _read_lines(stream: Any, lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    argv = [sys.executable, "-m", "turboinfer", "llm", "serve", "--port", "0", "--threads", "1",
            "--kv-cache-tokens", str(KV_CACHE_TOKENS), "--max-num-seqs", str(MAX_NUM_SEQS),
            "--max-waiting", str(MAX_WAITING), "--api-key", API_KEY]
    # stderr to a file: a pipe nobody reads would block the server once it fills.
    log_path = tmp_path_factory.mktemp("llm_server") / "stderr.log"
    log = log_path.open("w")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
    try:
        line = lines.get(timeout=120)
    except queue.Empty:
        proc.kill()
        log.close()
        pytest.fail(f"the server did not start: {log_path.read_text()}")
    assert line.startswith("turboinfer llm serving http="), line
    address = line.split("http=")[1].split()[0]
    try:
        yield Server(f"http://{address}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
        log.close()


@pytest.fixture(scope="session")
def reference() -> LLM:
    """The in-process engine the server's greedy output must equal."""
    return LLM(config=EngineConfig(kv_cache_tokens=KV_CACHE_TOKENS))
