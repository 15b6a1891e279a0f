"""The LLM server's Grafana dashboard reads only metrics a real server exports."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import jsonschema
from llm_server_helpers import Server
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "turboinfer-llm-server.json"
SCHEMA = ROOT / "tests" / "data" / "grafana-dashboard.schema.json"
METRIC_NAME = re.compile(r"\bturboinfer_[a-zA-Z0-9_:]*")


def _exported(text: str) -> set[str]:
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(s.name for s in family.samples)
        if family.type == "counter":
            names.add(f"{family.name}_total")
    return names


def _used(dashboard: dict[str, Any]) -> set[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v.get("query", "") for v in dashboard["templating"]["list"]]
    return {name for expr in exprs for name in METRIC_NAME.findall(expr)}


def test_llm_dashboard_reads_only_exported_metrics(server: Server) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    jsonschema.validate(dashboard, json.loads(SCHEMA.read_text()))
    body = json.dumps({"model": "demo", "prompt": "The module", "max_tokens": 4,
                       "temperature": 0}).encode()
    assert server.post("/v1/completions", body)[0] == 200
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as reply:
        exported = _exported(reply.read().decode())
    missing = _used(dashboard) - exported
    assert not missing, f"the dashboard reads metrics /metrics does not export: {missing}"
