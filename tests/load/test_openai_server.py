"""``turboinfer llm load`` against a real ``turboinfer llm serve`` on 127.0.0.1 (the demo
model), a few requests each; plus a port where nothing listens."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from turboinfer.cli import main

START_TIMEOUT_S = 120.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(proc: subprocess.Popen[str], port: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llm serve exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("llm serve did not start")


@pytest.fixture(scope="module")
def llm_server() -> Iterator[str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "turboinfer", "llm", "serve", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_ready(proc, port)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


def _run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = main(["llm", "load", *argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_completions_stream_every_token(llm_server: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _run_json(capsys, llm_server, "--num-prompts", "4", "--input-len", "32",
                             "--output-len", "8", "--max-concurrency", "2",
                             "--slo", "ttft=60s,tpot=60s")
    s = report["summary"]
    assert code == 0 and report["model"] == "demo"
    assert (s["completed"], s["failed"]) == (4, 0)
    # ignore_eos reaches the server, and the token counts come from its usage chunk.
    assert s["total_output_tokens"] == 4 * 8
    assert s["total_input_tokens"] >= 4 * 32
    assert s["good_requests"] == 4 and s["counted_by_server"] == 4
    for r in report["requests"]:
        assert 0 < r["ttft_ms"] <= r["e2el_ms"]
        assert 1 <= len(r["itl_ms"]) <= 7  # one gap per chunk; a chunk may hold 2 tokens
        assert r["tpot_ms"] == pytest.approx((r["e2el_ms"] - r["ttft_ms"]) / 7)


def test_chat_with_poisson_arrivals(llm_server: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _run_json(capsys, llm_server, "--endpoint", "chat", "--num-prompts", "3",
                             "--input-len", "16", "--output-len", "4",
                             "--request-rate", "20", "--burstiness", "0.5")
    assert code == 0
    assert report["summary"]["completed"] == 3
    assert report["settings"]["request_rate"] == 20.0


def test_server_errors_are_counted_per_request(llm_server: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _run_json(capsys, llm_server, "--model", "no-such-model",
                             "--num-prompts", "2", "--output-len", "2", "--warmup", "0")
    s = report["summary"]
    assert code == 1 and (s["completed"], s["failed"]) == (0, 2)
    [(message, count)] = s["errors"].items()
    assert count == 2 and message.startswith("HTTP 4")


def test_text_table_and_html_report(llm_server: str, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "report.html"
    assert main(["llm", "load", llm_server, "--num-prompts", "2", "--output-len", "4",
                 "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert "TTFT" in out and "TPOT" in out and "2 completed, 0 failed" in out
    html = page.read_text()
    assert "Plotly.newPlot" in html and "<script src=" not in html  # plotly.js inlined


def test_unreachable_server_is_reported_not_raised(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["llm", "load", f"http://127.0.0.1:{_free_port()}", "--num-prompts", "2"])
    captured = capsys.readouterr()
    assert code == 1
    assert "failed: 2 x connection refused" in captured.out
    assert "Traceback" not in captured.err


def test_cli_misuse_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["llm", "load", "http://127.0.0.1:1", "--slo", "speed=fast"]) == 2
    assert main(["llm", "load", "http://127.0.0.1:1", "--extra-body", "[1]"]) == 2
    assert main(["llm", "load", "grpc://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("error: ") for line in err)
