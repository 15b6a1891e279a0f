"""Serving batching settings derived from a measured latency-vs-batch curve.

A request may arrive just after a batch started: it waits for that batch, then for the
queue window, then for its own batch. So a batch size ``b`` fits the SLO when
``2 * p99(b) + max_queue_delay <= slo``. Among the sizes that fit, the one with the
highest throughput wins; the queue window gets what the SLO leaves, capped at one batch
time, since waiting longer than a batch takes cannot fill a batch any faster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CurvePoint:
    batch_size: int
    p50_ms: float
    p99_ms: float
    qps: float  # samples per second at this batch size

    def to_dict(self) -> dict[str, float]:
        return {"batch_size": self.batch_size, "p50_ms": self.p50_ms, "p99_ms": self.p99_ms,
                "qps": self.qps}


@dataclass(frozen=True)
class BatchingPlan:
    max_batch_size: int  # 0: no batching, each request runs alone
    max_queue_delay_ms: float
    qps: float
    p99_ms: float  # worst case for one request under the plan (batch time, no queue)
    meets_slo: bool

    def to_dict(self) -> dict[str, float | int | bool]:
        return {"max_batch_size": self.max_batch_size,
                "max_queue_delay_ms": self.max_queue_delay_ms, "qps": self.qps,
                "p99_ms": self.p99_ms, "meets_slo": self.meets_slo}


def plan_batching(curve: Sequence[CurvePoint], slo_ms: float) -> BatchingPlan:
    """The highest-throughput batching that keeps a request inside ``slo_ms``."""
    if not curve:
        raise ValueError("no measured batch sizes")
    by_size = sorted(curve, key=lambda p: p.batch_size)
    fitting = [p for p in by_size if p.batch_size > 1 and 2 * p.p99_ms <= slo_ms]
    single = by_size[0]
    if fitting:
        best = max(fitting, key=lambda p: p.qps)
        if best.qps > single.qps:
            delay = round(min(slo_ms - 2 * best.p99_ms, best.p99_ms), 3)
            return BatchingPlan(best.batch_size, delay, best.qps, best.p99_ms, True)
    return BatchingPlan(0, 0.0, single.qps, single.p99_ms, single.p99_ms <= slo_ms)
