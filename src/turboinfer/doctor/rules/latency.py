"""Where a request's time goes: queued or computing, and the TCP floor under small ones."""

from __future__ import annotations

from turboinfer.doctor.findings import Finding, Outcome, Rule, Severity, Skip
from turboinfer.doctor.inputs import Inputs
from turboinfer.doctor.rules.window import waits_out_the_window
from turboinfer.doctor.server import ServerWindow

TAIL_RATIO = 3.0          # p99 / p50 above this is a tail worth explaining
QUEUE_SHARE = 0.5         # queue time above this share of request time is queueing
MIN_REQUESTS = 20         # fewer requests in a window say nothing about percentiles
# Nagle's algorithm with delayed ACKs holds a small write until the peer ACKs: 40 ms on
# Linux, 200 ms elsewhere. A flat latency at that floor with fast compute is its mark.
NAGLE_MS = (38.0, 48.0)
NAGLE_COMPUTE_MS = 5.0


def _split(server: ServerWindow) -> tuple[float, float] | None:
    if server.queue_mean_ms is None or server.compute_mean_ms is None:
        return None
    return server.queue_mean_ms, server.compute_mean_ms


def _queue_fix(server: ServerWindow) -> str:
    if server.max_batch_size == 0:
        return ("config.yaml: max_batch_size: 8 and dynamic_batching: "
                "{max_queue_delay_ms: 2} (batching is off: every request runs alone)")
    return f"config.yaml: instances: {server.instances + 1}"


def queueing(inputs: Inputs) -> Outcome:
    server = inputs.server
    assert server is not None
    split = _split(server)
    if split is None:
        return Skip("queueing", "the server exports no queue and compute times")
    queue_ms, compute_ms = split
    total = queue_ms + compute_ms
    if server.requests < MIN_REQUESTS or total <= 0 or queue_ms / total < QUEUE_SHARE:
        return None
    if waits_out_the_window(server):
        return None  # the queue is the batch window's own wait: batch_window names it
    pending = "" if server.max_pending is None else f", up to {server.max_pending:g} waiting"
    return Finding(
        rule="queueing", severity=Severity.CRITICAL if queue_ms > 4 * compute_ms
        else Severity.WARNING,
        symptom=f"{server.model}: {server.requests:g} requests in {server.seconds:.0f} s, "
                f"{queue_ms + compute_ms:.2f} ms per request in the server",
        cause="requests wait in the queue longer than they compute",
        evidence=f"queue {queue_ms:.2f} ms vs compute {compute_ms:.2f} ms per request "
                 f"({queue_ms / total:.0%} queued){pending}; max_batch_size "
                 f"{server.max_batch_size}, {server.instances} instance(s)",
        fix=_queue_fix(server))


def tail_ratio(inputs: Inputs) -> Outcome:
    server = inputs.server
    assert server is not None
    if server.request is None:
        return Skip("tail_ratio", "no request-time histogram on /metrics (Triton's "
                                  "counters give averages only)")
    p50, p99 = server.request.p50_ms, server.request.p99_ms
    if server.requests < MIN_REQUESTS or p50 <= 0 or p99 / p50 < TAIL_RATIO:
        return None
    queue_p99 = server.queue.p99_ms if server.queue else None
    compute_p99 = server.compute.p99_ms if server.compute else None
    queued = queue_p99 is not None and compute_p99 is not None and queue_p99 > compute_p99
    return Finding(
        rule="tail_ratio", severity=Severity.WARNING,
        symptom=f"{server.model}: p99 {p99:.2f} ms is {p99 / p50:.1f}x p50 {p50:.2f} ms",
        cause="the tail is queueing" if queued else "the tail is compute jitter",
        evidence=f"queue p99 {_ms(queue_p99)} vs compute p99 {_ms(compute_p99)}",
        fix=_queue_fix(server) if queued else
        "compute varies: see the CPU contention and frequency findings; "
        "config.yaml: engine_settings: {intra_op_threads: 1}")


def _ms(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.2f} ms"


def nagle_floor(inputs: Inputs) -> Outcome:
    report = inputs.load
    assert report is not None
    for run in report.get("runs", []):
        latency, server = run.get("latency", {}), run.get("server") or {}
        p50, p90 = latency.get("p50_ms", 0.0), latency.get("p90_ms", 0.0)
        in_server = server.get("request_ms") or server.get("compute_ms")
        if not (NAGLE_MS[0] <= p50 <= NAGLE_MS[1] and p90 <= NAGLE_MS[1] * 1.1):
            continue
        if in_server is None or in_server > NAGLE_COMPUTE_MS:
            continue
        return Finding(
            rule="nagle_floor", severity=Severity.CRITICAL,
            symptom=f"{run['label']}: latency flat at p50 {p50:.1f} ms, p90 {p90:.1f} ms",
            cause="Nagle's algorithm meets delayed ACK on small requests (a 40 ms floor)",
            evidence=f"the server spends {in_server:.2f} ms per request; the other "
                     f"{p50 - in_server:.1f} ms is the network stack",
            fix="set TCP_NODELAY in the client: "
                "sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)")
    return None


RULES = (
    Rule("queueing", frozenset({"server"}), queueing, "latency"),
    Rule("tail_ratio", frozenset({"server"}), tail_ratio, "latency"),
    Rule("nagle_floor", frozenset({"load"}), nagle_floor, "latency"),
)
