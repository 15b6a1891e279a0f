"""The dashboard check catches the mistakes that break a dashboard in Grafana: a key
Grafana does not know, a query without PromQL or a datasource pinned to one Grafana's
uid, a heatmap fed time series, panels on top of each other, unbalanced PromQL."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest

from dashboards import check_dashboard, load_dashboard

Doc = dict[str, Any]


def _set(path: str, value: Any) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        node[int(last) if last.isdigit() else last] = value
    return mutate


def _drop(path: str) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        del node[last]
    return mutate


BROKEN = {
    "a misspelt panel key": _set("panels.0.gridpos", {"x": 0, "y": 0, "w": 1, "h": 1}),
    "an unknown dashboard key": _set("dashboard", {}),
    "a removed panel type": _set("panels.0.type", "graph"),
    "a query without expr": _drop("panels.0.targets.0.expr"),
    "a query reading no metric": _set("panels.0.targets.0.expr", "vector(1)"),
    "a datasource pinned to one Grafana": _set("panels.0.datasource.uid", "P1809F7CD0C75ACF3"),
    "a gridPos past the grid": _set("panels.0.gridPos.x", 24),
    "a gridPos key Grafana does not know": _set("panels.0.gridPos.z", 1),
    "a panel without a unit": _drop("panels.0.fieldConfig"),
    "a heatmap fed time series": _set("panels.5.targets.0.format", "time_series"),
    "two panels on one spot": _set("panels.1.gridPos", {"x": 6, "y": 0, "w": 12, "h": 8}),
    "a panel id used twice": _set("panels.1.id", 1),
    "a refId used twice": lambda doc: doc["panels"][2]["targets"][1].update(refId="A"),
    "unbalanced PromQL": _set("panels.0.targets.0.expr", "sum(rate(turboinfer_x[1m])"),
}


@pytest.fixture(scope="module")
def server_dashboard() -> Doc:
    return load_dashboard("turboinfer-server.json")


@pytest.mark.parametrize("mistake", sorted(BROKEN))
def test_each_mistake_is_refused(server_dashboard: Doc, mistake: str) -> None:
    doc = copy.deepcopy(server_dashboard)
    assert doc["panels"][5]["type"] == "heatmap"
    BROKEN[mistake](doc)
    with pytest.raises((jsonschema.ValidationError, ValueError)):
        check_dashboard(doc)


def test_the_shipped_dashboards_pass_and_keep_their_panels(server_dashboard: Doc) -> None:
    titles = [p["title"] for p in server_dashboard["panels"]]
    for wanted in ("Requests per second", "Request latency p50 / p90 / p99",
                   "Batch size distribution", "Queue time p50 / p99",
                   "CPU utilisation (share of usable cores)", "GPU SM utilisation",
                   "GPU memory in use", "CPU wait per CPU second (contention)"):
        assert wanted in titles
    check_dashboard(load_dashboard("turboinfer-llm-server.json"))
