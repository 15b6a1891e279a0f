"""Timing tune candidates in interleaved rounds.

On a shared machine a background burst lasts a second or more. Timed one after another,
the candidate that happens to run during the burst looks slow, and the next run of
``tune`` blames another one. So every candidate's session is loaded first, then each
round visits every candidate (round-robin, the starting candidate rotating) for one
short window per batch size. A burst then lands on one round of many candidates instead
of on all rounds of one, and the per-round values give each point a spread
(``bench.stats.spread``): its median and an interval over rounds.

Batch sizes grow until one is over the SLO beyond the noise (the low end of its p99
interval over the rounds so far): larger ones would only take longer. A later round that
brings that size back under the SLO lets the ladder climb again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from turboinfer.bench.latency import time_session
from turboinfer.bench.reasons import one_line, pinned_axis_hint
from turboinfer.bench.stats import spread, summarize_ns
from turboinfer.engines import Session
from turboinfer.optimize.search.batching import CurvePoint
from turboinfer.optimize.settings import MeasureSettings

Feeds = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Windows:
    """How one point is timed in each round: the tune's per-point budget split evenly."""

    rounds: int
    seconds: float
    runs: int
    warmup_runs: int = 1  # caches were cooled by the other candidates of the round
    slo_ms: float = math.inf

    @classmethod
    def split(cls, measure: MeasureSettings, rounds: int, seconds: float,
              slo_ms: float) -> Windows:
        """``seconds`` and ``measure.min_runs`` per point, over ``rounds`` windows."""
        return cls(rounds, seconds / rounds, math.ceil(measure.min_runs / rounds),
                   slo_ms=slo_ms)


@dataclass
class Point:
    """One batch size of one candidate: a value per round it was timed in."""

    batch_size: int
    p50_ms: list[float] = field(default_factory=list)
    p99_ms: list[float] = field(default_factory=list)
    qps: list[float] = field(default_factory=list)

    def add(self, durations_ns: list[int]) -> None:
        stats = summarize_ns(durations_ns)
        self.p50_ms.append(stats.p50_ms)
        self.p99_ms.append(stats.p99_ms)
        # From the median run: a stall of another process (the scheduler's 4 ms slice on a
        # shared core) would swing a mean by half from one round to the next; the tail it
        # adds is what p99 and the SLO check are for.
        self.qps.append(self.batch_size * 1000.0 / stats.p50_ms)

    def over(self, slo_ms: float) -> bool:
        """Over the SLO beyond the noise of the rounds so far."""
        return bool(self.p99_ms) and spread(self.p99_ms).low > slo_ms

    def curve_point(self) -> CurvePoint:
        p99, qps = spread(self.p99_ms), spread(self.qps)
        return CurvePoint(self.batch_size, float(np.median(self.p50_ms)), p99.median,
                          qps.median, p99, qps)


@dataclass
class Timed:
    """A loaded candidate under timing; ``error`` ends its part in later rounds."""

    session: Session
    points: list[Point]  # ascending batch sizes
    feeds: Callable[[int], Feeds]  # the inputs of one batch size
    error: str | None = None
    notes: list[str] = field(default_factory=list)  # batch sizes dropped, and why

    def curve(self) -> tuple[CurvePoint, ...]:
        return tuple(p.curve_point() for p in self.points if p.p99_ms)


def run_rounds(timed: list[Timed], windows: Windows, say: Callable[[str], None]) -> None:
    """Time every candidate in ``windows.rounds`` interleaved rounds."""
    for number in range(windows.rounds):
        live = [t for t in timed if t.error is None]
        if not live:
            return
        say(f"timing round {number + 1}/{windows.rounds} over {len(live)} candidates")
        start = number % len(live)
        for candidate in live[start:] + live[:start]:
            _time_ladder(candidate, windows)


def _time_ladder(timed: Timed, windows: Windows) -> None:
    """One window per batch size, ascending, up to the first one over the SLO."""
    for point in timed.points:
        try:
            # The session's own clock: CUDA events on its stream when it runs on a GPU.
            durations = time_session(timed.session, timed.feeds(point.batch_size),
                                     min_runs=windows.runs, min_seconds=windows.seconds,
                                     warmup_runs=windows.warmup_runs)
        except Exception as exc:  # an engine's own error: this candidate, not the tune
            _drop_from(timed, point, exc)
            return
        point.add(durations)
        if point.over(windows.slo_ms):
            return  # larger batches only take longer


def _drop_from(timed: Timed, failed: Point, exc: Exception) -> None:
    """A batch size the engine cannot run ends the ladder there when a smaller one ran
    (the graph pins its batch axis, or memory runs out); with nothing run, the candidate
    fails with the engine's reason."""
    ran = [p.batch_size for p in timed.points if p.p99_ms and p is not failed]
    if not ran:
        timed.error = one_line(exc)
        return
    timed.points = [p for p in timed.points if p.batch_size < failed.batch_size]
    timed.notes.append(f"batch {failed.batch_size} and larger dropped: {one_line(exc)}"
                       f"{pinned_axis_hint(failed.batch_size, ran)}")
