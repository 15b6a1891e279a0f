"""A batch window that waits for batches that never fill.

With a fixed queue delay a few closed-loop clients are slower than one: their requests
arrive together, the batch waits out the delay for more that cannot come, and every
request pays the delay (346 req/s at 2 clients against 1,571 at 1 on a small CNN with a
5 ms delay). Its mark on /metrics: queue time close to the delay while batches stay far
below max_batch_size. Adding instances or a longer delay (what the queueing and batch
rules would say of the queue and the small batches) makes it worse; the delay itself is
the cost.
"""

from __future__ import annotations

from turboinfer.doctor.findings import Finding, Outcome, Rule, Severity
from turboinfer.doctor.inputs import Inputs
from turboinfer.doctor.server import ServerWindow

DELAY_SHARE = 0.5          # queue time above this share of the delay: the window is paid
SMALL_BATCH = 0.5          # average batch below this share of max_batch_size: no filling
MIN_WINDOW_REQUESTS = 20   # fewer requests in a window say nothing


def waits_out_the_window(server: ServerWindow) -> bool:
    """Requests wait about the whole delay for batches that stay small."""
    delay, queue, batch = server.max_queue_delay_ms, server.queue_mean_ms, server.avg_batch
    if (not delay or queue is None or batch is None or server.max_batch_size <= 0
            or server.requests < MIN_WINDOW_REQUESTS):
        return False
    return queue >= DELAY_SHARE * delay and batch < SMALL_BATCH * server.max_batch_size


def proposed_delay_ms(delay_ms: float, compute_ms: float | None) -> float:
    """A delay below the one in force: about one batch's compute (a wait longer than the
    batch it saves does not pay at these batch sizes), at most a quarter of today's;
    under 0.05 ms it is 0, no wait at all."""
    proposal = delay_ms / 4 if compute_ms is None else min(compute_ms, delay_ms / 4)
    return round(proposal, 2) if proposal >= 0.05 else 0.0


def batch_window(inputs: Inputs) -> Outcome:
    server = inputs.server
    assert server is not None
    if not waits_out_the_window(server):
        return None
    delay = server.max_queue_delay_ms or 0.0
    queue, batch = server.queue_mean_ms or 0.0, server.avg_batch or 0.0
    compute = server.compute_mean_ms
    new = proposed_delay_ms(delay, compute)
    pending = "" if server.max_pending is None else f", at most {server.max_pending:g} pending"
    ran = "" if compute is None else f"; a batch computes in {compute:.2f} ms"
    rate = server.requests / server.seconds if server.seconds > 0 else 0.0
    return Finding(
        rule="batch_window", severity=Severity.CRITICAL if compute is not None
        and queue > 4 * compute else Severity.WARNING,
        symptom=f"{server.model}: {rate:.0f} requests/s, each queued {queue:.2f} ms of a "
                f"{delay:g} ms batch window",
        cause="the batch window waits for batches that never fill: the delay itself is "
              "the cost",
        evidence=f"queue {queue:.2f} ms per request against max_queue_delay {delay:g} ms "
                 f"while batches averaged {batch:.2f} rows of max_batch_size "
                 f"{server.max_batch_size}{pending}{ran}",
        fix=f"config.yaml: dynamic_batching: {{max_queue_delay_ms: {new:g}}} (from {delay:g}; "
            "the clients' requests already arrive together)")


RULES = (Rule("batch_window", frozenset({"server"}), batch_window, "batching"),)
