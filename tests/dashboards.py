"""The shipped Grafana dashboards as the tests read them: loaded and checked against the
dashboard schema (tests/data/grafana-dashboard.schema.json: Grafana's own key lists,
typed) and for what a schema cannot say (panels that overlap, ids and refIds used twice,
unbalanced PromQL), and the metric names their queries use next to the names a real
server's /metrics page exports.

No JSON schema of Grafana's dashboard model is published on PyPI: grafana-foundation-sdk
ships typed Python models whose ``from_json`` accepts any value, so the schema here is
written by hand from those models' keys."""

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


GRID_COLUMNS = 24
BRACKETS = {")": "(", "]": "[", "}": "{"}


def load_dashboard(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads((DASHBOARDS / name).read_bytes())
    check_dashboard(doc)
    return doc


def check_dashboard(doc: dict[str, Any]) -> None:
    """Raise (jsonschema.ValidationError or ValueError) naming what is wrong."""
    jsonschema.validate(doc, orjson.loads(SCHEMA.read_bytes()))
    panels = doc["panels"]
    ids = [p["id"] for p in panels]
    if len(ids) != len(set(ids)):
        raise ValueError(f"panel ids used twice: {sorted(i for i in ids if ids.count(i) > 1)}")
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        grid, title = panel["gridPos"], panel["title"]
        if grid["x"] + grid["w"] > GRID_COLUMNS:
            raise ValueError(f"{title!r} reaches past column {GRID_COLUMNS}")
        for cell in ((x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                     for y in range(grid["y"], grid["y"] + grid["h"])):
            if cell in cells:
                raise ValueError(f"{title!r} overlaps {cells[cell]!r} at {cell}")
            cells[cell] = title
        refs = [t["refId"] for t in panel["targets"]]
        if len(refs) != len(set(refs)):
            raise ValueError(f"{title!r} uses a refId twice: {refs}")
        for target in panel["targets"]:
            _check_brackets(target["expr"], title)


def _check_brackets(expr: str, title: str) -> None:
    """PromQL's brackets balance outside string literals."""
    stack: list[str] = []
    quoted = False
    for char in expr:
        if char == '"':
            quoted = not quoted
        elif quoted:
            continue
        elif char in "([{":
            stack.append(char)
        elif char in BRACKETS and (not stack or stack.pop() != BRACKETS[char]):
            raise ValueError(f"{title!r}: unbalanced {char!r} in {expr!r}")
    if stack or quoted:
        raise ValueError(f"{title!r}: unclosed {stack[-1] if stack else chr(34)!r} in {expr!r}")


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
