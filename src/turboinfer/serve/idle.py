"""Idle unload: a version unused for ``idle_unload_s`` goes to zero instances.

"Unused" is read from counters the hot path keeps anyway (requests answered, requests
waiting or running), sampled by the autoscaler's tick, so serving a request costs
nothing more for it. At zero instances the version keeps its description, batcher and
metrics: a request still finds it, queues, and wakes it (``Autoscaler.wake``); the
engine sessions, which hold the memory, are what goes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class IdleClock:
    """When a version was last seen in use."""

    last_active: float
    last_requests: int = 0

    def observe(self, now: float, requests: int, in_flight: int) -> None:
        if requests != self.last_requests or in_flight > 0:
            self.last_active = now
        self.last_requests = requests

    def touch(self, now: float) -> None:
        self.last_active = now

    def idle_for(self, now: float) -> float:
        return now - self.last_active

    def due(self, now: float, idle_unload_s: float | None) -> bool:
        return idle_unload_s is not None and self.idle_for(now) >= idle_unload_s
