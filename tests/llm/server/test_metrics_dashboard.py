"""The LLM server's Grafana dashboard reads only metrics a real server exports."""

from __future__ import annotations

import json
import urllib.request

from llm_server_helpers import Server

from dashboards import exported_names, load_dashboard, used_names


def test_llm_dashboard_reads_only_exported_metrics(server: Server) -> None:
    dashboard = load_dashboard("turboinfer-llm-server.json")
    body = json.dumps({"model": "demo", "prompt": "The module", "max_tokens": 4,
                       "temperature": 0}).encode()
    assert server.post("/v1/completions", body)[0] == 200
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as reply:
        exported = exported_names(reply.read().decode())
    missing = used_names(dashboard) - exported
    assert not missing, f"the dashboard reads metrics /metrics does not export: {missing}"
