"""Batching that does not form, and a client that cannot keep the server busy."""

from __future__ import annotations

from turboinfer.doctor.findings import Finding, Outcome, Rule, Severity
from turboinfer.doctor.inputs import Inputs

LOW_EFFICIENCY = 0.5       # average batch / max batch
CLIENT_CPU = 0.9           # of one core: the load generator is saturated
SEND_LAG_MS = 5.0          # an open loop's p99 lateness
IDLE_QUEUE_SHARE = 0.1     # queue under this share of server time: nothing waits


def batch_efficiency(inputs: Inputs) -> Outcome:
    server = inputs.server
    assert server is not None
    if (server.max_batch_size == 0 or server.batch_efficiency is None
            or server.batch_efficiency >= LOW_EFFICIENCY or not server.max_pending):
        return None
    delay = "dynamic_batching: {max_queue_delay_ms: 5}"
    return Finding(
        rule="batch_efficiency", severity=Severity.WARNING,
        symptom=f"{server.model}: average batch {server.avg_batch:.2f} of "
                f"max_batch_size {server.max_batch_size} ({server.batch_efficiency:.0%})",
        cause="requests wait, yet batches stay small: the batcher does not wait to fill",
        evidence=f"up to {server.max_pending:g} requests pending while batches averaged "
                 f"{server.avg_batch:.2f} rows",
        fix=f"config.yaml: {delay} (and preferred_batch_sizes: [{server.max_batch_size}])")


def client_bound(inputs: Inputs) -> Outcome:
    report = inputs.load
    assert report is not None
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


RULES = (
    Rule("batch_efficiency", frozenset({"server"}), batch_efficiency, "batching"),
    Rule("client_bound", frozenset({"load"}), client_bound, "batching"),
)
