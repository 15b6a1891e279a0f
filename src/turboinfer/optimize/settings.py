"""What the optimizer is asked to do: variants, calibration, budget. Validated once, here."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from turboinfer.errors import ConfigError

E = TypeVar("E", bound=enum.Enum)


class Variant(str, enum.Enum):
    """One way of rewriting the model. ``FP32`` is the untouched reference."""

    FP32 = "fp32"
    GRAPH = "graph"
    FP16 = "fp16"
    INT8_DYNAMIC = "int8-dynamic"
    INT8_STATIC = "int8-static"
    INT4 = "int4"
    MIXED = "mixed"  # int8-static with the most sensitive layers kept in float


# What ``--variants`` offers; FP32 is always measured, MIXED follows from a budget.
REQUESTABLE = (Variant.GRAPH, Variant.FP16, Variant.INT8_DYNAMIC, Variant.INT8_STATIC,
               Variant.INT4)


class CalibrationMethod(str, enum.Enum):
    MINMAX = "minmax"
    ENTROPY = "entropy"
    PERCENTILE = "percentile"


class ActivationType(str, enum.Enum):
    """Element type of quantized activations (weights are always signed int8)."""

    UINT8 = "uint8"
    INT8 = "int8"


@dataclass(frozen=True)
class AccuracyBudget:
    """The largest metric drop allowed: absolute (in the metric's unit) or relative (%).

    ``parse("1")`` is one point; ``parse("1%")`` is one percent of the reference value.
    A negative budget asks for an improvement, which nothing may meet; it is allowed so
    that the FP32 fallback can be exercised and explained.
    """

    value: float
    relative: bool = False

    @classmethod
    def parse(cls, text: str) -> AccuracyBudget:
        raw = text.strip()
        relative = raw.endswith("%")
        try:
            value = float(raw.rstrip("%"))
        except ValueError:
            raise ConfigError(f"accuracy budget must be a number or N%: {text!r}") from None
        return cls(value, relative)

    def allowed_drop(self, reference: float) -> float:
        return abs(reference) * self.value / 100.0 if self.relative else self.value

    def drop(self, reference: float, value: float, higher_is_better: bool) -> float:
        """How much worse ``value`` is than ``reference`` (negative when better)."""
        return reference - value if higher_is_better else value - reference

    def meets(self, reference: float, value: float, higher_is_better: bool) -> bool:
        # A tiny tolerance so that a model equal to the reference meets a zero budget.
        drop = self.drop(reference, value, higher_is_better)
        return drop <= self.allowed_drop(reference) + 1e-9

    def __str__(self) -> str:
        return f"{self.value:g}%" if self.relative else f"{self.value:g}"


@dataclass(frozen=True)
class MeasureSettings:
    """How latency is timed for every variant: batch 1 on the default engine."""

    engine: str = "onnxruntime"
    min_runs: int = 30
    min_seconds: float = 0.5
    warmup_runs: int = 3

    def __post_init__(self) -> None:
        if self.min_runs < 1 or self.min_seconds < 0 or self.warmup_runs < 0:
            raise ConfigError("min runs must be >= 1, seconds and warm-up >= 0")


@dataclass(frozen=True)
class OptimizeSettings:
    variants: tuple[Variant, ...] = REQUESTABLE
    calibrations: tuple[CalibrationMethod, ...] = tuple(CalibrationMethod)
    calib_data: Path | None = None
    calib_count: int = 500
    random_calibration: bool = False  # only when asked: random data says nothing real
    percentile: float = 99.99
    entropy_bins: int = 2048  # ORT's default 128 makes Entropy equal MinMax
    int4_block_size: int = 32
    sensitivity: bool = False
    budget: AccuracyBudget | None = None
    # None: take the profile's choice and verify it against the other type by timing.
    activation_type: ActivationType | None = None
    measure: MeasureSettings = MeasureSettings()

    def __post_init__(self) -> None:
        unknown = [v for v in self.variants if v not in REQUESTABLE]
        if unknown:
            raise ConfigError(f"variant {unknown[0].value!r} cannot be requested")
        if not self.variants:
            raise ConfigError("at least one variant is needed")
        if Variant.INT8_STATIC in self.variants and not self.calibrations:
            raise ConfigError("int8-static needs at least one calibration method")
        if self.calib_count < 1:
            raise ConfigError("calibration count must be >= 1")
        if not 50.0 < self.percentile <= 100.0:
            raise ConfigError(f"percentile must be in (50, 100], got {self.percentile}")
        if self.entropy_bins < 128:
            raise ConfigError("entropy calibration needs at least 128 histogram bins")
        if self.int4_block_size not in (16, 32, 64, 128, 256):
            raise ConfigError("int4 block size must be a power of two from 16 to 256")

    @property
    def needs_calibration(self) -> bool:
        return Variant.INT8_STATIC in self.variants


def parse_variants(names: tuple[str, ...] | list[str]) -> tuple[Variant, ...]:
    return tuple(_parse_enum(Variant, name, "variant", REQUESTABLE) for name in names)


def parse_calibrations(names: tuple[str, ...] | list[str]) -> tuple[CalibrationMethod, ...]:
    return tuple(
        _parse_enum(CalibrationMethod, name, "calibration method", tuple(CalibrationMethod))
        for name in names
    )


def _parse_enum(kind: type[E], name: str, what: str, allowed: tuple[E, ...]) -> E:
    try:
        value = kind(name.strip().lower())
    except ValueError:
        value = None
    if value is None or value not in allowed:
        choices = ", ".join(str(v.value) for v in allowed)
        raise ConfigError(f"unknown {what} {name!r}; choose from {choices}")
    return value
