"""Batching that does not form, and a client that cannot keep the server busy."""

from __future__ import annotations

from typing import Any

from turboinfer.doctor.findings import Finding, Outcome, Rule, Severity
from turboinfer.doctor.inputs import Inputs
from turboinfer.doctor.rules.latency import MIN_REQUESTS, QUEUE_SHARE
from turboinfer.doctor.rules.window import waits_out_the_window
from turboinfer.doctor.server import ServerWindow

LOW_EFFICIENCY = 0.5       # average batch / max batch
CLIENT_CPU = 0.9           # of one core: the load generator is saturated
SEND_LAG_MS = 5.0          # an open loop's p99 lateness
IDLE_QUEUE_SHARE = 0.1     # queue under this share of server time: nothing waits
BUSY_SHARE = 0.3           # of the window's instance time spent on requests


def batch_efficiency(inputs: Inputs) -> Outcome:
    server = inputs.server
    assert server is not None
    if (server.max_batch_size == 0 or server.batch_efficiency is None
            or server.batch_efficiency >= LOW_EFFICIENCY or not server.max_pending
            or waits_out_the_window(server)):  # then the window is the cause (batch_window)
        return None
    # A longer wait than the one in force, never the configuration already set.
    in_force = server.max_queue_delay_ms or 0.0
    delay = f"dynamic_batching: {{max_queue_delay_ms: {max(5.0, 2 * in_force):g}}}"
    return Finding(
        rule="batch_efficiency", severity=Severity.WARNING,
        symptom=f"{server.model}: average batch {server.avg_batch:.2f} of "
                f"max_batch_size {server.max_batch_size} ({server.batch_efficiency:.0%})",
        cause="requests wait, yet batches stay small: the batcher does not wait to fill",
        evidence=f"up to {server.max_pending:g} requests pending while batches averaged "
                 f"{server.avg_batch:.2f} rows",
        fix=f"config.yaml: {delay} (and preferred_batch_sizes: [{server.max_batch_size}])")


def client_bound(inputs: Inputs) -> Outcome:
    """The client sets the pace: seen from the load report (its CPU, its lateness) or
    from the server's window (mostly idle, nothing queued)."""
    found = _client_saturated(inputs.load) if inputs.load is not None else None
    if found is None and inputs.server is not None:
        found = _server_waits(inputs.server)
    return found


def _client_saturated(report: dict[str, Any]) -> Outcome:
    for run in report.get("runs", []):
        cpu, lag = run.get("client_cpu", 0.0), run.get("send_lag_p99_ms")
        server = run.get("server") or {}
        queue, request = server.get("queue_ms"), server.get("request_ms")
        if cpu < CLIENT_CPU and (lag is None or lag < SEND_LAG_MS):
            continue
        if queue is not None and request and queue / request > IDLE_QUEUE_SHARE:
            continue  # requests wait in the server: it is the server that is behind
        idle = ("" if queue is None else f"; the server queued {queue:.2f} ms per request "
                f"and used {server.get('cpu_cores') or 0:.2f} cores")
        late = "" if lag is None else f", sends {lag:.1f} ms late (p99)"
        return Finding(
            rule="client_bound", severity=Severity.WARNING,
            symptom=f"{run['label']}: {run.get('qps', 0):.0f} requests/s",
            cause="the client, not the server, sets the pace",
            evidence=f"load generator at {cpu:.0%} of a core{late}{idle}",
            fix=f"turboinfer load {report.get('url', 'URL')} --model {report.get('model', 'M')} "
                "--protocol grpc (cheaper per request), or run the client on another machine")
    return None


def _server_waits(server: ServerWindow) -> Outcome:
    """Low utilisation with an empty queue: every request is served at once and the
    server then waits for the next. Whoever sends them (one slow client, pre-processing
    on the request path) is what limits the throughput."""
    request = server.request.mean_ms if server.request else server.compute_mean_ms
    if request is None or server.requests < MIN_REQUESTS or server.seconds <= 0:
        return None
    busy = server.requests * request / 1e3 / (server.seconds * max(1, server.instances))
    queue, pending = server.queue_mean_ms or 0.0, server.max_pending or 0.0
    # Nothing waits behind anything: at most one request in at a time, and the queue time
    # (a hand-off, with one request in) short of what the queueing rule calls queueing.
    if busy >= BUSY_SHARE or pending > 1 or queue >= QUEUE_SHARE * request:
        return None
    rate = server.requests / server.seconds
    return Finding(
        rule="client_bound", severity=Severity.INFO,
        symptom=f"{server.model}: {rate:.1f} requests/s kept the server busy {busy:.0%} "
                f"of {server.seconds:.0f} s",
        cause="the server waits for work: the client (or its pre-processing) sets the pace",
        evidence=f"{request:.2f} ms per request in the server, one every "
                 f"{1e3 / rate:.1f} ms; queue {queue:.2f} ms, at most {pending:g} pending; "
                 f"the server used {server.cpu_cores or 0:.2f} cores",
        fix=f"send more at once: turboinfer load {server.url} --model {server.model} "
            "--scenario concurrency --concurrency 1,4,16 shows what the server takes; "
            "move pre-processing off the request path or run more client processes")


RULES = (
    Rule("batch_efficiency", frozenset({"server"}), batch_efficiency, "batching"),
    Rule("client_bound", frozenset({"load", "server"}), client_bound, "batching"),
)
