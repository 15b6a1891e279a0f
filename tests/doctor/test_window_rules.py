"""Rules over a server window and a load report that this machine cannot provoke on
demand, judged on recorded figures: the tail split into queue and compute, and the
Nagle / delayed-ACK floor (Linux's 40 ms delayed ACK does not show reliably on
loopback, where the first segments of a connection are acknowledged at once)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from turboinfer.doctor import Finding, Inputs
from turboinfer.doctor.rules import batching, latency, window
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


# digits-cnn behind a fixed 5 ms window, 2 closed-loop clients (the figures of a real
# 30 s window: 357 requests/s, queue 4.22 ms against compute 0.33 ms, batches of 2).
FIXED_WINDOW = replace(
    WINDOW, model="digits-cnn", requests=357.0 * 30, queue_mean_ms=4.22, compute_mean_ms=0.33,
    request=Percentiles(p50_ms=4.9, p99_ms=5.6, mean_ms=4.8),
    queue=Percentiles(p50_ms=4.5, p99_ms=5.0, mean_ms=4.22),
    compute=Percentiles(p50_ms=0.3, p99_ms=0.5, mean_ms=0.33), avg_batch=2.0,
    max_batch_size=32, batch_efficiency=2.0 / 32, max_pending=2.0, cpu_cores=0.3,
    max_queue_delay_ms=5.0)


def test_a_window_that_waits_for_batches_that_never_fill_is_named() -> None:
    finding = window.batch_window(Inputs(server=FIXED_WINDOW))
    assert isinstance(finding, Finding)
    assert finding.rule == "batch_window"
    assert finding.evidence == ("queue 4.22 ms per request against max_queue_delay 5 ms "
                                "while batches averaged 2.00 rows of max_batch_size 32, "
                                "at most 2 pending; a batch computes in 0.33 ms")
    # The fix lowers the delay; it never proposes the one in force.
    assert finding.fix.startswith("config.yaml: dynamic_batching: {max_queue_delay_ms: 0.33}")
    # Neither more instances nor a (longer) delay: the other rules leave it to this one.
    assert latency.queueing(Inputs(server=FIXED_WINDOW)) is None
    assert batching.batch_efficiency(Inputs(server=FIXED_WINDOW)) is None


def test_a_window_whose_batches_fill_passes() -> None:
    filling = replace(FIXED_WINDOW, avg_batch=28.0, batch_efficiency=28.0 / 32)
    assert window.batch_window(Inputs(server=filling)) is None
    no_delay = replace(FIXED_WINDOW, max_queue_delay_ms=0.0)
    assert window.batch_window(Inputs(server=no_delay)) is None
    unknown = replace(FIXED_WINDOW, max_queue_delay_ms=None)
    assert window.batch_window(Inputs(server=unknown)) is None


def test_small_batches_without_waiting_propose_a_delay_not_in_force() -> None:
    """Queue short against the delay: the batcher did not wait; a longer wait than the
    one set is proposed, never the same."""
    short_queue = replace(FIXED_WINDOW, queue_mean_ms=0.4, max_pending=6.0)
    assert window.batch_window(Inputs(server=short_queue)) is None
    finding = batching.batch_efficiency(Inputs(server=short_queue))
    assert isinstance(finding, Finding)
    assert finding.fix.startswith("config.yaml: dynamic_batching: {max_queue_delay_ms: 10}")
    unset = replace(short_queue, max_queue_delay_ms=0.0)
    finding = batching.batch_efficiency(Inputs(server=unset))
    assert isinstance(finding, Finding)
    assert finding.fix.startswith("config.yaml: dynamic_batching: {max_queue_delay_ms: 5}")


def test_the_proposed_delay_is_below_the_one_in_force() -> None:
    assert window.proposed_delay_ms(5.0, 0.33) == 0.33
    assert window.proposed_delay_ms(5.0, 9.0) == 1.25  # at most a quarter of today's
    assert window.proposed_delay_ms(5.0, None) == 1.25
    assert window.proposed_delay_ms(0.1, 0.02) == 0.0
