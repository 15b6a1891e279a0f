"""The autoscaler: one task per server that resizes the versions' instance pools.

Every tick it samples each served version (engine busy seconds, requests answered,
requests in flight), then per version: unloads it to zero instances when it has been
idle for ``idle_unload_s``; otherwise, with ``autoscaling.enabled`` and out of its
cool-down, asks ``scale_policy.decide`` for a step and applies it (``InstancePool.resize``
builds the new instances while the old ones serve). Each decision is one log line with
its reason and numbers, and counts in ``turboinfer_scale_events_total``; the instance
count of every version is the ``turboinfer_instances`` gauge.

Instances of all versions share the machine's usable cores (the hardware profile's
count, cgroup quota included): a version adds one only while the instances of all
versions, at one core each (or their fixed intra-op thread count), leave a core free.
An autoscaled version splits the cores among its own instances (``cores // n`` intra-op
threads each) unless its configuration fixes the thread count.

A request for a version at zero instances calls ``wake``: the version is rebuilt to its
resting size and the request waits in its queue meanwhile; the wait is the cold start,
logged and recorded in ``turboinfer_cold_start_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from turboinfer.serve.idle import IdleClock
from turboinfer.serve.instances import available_cores
from turboinfer.serve.metrics import Metrics
from turboinfer.serve.scale_policy import HOLD, Decision, Sample, cap, decide, window
from turboinfer.serve.version import ServedVersion

log = logging.getLogger(__name__)
if log.level == logging.NOTSET:
    # Scale decisions are rare and are what an operator looks for: shown without -v.
    log.setLevel(logging.INFO)

MAX_TICK_S = 1.0
MIN_TICK_S = 0.05
TICKS_PER_WINDOW = 5  # samples per shortest window: coarse enough to be free, fine enough

WakeFailed = Callable[[ServedVersion, str], None]


@dataclass
class _Tracked:
    served: ServedVersion
    idle: IdleClock
    samples: deque[Sample] = field(default_factory=deque)
    last_event: float = -math.inf  # bounds (min/max) apply at once, windows need history
    target: int | None = None  # the count a resize in progress goes to
    task: asyncio.Task[None] | None = None
    held: str = ""  # the hold reason logged since the last event: logged once per layout

    @property
    def committed(self) -> int:
        return self.target if self.target is not None else len(self.served.pool.instances)


class Autoscaler:
    def __init__(self, metrics: Metrics, versions: Callable[[], Iterable[ServedVersion]],
                 cores: int | None = None, on_wake_failed: WakeFailed | None = None) -> None:
        self.metrics = metrics
        self._versions = versions
        self._cores = cores
        self._on_wake_failed = on_wake_failed
        self._tracked: dict[ServedVersion, _Tracked] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def cores(self) -> int:
        """The usable cores (probed on first use)."""
        if self._cores is None:
            self._cores = available_cores()
        return self._cores

    @cores.setter
    def cores(self, cores: int) -> None:
        self._cores = max(1, cores)

    # --- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        """Start ticking (once; needs the running loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        tasks = [t.task for t in self._tracked.values() if t.task is not None]
        if self._task is not None:
            tasks.append(self._task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._tick_s())
            try:
                self.step()
            except Exception:  # one bad round must not stop the scaling of every model
                log.exception("autoscaler step failed")

    def _tick_s(self) -> float:
        spans = [MAX_TICK_S * TICKS_PER_WINDOW]
        for tracked in self._tracked.values():
            config = tracked.served.config
            if config.autoscaling.enabled:
                spans += [config.autoscaling.scale_up_window_s,
                          config.autoscaling.scale_down_window_s]
            if config.idle_unload_s is not None:
                spans.append(config.idle_unload_s)
        return min(MAX_TICK_S, max(MIN_TICK_S, min(spans) / TICKS_PER_WINDOW))

    # --- one round ----------------------------------------------------------------------
    def step(self, now: float | None = None) -> None:
        """Sample every served version and act on what the samples say."""
        now = time.perf_counter() if now is None else now
        served = list(self._versions())
        for gone in [s for s in self._tracked if s not in served]:
            del self._tracked[gone]
        tracked = [self._track(s, now) for s in served]
        free = self.cores - sum(t.committed * max(1, self._fixed(t)) for t in tracked)
        for item in tracked:
            free -= self._step_one(item, now, free)

    def _track(self, served: ServedVersion, now: float) -> _Tracked:
        tracked = self._tracked.get(served)
        if tracked is None:
            tracked = self._tracked[served] = _Tracked(served, IdleClock(now))
        return tracked

    @staticmethod
    def _fixed(tracked: _Tracked) -> int:
        factory = tracked.served.pool.factory
        return factory.fixed_threads if factory is not None else 0

    def _step_one(self, tracked: _Tracked, now: float, free: int) -> int:
        """Sample and decide for one version; returns the cores it newly takes."""
        served, pool = tracked.served, tracked.served.pool
        requests = served.stats.success.count + served.stats.fail.count
        tracked.idle.observe(now, requests, served.batcher.in_flight)
        count = len(pool.instances)
        self.metrics.instances.labels(served.name, served.label).set(count)
        if tracked.task is not None or pool.factory is None:
            return 0
        config = served.config
        tracked.samples.append(Sample(now, pool.busy_seconds(now), requests))
        _prune(tracked.samples, now, max(config.autoscaling.scale_up_window_s,
                                         config.autoscaling.scale_down_window_s))
        if count and tracked.idle.due(now, config.idle_unload_s):
            self._sleep(tracked, now)
            return 0
        auto = config.autoscaling
        if not auto.enabled or not count or now - tracked.last_event < auto.cooldown_s:
            return 0
        per = max(1, self._fixed(tracked))
        decision = decide(auto, count, cap(auto, self.cores, self._fixed(tracked)),
                          max(0, free) // per,
                          window(tracked.samples, now, auto.scale_up_window_s, count),
                          window(tracked.samples, now, auto.scale_down_window_s, count))
        if decision is None or decision.direction == HOLD:
            if decision is not None and tracked.held != decision.reason:
                log.info("autoscale %s version %s: hold at %d (%s): %s", served.name,
                         served.label, count, decision.reason, decision.detail)
                tracked.held = decision.reason
            return 0
        self._resize(tracked, decision)
        return (decision.count - count) * per

    # --- acting ---------------------------------------------------------------------------
    def _resize(self, tracked: _Tracked, decision: Decision) -> None:
        served, pool = tracked.served, tracked.served.pool
        assert pool.factory is not None
        count = len(pool.instances)
        threads = pool.factory.threads_for(decision.count, self.cores)
        log.info("autoscale %s version %s: %s %d -> %d (%s): %s; %d intra-op thread(s) "
                 "each", served.name, served.label, decision.direction, count,
                 decision.count, decision.reason, decision.detail, threads)
        self.metrics.scale_events.labels(served.name, decision.direction,
                                         decision.reason).inc()
        tracked.target = decision.count
        tracked.task = asyncio.get_running_loop().create_task(
            self._resized(tracked, decision.count, threads))

    async def _resized(self, tracked: _Tracked, count: int, threads: int) -> None:
        served = tracked.served
        try:
            await served.pool.resize(count, threads)
        except Exception as exc:
            log.error("autoscale %s version %s: resize to %d failed: %s", served.name,
                      served.label, count, exc)
        finally:
            self._settled(tracked)

    def _settled(self, tracked: _Tracked) -> None:
        """A layout change is over: the cool-down and both windows start now."""
        now = time.perf_counter()
        served = tracked.served
        tracked.task, tracked.target, tracked.last_event = None, None, now
        tracked.samples.clear()
        tracked.held = ""
        self.metrics.instances.labels(served.name, served.label).set(
            len(served.pool.instances))

    def _sleep(self, tracked: _Tracked, now: float) -> None:
        """Zero instances, at once: a request that arrives after this sees none and
        wakes the version; one already queued kept the clock from running out."""
        served = tracked.served
        count = len(served.pool.instances)
        log.info("idle unload %s version %s: no request for %.1f s (idle_unload_s %g); "
                 "%d -> 0 instances", served.name, served.label, tracked.idle.idle_for(now),
                 served.config.idle_unload_s, count)
        self.metrics.scale_events.labels(served.name, "down", "idle").inc()
        served.pool.retire_all()
        self._settled(tracked)

    def wake(self, served: ServedVersion) -> None:
        """A request came for a version at zero instances: bring it back (once)."""
        tracked = self._track(served, time.perf_counter())
        pool = served.pool
        if tracked.task is not None or pool.instances or pool.factory is None:
            return
        count = self._resting(tracked)
        tracked.target = count
        tracked.task = asyncio.get_running_loop().create_task(
            self._woken(tracked, count, pool.factory.threads_for(count, self.cores)))

    def _resting(self, tracked: _Tracked) -> int:
        """The count a version wakes to: its configured one, within its bounds."""
        config = tracked.served.config
        auto = config.autoscaling
        if not auto.enabled:
            return config.instances
        return min(max(config.instances, auto.min_instances),
                   cap(auto, self.cores, self._fixed(tracked)))

    async def _woken(self, tracked: _Tracked, count: int, threads: int) -> None:
        served = tracked.served
        start = time.perf_counter()
        try:
            await served.pool.resize(count, threads)
        except Exception as exc:
            reason = f"reload after idle unload failed: {exc}"
            log.error("model %s version %s: %s", served.name, served.label, reason)
            self._settled(tracked)
            if self._on_wake_failed is not None:
                self._on_wake_failed(served, reason)
            return
        seconds = time.perf_counter() - start
        labels = (served.name, served.label)
        self.metrics.cold_start.labels(*labels).observe(seconds)
        self.metrics.last_cold_start.labels(*labels).set(seconds)
        self.metrics.scale_events.labels(served.name, "up", "cold_start").inc()
        log.info("cold start %s version %s: 0 -> %d instance(s) of %d intra-op thread(s) "
                 "in %.3f s", served.name, served.label, count, threads, seconds)
        self._settled(tracked)
        tracked.idle.touch(time.perf_counter())


def _prune(samples: deque[Sample], now: float, longest_s: float) -> None:
    """Drop samples no window reaches back to (keeping one at or before the longest)."""
    with contextlib.suppress(IndexError):
        while samples[1].at <= now - longest_s:
            samples.popleft()
