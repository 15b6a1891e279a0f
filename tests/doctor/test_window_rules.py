"""Rules over a server window and a load report that this machine cannot provoke on
demand, judged on recorded figures: the tail split into queue and compute, and the
Nagle / delayed-ACK floor (Linux's 40 ms delayed ACK does not show reliably on
loopback, where the first segments of a connection are acknowledged at once)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from turboinfer.doctor import Finding, Inputs
from turboinfer.doctor.rules import batching, latency
from turboinfer.doctor.server import Percentiles, ServerWindow

WINDOW = ServerWindow(
    url="http://127.0.0.1:8000", model="resnet18", seconds=30.0, requests=900.0,
    failures=0.0, request=Percentiles(p50_ms=12.0, p99_ms=61.0, mean_ms=15.0),
    queue=Percentiles(p50_ms=0.3, p99_ms=48.0, mean_ms=3.0),
    compute=Percentiles(p50_ms=11.5, p99_ms=14.0, mean_ms=12.0), queue_mean_ms=3.0,
    compute_mean_ms=12.0, avg_batch=1.0, max_batch_size=0, batch_efficiency=None,
    max_pending=5.0, cpu_cores=1.6, instances=1)


def test_a_queued_tail_is_split_from_compute() -> None:
    finding = latency.tail_ratio(Inputs(server=WINDOW))
    assert isinstance(finding, Finding)
    assert finding.symptom == "resnet18: p99 61.00 ms is 5.1x p50 12.00 ms"
    assert finding.cause == "the tail is queueing"
    assert finding.evidence == "queue p99 48.00 ms vs compute p99 14.00 ms"
    assert finding.fix.startswith("config.yaml: max_batch_size: 8")  # batching is off


def test_a_compute_tail_points_at_the_cpu() -> None:
    jitter = replace(WINDOW, queue=Percentiles(0.2, 1.0, 0.3),
                     compute=Percentiles(11.5, 58.0, 14.0))
    finding = latency.tail_ratio(Inputs(server=jitter))
    assert isinstance(finding, Finding)
    assert finding.cause == "the tail is compute jitter"
    assert finding.evidence == "queue p99 1.00 ms vs compute p99 58.00 ms"
    assert "intra_op_threads" in finding.fix


def test_a_steady_tail_passes() -> None:
    steady = replace(WINDOW, request=Percentiles(12.0, 20.0, 13.0))
    assert latency.tail_ratio(Inputs(server=steady)) is None


def _load(p50: float, p90: float, in_server: float) -> dict[str, Any]:
    return {"url": "http://127.0.0.1:8000", "model": "linear", "scenario": "concurrency",
            "runs": [{"label": "concurrency 1", "qps": 24.6, "client_cpu": 0.02,
                      "latency": {"p50_ms": p50, "p90_ms": p90, "p99_ms": p90 + 0.5},
                      "server": {"request_ms": in_server, "queue_ms": 0.01,
                                 "cpu_cores": 0.01}}]}


def test_the_delayed_ack_floor_is_named() -> None:
    finding = latency.nagle_floor(Inputs(load=_load(40.4, 41.2, 0.35)))
    assert isinstance(finding, Finding)
    assert finding.symptom == "concurrency 1: latency flat at p50 40.4 ms, p90 41.2 ms"
    assert finding.evidence == ("the server spends 0.35 ms per request; the other 40.0 ms "
                                "is the network stack")
    assert "TCP_NODELAY" in finding.fix


def test_forty_ms_of_real_compute_is_not_nagle() -> None:
    assert latency.nagle_floor(Inputs(load=_load(40.4, 41.2, 39.0))) is None
    assert latency.nagle_floor(Inputs(load=_load(2.1, 2.5, 0.35))) is None


def test_a_busy_server_is_not_client_bound() -> None:
    # 900 requests x 15 ms in 30 s: busy 45% of the window, five waiting at a time.
    assert batching.client_bound(Inputs(server=WINDOW)) is None
    idle = replace(WINDOW, requests=60.0, max_pending=0.0, queue_mean_ms=0.1)
    finding = batching.client_bound(Inputs(server=idle))
    assert isinstance(finding, Finding)
    assert finding.symptom == "resnet18: 2.0 requests/s kept the server busy 3% of 30 s"
