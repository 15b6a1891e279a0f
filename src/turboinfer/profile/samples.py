"""What every engine profiler hands back: per run, the wall time and the operator times."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from turboinfer.engines import EngineSettings
from turboinfer.errors import ConfigError

# Op types that only convert between float and int8: time in them is the cost of QDQ
# nodes the engine did not fuse into integer kernels. OpenVINO turns QDQ pairs into
# FakeQuantize layers; torch names its own quantize/dequantize ops.
QDQ_OP_TYPES = frozenset({
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "FakeQuantize",
    "aten::quantize_per_tensor", "aten::quantize_per_channel", "aten::dequantize",
})


@dataclass(frozen=True)
class ProfileSettings:
    """One profile: the engine, its settings, and how many runs to time and to skip."""

    engine: str = "onnxruntime"
    batch_size: int = 1
    engine_settings: EngineSettings = field(default_factory=EngineSettings)
    runs: int = 50
    warmup_runs: int = 5

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError(f"batch size must be >= 1, got {self.batch_size}")
        if self.runs < 1:
            raise ConfigError(f"runs must be >= 1, got {self.runs}")
        if self.warmup_runs < 0:
            raise ConfigError(f"warm-up runs must be >= 0, got {self.warmup_runs}")


@dataclass(frozen=True)
class OpTime:
    """One operator's time in one run. ``node`` is unique within a run."""

    node: str
    op_type: str
    ms: float


@dataclass(frozen=True)
class RunSample:
    """One profiled run: its wall time as the caller saw it, and the operators inside."""

    wall_ms: float
    ops: tuple[OpTime, ...]

    @property
    def kernels_ms(self) -> float:
        return sum(op.ms for op in self.ops)


@dataclass
class Profiled:
    """An engine profiler's result: the measured runs (warm-up already dropped) and a
    chrome-trace document of them."""

    samples: list[RunSample]
    trace: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def write_trace(trace: dict[str, Any], path: Path) -> Path:
    """Write a chrome-trace document (what Perfetto and chrome://tracing open)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(trace))
    return path
