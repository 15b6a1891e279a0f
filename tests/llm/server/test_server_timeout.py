"""``--request-timeout`` through a real server: a request that runs longer is aborted, its
KV blocks come back, and the client is told how it ended — 504 before the answer started,
an SSE error event once the stream had started."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import pytest
from llm_server_helpers import API_KEY, Server, launch

# The demo model holds 512 tokens; 500 take 0.35-0.7 s to make on its native step, 3-7
# times the timeout, while the first comes within milliseconds.
LONG = {"model": "demo", "prompt": "The module", "max_tokens": 500, "temperature": 0,
        "ignore_eos": True}
TIMEOUT_S = 0.1


@pytest.fixture(scope="module")
def short_timeout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with launch(tmp_path_factory.mktemp("llm_timeout"), "--request-timeout",
                str(TIMEOUT_S), "--kv-cache-tokens", "8192") as running:
        yield running


def test_a_request_over_the_timeout_gets_504(short_timeout: Server) -> None:
    status, _, body = short_timeout.post("/v1/completions", json.dumps(LONG).encode())
    assert status == 504, body
    assert set(body["error"]) >= {"message", "type", "param", "code"}
    assert "timeout" in body["error"]["message"] or "longer" in body["error"]["message"]
    health = short_timeout.wait_idle()
    assert health["kv_free_blocks"] == health["kv_total_blocks"]


def test_a_stream_over_the_timeout_ends_with_an_error_event(short_timeout: Server) -> None:
    request = urllib.request.Request(
        f"{short_timeout.url}/v1/completions", json.dumps({**LONG, "stream": True}).encode(),
        {"content-type": "application/json", "authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        assert reply.status == 200
        events = [line[len(b"data: "):].strip() for line in reply
                  if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["text"], "the stream started before the timeout"
    assert "error" in chunks[-1] and chunks[-1]["error"]["message"]
    assert all("error" not in c for c in chunks[:-1])
    health = short_timeout.wait_idle()
    assert health["kv_free_blocks"] == health["kv_total_blocks"]
    # The server keeps serving after a timed-out request.
    status, _, body = short_timeout.post("/v1/completions", json.dumps(
        {"model": "demo", "prompt": "The module", "max_tokens": 4}).encode())
    assert status == 200, body
