"""The optimizer and the tuner: the Python API the command line calls.

``optimize(model, output_dir, ...)`` writes one ONNX file per variant and ``report.json``;
``tune(model, repo, ...)`` searches variants x engines x settings under a latency SLO and
an accuracy budget and writes a model-repository entry for the server.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from turboinfer.optimize.report import OptimizeReport, VariantResult
from turboinfer.optimize.settings import (
    AccuracyBudget,
    ActivationType,
    CalibrationMethod,
    MeasureSettings,
    OptimizeSettings,
    Variant,
)

__all__ = [
    "AccuracyBudget",
    "ActivationType",
    "CalibrationMethod",
    "MeasureSettings",
    "OptimizeReport",
    "OptimizeSettings",
    "Variant",
    "VariantResult",
    "optimize",
]


def optimize(
    model: Any,
    output_dir: str | Path,
    *,
    variants: Sequence[str] | None = None,
    calibrations: Sequence[str] | None = None,
    calib_data: str | Path | None = None,
    calib_count: int | None = None,
    random_calibration: bool | None = None,
    sensitivity: bool | None = None,
    max_accuracy_drop: str | float | None = None,
    settings: OptimizeSettings | None = None,
) -> OptimizeReport:
    """Build and judge variants of ``model`` (``builtin:NAME``, an ONNX path, or a resolved
    model) into ``output_dir``; returns the report also written as ``report.json``.

    ``max_accuracy_drop`` is absolute points (``1`` or ``"1"``) or relative (``"1%"``).
    Keywords left as None keep the defaults of ``OptimizeSettings``; ``settings`` replaces
    all of them.
    """
    from turboinfer.optimize.pipeline import run_optimize, settings_from

    if settings is None:
        settings = settings_from(
            variants, calibrations=calibrations, calib_data=calib_data,
            calib_count=calib_count, random_calibration=random_calibration,
            sensitivity=sensitivity, max_accuracy_drop=max_accuracy_drop)
    return run_optimize(model, Path(output_dir), settings)
