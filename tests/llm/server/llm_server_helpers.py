"""The running server as the tests see it: its URL, an ``openai`` client, raw requests."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import openai

API_KEY = "sk-test-key"
KV_CACHE_TOKENS = 4096
MAX_NUM_SEQS = 8
MAX_WAITING = 8


@dataclass(frozen=True)
class Server:
    url: str

    def client(self, **options: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=API_KEY, **options)

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
