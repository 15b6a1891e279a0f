"""The server refuses (400) a request its engine's KV cache can never hold."""

from __future__ import annotations

import json
from pathlib import Path

from llm_server_helpers import launch


def test_a_request_past_the_kv_cache_is_a_400_not_an_oom(tmp_path: Path) -> None:
    # A 32-token KV cache (two blocks of 16): the memory plan's budget, tiny on purpose.
    with launch(tmp_path, "--kv-cache-tokens", "32") as server:
        assert server.get_json("/health")["kv_total_blocks"] == 2
        body = json.dumps({"model": "demo", "prompt": "def main():", "max_tokens": 100})
        status, _, reply = server.post("/v1/completions", body.encode())
        assert status == 400
        assert "holds 32 tokens" in reply["error"]["message"]
        assert reply["error"]["param"] == "max_tokens"
        ok = json.dumps({"model": "demo", "prompt": "def main():", "max_tokens": 4,
                         "temperature": 0})
        status, _, raw = server.post("/v1/completions", ok.encode())
        assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 4
