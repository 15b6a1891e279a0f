"""The shipped Grafana dashboards as the tests read them: loaded and checked against the
dashboard schema, and the metric names their queries use next to the names a real
server's /metrics page exports."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
import orjson
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = ROOT / "deploy" / "grafana"
SCHEMA = ROOT / "tests" / "data" / "grafana-dashboard.schema.json"
# A metric name in PromQL: our prefix, then name characters (label names are not
# prefixed, functions and keywords are not ours).
METRIC_NAME = re.compile(r"\bturboinfer_[a-zA-Z0-9_:]*")


def load_dashboard(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads((DASHBOARDS / name).read_bytes())
    jsonschema.validate(doc, orjson.loads(SCHEMA.read_bytes()))
    return doc


def exported_names(text: str) -> set[str]:
    """Every sample name in a /metrics page, and every declared family's sample names."""
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(s.name for s in family.samples)
        if family.type == "counter":
            names.add(f"{family.name}_total")
    return names


def used_names(dashboard: dict[str, Any]) -> set[str]:
    """The metric names the dashboard's panel queries and template variables read."""
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v.get("query", "") for v in dashboard["templating"]["list"]]
    return {name for expr in exprs for name in METRIC_NAME.findall(expr)}
