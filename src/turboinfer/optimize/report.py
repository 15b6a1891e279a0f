"""The optimizer's records: one per variant, and the report that gathers them.

Records are frozen and turn into plain dicts (``to_dict``) for ``report.json``; paths are
written relative to the report's folder when they live inside it, so the folder can move.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from turboinfer.bench.stats import LatencyStats
from turboinfer.errors import ConfigError
from turboinfer.models.zoo import RunFn
from turboinfer.optimize.settings import (
    AccuracyBudget,
    ActivationType,
    CalibrationMethod,
    Variant,
)


@dataclass(frozen=True)
class Built:
    """A variant file written by a builder, not yet judged; or a skip with its reason."""

    name: str
    variant: Variant
    path: Path | None = None
    skipped: str | None = None
    calibration: CalibrationMethod | None = None
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class VariantResult:
    name: str
    variant: Variant
    path: Path | None = None
    size_bytes: int | None = None
    metric: float | None = None
    delta: float | None = None  # metric - reference metric: negative is worse when higher wins
    within_budget: bool | None = None  # None when there is no budget or no metric
    latency: LatencyStats | None = None
    skipped: str | None = None
    calibration: CalibrationMethod | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def usable(self) -> bool:
        return self.skipped is None and self.path is not None

    def to_dict(self, root: Path | None = None) -> dict[str, Any]:
        lat = self.latency
        return {
            "name": self.name,
            "variant": self.variant.value,
            "calibration": self.calibration.value if self.calibration else None,
            "path": _rel(self.path, root),
            "size_bytes": self.size_bytes,
            "metric": self.metric,
            "delta": self.delta,
            "within_budget": self.within_budget,
            "p50_ms": lat.p50_ms if lat else None,
            "p99_ms": lat.p99_ms if lat else None,
            "latency": lat.to_dict() if lat else None,
            "skipped": self.skipped,
            **({"details": dict(self.details)} if self.details else {}),
        }


@dataclass(frozen=True)
class ActivationDecision:
    """Which activation type static INT8 uses: what the profile said, what timing showed."""

    by_profile: ActivationType
    chosen: ActivationType
    measured_p50_ms: Mapping[str, float] = field(default_factory=dict)
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"by_profile": self.by_profile.value, "chosen": self.chosen.value,
                "measured_p50_ms": dict(self.measured_p50_ms), "reason": self.reason}


@dataclass(frozen=True)
class LayerSensitivity:
    node: str
    op_type: str
    tensor: str
    sqnr_db: float | None  # float vs quantized model at the layer's output
    loss_db: float | None  # SQNR lost across this layer; larger is more sensitive

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "op_type": self.op_type, "tensor": self.tensor,
                "sqnr_db": self.sqnr_db, "loss_db": self.loss_db}


@dataclass(frozen=True)
class MixedStep:
    float_layers: int
    metric: float
    meets: bool

    def to_dict(self) -> dict[str, Any]:
        return {"float_layers": self.float_layers, "metric": self.metric, "meets": self.meets}


@dataclass(frozen=True)
class MixedResult:
    met: bool
    calibration: str
    float_layers: tuple[str, ...]
    steps: tuple[MixedStep, ...]
    total_layers: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"met": self.met, "calibration": self.calibration,
                "float_layers": list(self.float_layers), "total_layers": self.total_layers,
                "steps": [s.to_dict() for s in self.steps], "reason": self.reason}


@dataclass(frozen=True)
class MetricInfo:
    name: str  # "fidelity:..." when measured against the FP32 model's outputs
    unit: str
    higher_is_better: bool
    description: str = ""  # what was measured, on which data


def budget_dict(budget: AccuracyBudget | None, reference: float | None,
                higher_is_better: bool) -> dict[str, Any] | None:
    """The budget as numbers, and the worst metric it allows (``floor``) when known."""
    if budget is None:
        return None
    floor = None
    if reference is not None:
        drop = budget.allowed_drop(reference)
        floor = reference - drop if higher_is_better else reference + drop
    return {"value": budget.value, "relative": budget.relative, "text": str(budget),
            "floor": floor}


@dataclass(frozen=True)
class OptimizeReport:
    model: str
    metric: MetricInfo | None
    variants: tuple[VariantResult, ...]
    output_dir: Path
    budget: AccuracyBudget | None = None
    activation: ActivationDecision | None = None
    calibration: Mapping[str, Any] = field(default_factory=dict)
    sensitivity: tuple[LayerSensitivity, ...] = ()
    mixed: MixedResult | None = None
    notes: tuple[str, ...] = ()
    machine: Mapping[str, Any] = field(default_factory=dict)
    # The metric as a function of an engine's ``run``, to judge a variant on another
    # engine; not part of report.json.
    evaluate: Callable[[RunFn], float] | None = field(default=None, compare=False,
                                                      repr=False)

    @property
    def reference(self) -> VariantResult:
        return self.variants[0]

    def get(self, name: str) -> VariantResult:
        for result in self.variants:
            if result.name == name:
                return result
        raise ConfigError(f"no variant named {name!r} in the report")

    def usable(self) -> list[VariantResult]:
        return [v for v in self.variants if v.usable]

    def best_static(self) -> VariantResult | None:
        """The int8-static variant closest to FP32 on the metric (the first one without
        one): sensitivity and mixed precision start from it, tune benchmarks only it."""
        statics = [v for v in self.usable() if v.variant is Variant.INT8_STATIC]
        if not statics:
            return None
        higher = self.metric.higher_is_better if self.metric else True
        scored = [(v.metric if higher else -v.metric, v) for v in statics
                  if v.metric is not None]
        if not scored:
            return statics[0]
        return max(scored, key=lambda pair: pair[0])[1]

    def with_notes(self, *notes: str) -> OptimizeReport:
        return replace(self, notes=(*self.notes, *notes))

    def to_dict(self) -> dict[str, Any]:
        root = self.output_dir
        return {
            "model": self.model,
            "metric": None if self.metric is None else {
                "name": self.metric.name, "unit": self.metric.unit,
                "higher_is_better": self.metric.higher_is_better,
                "reference": self.reference.metric,
                "description": self.metric.description},
            "budget": budget_dict(self.budget, self.reference.metric,
                                  self.metric.higher_is_better if self.metric else True),
            "activation_type": self.activation.to_dict() if self.activation else None,
            "calibration": dict(self.calibration),
            "variants": [v.to_dict(root) for v in self.variants],
            "sensitivity": [s.to_dict() for s in self.sensitivity],
            "mixed_precision": self.mixed.to_dict() if self.mixed is not None else None,
            "notes": list(self.notes),
            "machine": dict(self.machine),
        }

    def write(self, path: Path | None = None) -> Path:
        target = path or self.output_dir / "report.json"
        write_json(target, self.to_dict())
        return target


def write_json(path: Path, data: Any) -> None:
    try:
        path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2
                                      | orjson.OPT_SERIALIZE_NUMPY))
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror}") from None


def _rel(path: Path | None, root: Path | None) -> str | None:
    if path is None:
        return None
    if root is not None and path.resolve().is_relative_to(root.resolve()):
        return str(path.resolve().relative_to(root.resolve()))
    return str(path)
