"""What a load test found: one result per load point, and the report around them.

Everything here turns into plain JSON (``to_dict``) so that two runs can be compared
later by ``turboinfer load compare`` without the code that produced them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from turboinfer.load.metrics import ServerSide
from turboinfer.load.stats import LatencySummary, WindowStats

REPORT_FORMAT = "turboinfer-load/1"


@dataclass(frozen=True)
class RunResult:
    """One load point: a concurrency level, a rate, a search trial or a soak."""

    label: str
    mode: str                      # "closed" (concurrency) or "open" (scheduled arrivals)
    concurrency: int | None
    target_rate: float | None
    duration_s: float
    ok: int
    failed: int
    errors: dict[str, int]
    qps: float
    latency: LatencySummary
    windows: tuple[WindowStats, ...]
    cdf: tuple[tuple[float, float], ...]
    stable: bool | None
    client_cpu: float
    send_lag_p99_ms: float | None = None
    corrected_p99_ms: float | None = None
    server: ServerSide | None = None
    aborted: str = ""
    warnings: tuple[str, ...] = ()

    @property
    def error_rate(self) -> float:
        total = self.ok + self.failed
        return self.failed / total if total else 0.0

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["error_rate"] = self.error_rate
        return doc


@dataclass(frozen=True)
class MaxRateResult:
    p99_bound_ms: float
    max_error_rate: float
    capacity_qps: float            # closed-loop throughput that seeded the search
    max_rate: float                # highest passing rate; 0 when none passed
    trials: tuple[tuple[float, bool], ...]


@dataclass(frozen=True)
class SoakVerdict:
    verdict: str                   # "stable", "drift" or "too short"
    p99_first_ms: float
    p99_last_ms: float
    p99_ratio: float
    memory_first_mb: float | None
    memory_last_mb: float | None
    memory_growth: float | None    # relative growth over the run
    memory_slope_mb_per_min: float | None
    reasons: tuple[str, ...]
    memory_series: tuple[tuple[float, float], ...] = ()   # (seconds, MB)


@dataclass
class LoadReport:
    """Filled in as runs finish, so a run that fails half way still has its results."""

    url: str
    model: str
    protocol: str
    encoding: str
    scenario: str
    settings: dict[str, Any]
    machine: dict[str, Any] = field(default_factory=dict)
    started_at: str = ""
    runs: list[RunResult] = field(default_factory=list)
    maxrate: MaxRateResult | None = None
    soak: SoakVerdict | None = None
    warnings: list[str] = field(default_factory=list)
    error: str = ""
    errors_detail: dict[str, str] = field(default_factory=dict)
    min_duration_s: float = 0.0
    min_requests: int = 0

    @property
    def complete(self) -> bool:
        return not self.error

    def validity(self) -> tuple[bool, list[str]]:
        """Valid when every run lasted long enough, counted enough and (if judged) was stable."""
        min_duration_s, min_requests = self.min_duration_s, self.min_requests
        reasons = []
        for run in self.runs:
            if run.duration_s < min_duration_s:
                reasons.append(f"{run.label}: {run.duration_s:.1f} s < {min_duration_s:g} s")
            if run.ok < min_requests:
                reasons.append(f"{run.label}: {run.ok} requests < {min_requests}")
            if run.stable is False:
                reasons.append(f"{run.label}: not stable")
        if self.error:
            reasons.append(f"incomplete: {self.error}")
        if not self.runs:
            reasons.append("no run finished")
        return not reasons, reasons

    def to_dict(self) -> dict[str, Any]:
        valid, reasons = self.validity()
        return {
            "format": REPORT_FORMAT,
            "url": self.url,
            "model": self.model,
            "protocol": self.protocol,
            "encoding": self.encoding,
            "scenario": self.scenario,
            "settings": self.settings,
            "machine": self.machine,
            "started_at": self.started_at,
            "complete": self.complete,
            "error": self.error,
            "valid": valid,
            "invalid_reasons": reasons,
            "runs": [run.to_dict() for run in self.runs],
            "maxrate": asdict(self.maxrate) if self.maxrate else None,
            "soak": asdict(self.soak) if self.soak else None,
            "warnings": self.warnings,
            "error_messages": self.errors_detail,
        }
