"""Tune candidates: a variant file on an engine, placed on a device in a form, with a
thread count, and its measurements.

Which engine can run which variant is the table ``settings.ENGINE_VARIANTS``; where and
in which forms is ``devices.py``; which engines the server can run is ``SERVABLE`` here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turboinfer.optimize.search.batching import BatchingPlan, CurvePoint
from turboinfer.optimize.search.devices import CPU, Placement
from turboinfer.optimize.settings import Variant

# Engines the model repository can name (``serve.config.ModelConfig.engine``); the torch
# engine only for a model whose PyTorch source the server can build (``Candidate.source``).
SERVABLE = frozenset({"onnxruntime", "openvino", "torch"})


@dataclass(frozen=True)
class Candidate:
    variant_name: str
    variant: Variant
    path: Path
    engine: str
    threads: int
    metric: float | None = None
    within_budget: bool | None = None
    placement: Placement = CPU
    source: str | None = None  # engine torch: what the entry names as its source

    @property
    def device(self) -> str:
        return self.placement.device

    @property
    def label(self) -> str:
        tag = self.placement.tag
        return f"{self.variant_name}/{self.engine}{'@' + tag if tag else ''}/t{self.threads}"


@dataclass(frozen=True)
class Measured:
    candidate: Candidate
    curve: tuple[CurvePoint, ...] = ()
    plan: BatchingPlan | None = None
    error: str | None = None
    notes: tuple[str, ...] = field(default=())
    # On the chosen candidate: the rule that picked it and the numbers it compared.
    decision: Mapping[str, Any] | None = None

    @property
    def servable(self) -> bool:
        engine = self.candidate.engine
        return engine in SERVABLE and (engine != "torch" or self.candidate.source is not None)

    @property
    def eligible(self) -> bool:
        """Can be chosen: ran, servable, inside the accuracy budget and the SLO."""
        return (self.error is None and self.servable and self.plan is not None
                and self.plan.meets_slo and self.candidate.within_budget is not False)

    def to_dict(self) -> dict[str, Any]:
        c = self.candidate
        return {"label": c.label, "variant": c.variant_name, "engine": c.engine,
                "device": c.device, "placement": c.placement.to_dict(), "source": c.source,
                "threads": c.threads, "metric": c.metric, "within_budget": c.within_budget,
                "servable": self.servable, "eligible": self.eligible, "error": self.error,
                "curve": [p.to_dict() for p in self.curve],
                "plan": self.plan.to_dict() if self.plan else None,
                "notes": list(self.notes),
                "decision": dict(self.decision) if self.decision is not None else None}
