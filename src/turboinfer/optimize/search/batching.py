"""Serving batching settings derived from a measured latency-vs-batch curve.

A request may arrive just after a batch started: it waits for that batch, then for the
queue window, then for its own batch. So a batch size ``b`` fits the SLO when
``2 * p99(b) + max_queue_delay <= slo``. The queue window gets what the SLO leaves,
capped at one batch time, since waiting longer than a batch takes cannot fill a batch any
faster.

Each point of the curve is measured in several rounds (``rounds.py``), so it carries an
interval for p99 and for throughput. Decisions act only on differences beyond that noise:
- a size misses the SLO only when the low end of its p99 interval is over the limit;
- batching is used only when the best fitting size is clearly faster than batch 1;
- among fitting sizes whose throughput is within noise of the best, the smallest wins.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from turboinfer.bench.stats import Spread

# Throughput differences under this fraction are never acted on, however tight the
# intervals of one run: between runs on a shared machine, medians drift by about this much.
NOISE_FLOOR = 0.05


@dataclass(frozen=True)
class CurvePoint:
    batch_size: int
    p50_ms: float
    p99_ms: float  # the median over rounds when ``p99`` is given
    qps: float  # samples per second at this batch size; median over rounds likewise
    p99: Spread | None = None  # per-round p99 spread; None: one measurement
    throughput: Spread | None = None  # per-round samples/s spread

    @property
    def p99_spread(self) -> Spread:
        return self.p99 or Spread(self.p99_ms, self.p99_ms, self.p99_ms, 1)

    @property
    def qps_spread(self) -> Spread:
        return self.throughput or Spread(self.qps, self.qps, self.qps, 1)

    def to_dict(self) -> dict[str, float]:
        p99, qps = self.p99_spread, self.qps_spread
        return {"batch_size": self.batch_size, "p50_ms": self.p50_ms, "p99_ms": self.p99_ms,
                "qps": self.qps, "p99_low_ms": p99.low, "p99_high_ms": p99.high,
                "qps_low": qps.low, "qps_high": qps.high, "rounds": p99.rounds}


@dataclass(frozen=True)
class BatchingPlan:
    max_batch_size: int  # 0: no batching, each request runs alone
    max_queue_delay_ms: float
    qps: float
    p99_ms: float  # worst case for one request under the plan (batch time, no queue)
    meets_slo: bool
    qps_spread: Spread | None = None  # of the planned batch size
    p99_spread: Spread | None = None
    reason: str = ""  # the rule that fixed the batch size

    @property
    def throughput(self) -> Spread:
        return self.qps_spread or Spread(self.qps, self.qps, self.qps, 1)

    def to_dict(self) -> dict[str, float | int | bool | str]:
        qps = self.throughput
        p99 = self.p99_spread or Spread(self.p99_ms, self.p99_ms, self.p99_ms, 1)
        return {"max_batch_size": self.max_batch_size,
                "max_queue_delay_ms": self.max_queue_delay_ms, "qps": self.qps,
                "p99_ms": self.p99_ms, "meets_slo": self.meets_slo,
                "qps_low": qps.low, "qps_high": qps.high, "p99_low_ms": p99.low,
                "p99_high_ms": p99.high, "reason": self.reason}


def plan_batching(curve: Sequence[CurvePoint], slo_ms: float,
                  floor: float = NOISE_FLOOR) -> BatchingPlan:
    """The highest-throughput batching that keeps a request inside ``slo_ms``, preferring
    the smaller batch when throughputs are within noise."""
    if not curve:
        raise ValueError("no measured batch sizes")
    by_size = sorted(curve, key=lambda p: p.batch_size)
    fitting = [p for p in by_size if p.batch_size > 1 and 2 * p.p99_spread.low <= slo_ms]
    single = by_size[0]
    if fitting:
        best = max(fitting, key=lambda p: p.qps)
        if best.qps_spread.clearly_above(single.qps_spread, floor):
            pick = min((p for p in fitting
                        if not best.qps_spread.clearly_above(p.qps_spread, floor)),
                       key=lambda p: p.batch_size)
            reason = (f"batch {pick.batch_size}: clearly faster than batch {single.batch_size}"
                      + (f", within noise of batch {best.batch_size}" if pick is not best
                         else ""))
            delay = round(max(0.0, min(slo_ms - 2 * pick.p99_ms, pick.p99_ms)), 3)
            return BatchingPlan(pick.batch_size, delay, pick.qps, pick.p99_ms, True,
                                pick.qps_spread, pick.p99_spread, reason)
        reason = (f"no batching: batch {best.batch_size} is within noise of batch "
                  f"{single.batch_size}")
    else:
        reason = "no batching: no batch size > 1 fits twice within the SLO"
    return BatchingPlan(0, 0.0, single.qps, single.p99_ms,
                        single.p99_spread.low <= slo_ms, single.qps_spread,
                        single.p99_spread, reason)
