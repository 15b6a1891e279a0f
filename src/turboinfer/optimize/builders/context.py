"""What every step of one optimizer run reads: the model, its prepared base, the settings,
the judge and the calibration data. Builders, judging, sensitivity and the mixed-precision
search all take it, so it sits below them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from turboinfer.engines.base import TensorSpec
from turboinfer.models.zoo import ZooEntry
from turboinfer.optimize.builders.quantize import StaticQuant, quantize_int8_static
from turboinfer.optimize.data.calibration import CalibrationSet, compute_ranges
from turboinfer.optimize.judge.measure import Judge
from turboinfer.optimize.report import ActivationDecision
from turboinfer.optimize.settings import CalibrationMethod, OptimizeSettings


@dataclass(frozen=True)
class Context:
    """Everything a step may read. ``base`` is the float model prepared for quantizing."""

    source: Path
    base: Path
    out: Path
    work: Path
    settings: OptimizeSettings
    judge: Judge
    specs: list[TensorSpec]
    layers: tuple[str, ...]  # weighted nodes of ``base``, graph order
    calib: CalibrationSet | None = None
    activation: ActivationDecision | None = None
    fast_fp16: bool = False
    # The model's PyTorch form where it has one (built-ins, sources): what QAT trains.
    torch_module: object | None = None  # Callable[[], torch.nn.Module]
    entry: ZooEntry | None = None
    def ranges(self, method: CalibrationMethod, base: Path | None = None) -> Path:
        """The cached ranges of ``method`` on ``base`` (the prepared model by default),
        computed on first use."""
        base = base or self.base
        stem = "" if base == self.base else f"{base.stem}-"
        cache = self.work / f"ranges-{stem}{method.value}.json"
        if not cache.is_file():
            if self.calib is None:
                raise RuntimeError("static quantization without calibration data")
            compute_ranges(base, self.calib, method, self.settings, self.specs, cache)
        return cache

    def static(self, method: CalibrationMethod, dst: Path,
               exclude: tuple[str, ...] = (), base: Path | None = None) -> Path:
        if self.activation is None:
            raise RuntimeError("static quantization before the activation type is decided")
        quant = StaticQuant(method, self.ranges(method, base), self.activation.chosen, exclude)
        return quantize_int8_static(base or self.base, dst, quant)
