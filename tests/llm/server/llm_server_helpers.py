"""The running server as the tests see it: its URL, an ``openai`` client, raw requests."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest

API_KEY = "sk-test-key"
KV_CACHE_TOKENS = 4096
MAX_NUM_SEQS = 8
MAX_WAITING = 8
# Where the server and the in-process reference run: the CPU unless
# TURBOINFER_TEST_LLM_DEVICE names another (``cuda``: the same conformance tests on a GPU,
# in TURBOINFER_TEST_LLM_DTYPE, there float32 by default so that greedy choices do not
# hang on 16-bit rounding between the server's batches and the reference's).
DEVICE = os.environ.get("TURBOINFER_TEST_LLM_DEVICE", "cpu")
DTYPE = os.environ.get("TURBOINFER_TEST_LLM_DTYPE", "auto" if DEVICE == "cpu" else "float32")


@dataclass(frozen=True)
class Server:
    url: str
    # The clients handed out, closed with the server: an unclosed one's pooled connection
    # is closed only when the garbage collector finds it, in whatever test runs then,
    # which pytest fails for the ResourceWarning.
    clients: list[openai.OpenAI] = field(default_factory=list, compare=False, repr=False)

    def client(self, **options: Any) -> openai.OpenAI:
        client = openai.OpenAI(base_url=f"{self.url}/v1", api_key=API_KEY, **options)
        self.clients.append(client)
        return client

    def close_clients(self) -> None:
        for client in self.clients:
            client.close()
        self.clients.clear()

    def get_json(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=30) as reply:
            return json.loads(reply.read())

    def post(self, path: str, body: bytes, *, key: str | None = API_KEY,
             ) -> tuple[int, dict[str, str], Any]:
        headers = {"content-type": "application/json"}
        if key is not None:
            headers["authorization"] = f"Bearer {key}"
        request = urllib.request.Request(f"{self.url}{path}", body, headers)
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                return reply.status, dict(reply.headers), reply.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), json.loads(exc.read())

    def tokenize(self, prompt: str) -> list[int]:
        status, _, raw = self.post("/tokenize", json.dumps({"prompt": prompt}).encode())
        assert status == 200, raw
        tokens: list[int] = json.loads(raw)["tokens"]
        return tokens

    def wait_idle(self, deadline_s: float = 30.0) -> dict[str, Any]:
        """Poll /health until nothing runs and every KV block is free again."""
        end = time.monotonic() + deadline_s
        while True:
            health = self.get_json("/health")
            idle = (health["kv_free_blocks"] == health["kv_total_blocks"]
                    and health["requests_in_server"] == 0)
            if idle or time.monotonic() > end:
                return dict(health)
            time.sleep(0.05)


def _read_lines(stream: Any, lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line)


@contextlib.contextmanager
def launch(log_dir: Path, *extra: str) -> Iterator[Server]:
    """``turboinfer llm serve`` on the demo model with the tests' limits plus ``extra``."""
    # Where the in-process reference engine runs (the CPU unless the environment says).
    argv = [sys.executable, "-m", "turboinfer", "llm", "serve", "--device", DEVICE,
            "--dtype", DTYPE, "--port", "0", "--threads", "1",
            "--kv-cache-tokens", str(KV_CACHE_TOKENS), "--max-num-seqs", str(MAX_NUM_SEQS),
            "--max-waiting", str(MAX_WAITING), "--api-key", API_KEY, *extra]
    # stderr to a file: a pipe nobody reads would block the server once it fills.
    log_path = log_dir / "stderr.log"
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
    server = Server(f"http://{address}")
    try:
        yield server
    finally:
        server.close_clients()
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
        log.close()
