"""The golden metrics of a real ``turboinfer serve`` on builtin:digits-cnn, and the
Grafana dashboard checked against Grafana's dashboard model and the real /metrics."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dashboards import exported_names, load_dashboard, used_names
from turboinfer.models import resolve_model
from turboinfer.serve.metrics import weight_bytes

if TYPE_CHECKING:
    from conftest import Server

pytestmark = pytest.mark.slow  # the first run trains and exports digits-cnn

MODEL = "digits-cnn"
REQUESTS = 12


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory,
            launch: Callable[..., Server]) -> Iterator[str]:
    """/metrics after a few good requests and one bad one (so failures have a series)."""
    log = tmp_path_factory.mktemp("golden") / "server.log"
    server = launch(None, log, "--zoo-models", MODEL, timeout=600, cli=True)
    try:
        model = resolve_model(f"builtin:{MODEL}")
        assert model.entry is not None
        x = model.entry.example_inputs(2)["input"]
        good = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                            "data": x.ravel().tolist()}]}
        for _ in range(REQUESTS):
            assert server.post_json(f"/v2/models/{MODEL}/infer", good)[0] == 200
        bad = {"inputs": [{**good["inputs"][0], "datatype": "INT32",  # type: ignore[dict-item]
                           "data": [0] * x.size}]}
        assert server.post_json(f"/v2/models/{MODEL}/infer", bad)[0] == 400
        status, body = server.request("GET", "/metrics")
        assert status == 200
        yield body.decode()
    finally:
        assert server.stop() == 0


def _values(text: str) -> dict[str, float]:
    """``name{model="digits-cnn"}`` -> value, for this model's samples and global ones."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model", MODEL) == MODEL and "le" not in sample.labels \
                    and "reason" not in sample.labels:
                out[sample.name] = sample.value
    return out


def test_golden_metrics_are_exported_with_consistent_values(scraped: str) -> None:
    v = _values(scraped)
    assert v["turboinfer_request_duration_seconds_count"] == REQUESTS
    assert v["turboinfer_usable_cores"] >= 1
    assert v["turboinfer_cpu_utilisation_seconds_total"] > 0
    executions, rows = v["turboinfer_execution_total"], v["turboinfer_inference_total"]
    max_batch = v["turboinfer_max_batch_size"]
    assert max_batch > 0
    assert v["turboinfer_batch_efficiency"] == pytest.approx(rows / executions / max_batch)
    assert 0 < v["turboinfer_batch_efficiency"] <= 1
    model_file = resolve_model(f"builtin:{MODEL}").artifact.onnx_path
    assert v["turboinfer_model_weight_bytes"] == weight_bytes(model_file) > 0
    assert v["turboinfer_weight_bytes_read_total"] == (
        executions * v["turboinfer_model_weight_bytes"])


def test_failures_keep_their_reason(scraped: str) -> None:
    assert ('turboinfer_request_failure_total{model="digits-cnn",reason="invalid_input",'
            'version="1"} 1.0') in scraped


@pytest.mark.parametrize("name", ["turboinfer-server.json", "turboinfer-llm-server.json"])
def test_dashboards_follow_grafanas_model(name: str) -> None:
    doc = load_dashboard(name)
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in doc["panels"])
    assert used_names(doc)


def test_server_dashboard_reads_only_exported_metrics(scraped: str) -> None:
    doc = load_dashboard("turboinfer-server.json")
    missing = used_names(doc) - exported_names(scraped)
    assert not missing, f"the dashboard reads metrics /metrics does not export: {missing}"
    titles = " ".join(p["title"] for p in doc["panels"]).lower()
    for wanted in ("requests per second", "p99", "batch size", "queue", "utilisation",
                   "errors"):
        assert wanted in titles
    exprs = " ".join(t["expr"] for p in doc["panels"] for t in p["targets"])
    assert "histogram_quantile(0.99" in exprs
