"""The optimizer and the tuner: the Python API the command line calls.

``optimize(model, output_dir, ...)`` writes one ONNX file per variant and ``report.json``;
``tune(model, repo, ...)`` searches variants x engines x settings under a latency SLO and
an accuracy budget and writes a model-repository entry for the server.

The parts (README.md beside this file): ``settings`` and ``report`` (what is asked and what
is found), ``pipeline`` (the optimizer), ``data/`` (the samples fed to the model),
``judge/`` (measuring and judging a variant), ``builders/`` (making variants) and
``search/`` (the tune).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from turboinfer.optimize.pipeline import ModelRef, run_optimize
from turboinfer.optimize.report import OptimizeReport, VariantResult
from turboinfer.optimize.search.tune_report import TuneReport
from turboinfer.optimize.search.tuning import run_tune
from turboinfer.optimize.settings import (
    AccuracyBudget,
    ActivationType,
    CalibrationMethod,
    ImagePrep,
    MeasureSettings,
    MetricKind,
    OptimizeSettings,
    TuneSettings,
    Variant,
    settings_from,
    tune_optimize_settings,
    tune_settings_from,
)

__all__ = [
    "AccuracyBudget",
    "ActivationType",
    "CalibrationMethod",
    "ImagePrep",
    "MeasureSettings",
    "MetricKind",
    "ModelRef",
    "OptimizeReport",
    "OptimizeSettings",
    "TuneReport",
    "TuneSettings",
    "Variant",
    "VariantResult",
    "optimize",
    "tune",
]


def optimize(
    model: ModelRef,
    output_dir: str | Path,
    *,
    variants: Sequence[str] | None = None,
    calibrations: Sequence[str] | None = None,
    calib_data: str | Path | None = None,
    calib_count: int | None = None,
    calib_images: str | Path | None = None,
    image_prep: ImagePrep | None = None,
    calib_text: str | Path | None = None,
    tokenizer: str | Path | None = None,
    synthetic_calib: bool | None = None,
    eval_data: str | Path | None = None,
    metric: str | None = None,
    sensitivity: bool | None = None,
    max_accuracy_drop: str | float | None = None,
    settings: OptimizeSettings | None = None,
    progress: Callable[[str], None] | None = None,
) -> OptimizeReport:
    """Build and judge variants of ``model`` (``builtin:NAME``, an ONNX path, or a resolved
    model) into ``output_dir``; returns the report also written as ``report.json``.

    ``max_accuracy_drop`` is absolute points (``1`` or ``"1"``) or relative (``"1%"``).
    ``eval_data`` (``.npz``, a folder of ``.npy``, or ``package.module:function``) and
    ``metric`` (top1, cosine, f1, mae) say what accuracy is; without them a budget is
    checked as fidelity to FP32 on held-out calibration samples (``calib_data``,
    ``calib_images`` with ``image_prep``, ``calib_text`` lines tokenized with the model
    folder's ``tokenizer`` json, or ``synthetic_calib``).
    Keywords left as None keep the defaults of ``OptimizeSettings``; ``settings`` replaces
    all of them.
    """
    if settings is None:
        settings = settings_from(
            variants, calibrations=calibrations, calib_data=calib_data,
            calib_count=calib_count, calib_images=calib_images, image_prep=image_prep,
            calib_text=calib_text, tokenizer=tokenizer,
            synthetic_calib=synthetic_calib, eval_data=eval_data, metric=metric,
            sensitivity=sensitivity, max_accuracy_drop=max_accuracy_drop)
    return run_optimize(model, Path(output_dir), settings, progress)


def tune(
    model: ModelRef,
    repo: str | Path,
    *,
    slo_p99_ms: float,
    max_accuracy_drop: str | float,
    engines: Sequence[str] | None = None,
    devices: Sequence[str] | str | None = None,
    variants: Sequence[str] | None = None,
    calib_data: str | Path | None = None,
    calib_count: int | None = None,
    calib_images: str | Path | None = None,
    image_prep: ImagePrep | None = None,
    calib_text: str | Path | None = None,
    tokenizer: str | Path | None = None,
    synthetic_calib: bool | None = None,
    eval_data: str | Path | None = None,
    metric: str | None = None,
    batch_sizes: Sequence[int] | None = None,
    threads: Sequence[int] | None = None,
    name: str | None = None,
    prune: float | None = None,
    prune_epochs: int | None = None,
    write_on_slo_miss: bool = False,
    train_data: str | Path | None = None,
    qat_epochs: int | None = None,
    qat_minutes: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> TuneReport:
    """Find the highest-throughput configuration of ``model`` whose p99 meets
    ``slo_p99_ms`` and whose metric stays within ``max_accuracy_drop`` of FP32; write it
    to ``repo/<name>/`` (config.yaml and 1/model.onnx). Returns the ``TuneReport``; its
    report.json and report.html are in ``repo/<name>/tune/``.

    ``devices`` (cpu, cuda; default auto: cuda too when torch sees a GPU) are where the
    candidates run: on a GPU the torch engine in TF32/FP16/BF16 with CUDA graphs and ONNX
    Runtime's GPU providers, each judged under the budget on the device; the entry
    written says where it runs (``engine_settings.device``, ``precision``, ...).
    ``prune`` (a sparsity in (0, 1), built-in models only) adds the pruned model and its
    quantized variants as candidates, judged against the unpruned FP32 metric;
    ``prune_epochs`` sets its distillation epochs. When no candidate meets the SLO nothing
    is written unless ``write_on_slo_miss``. The data keywords are those of
    ``optimize``: with no labels the budget is checked as fidelity to FP32. ``qat`` in
    ``variants`` adds a quantization-aware-trained INT8 candidate, trained on
    ``train_data`` (or the built-in's training split, or the calibration samples) for
    ``qat_epochs``.
    """
    # Two objects, not one: the optimizer that builds the variants never reads the SLO,
    # and the search never reads the calibration data.
    built = tune_optimize_settings(
        max_accuracy_drop=max_accuracy_drop, variants=variants, calib_data=calib_data,
        calib_count=calib_count, calib_images=calib_images, image_prep=image_prep,
        calib_text=calib_text, tokenizer=tokenizer,
        synthetic_calib=synthetic_calib, eval_data=eval_data, metric=metric,
        train_data=train_data, qat_epochs=qat_epochs, qat_minutes=qat_minutes)
    search = tune_settings_from(
        slo_p99_ms=slo_p99_ms, engines=engines, devices=devices, batch_sizes=batch_sizes,
        threads=threads,
        name=name, prune=prune, prune_epochs=prune_epochs,
        write_on_slo_miss=write_on_slo_miss)
    return run_tune(model, Path(repo), built, search, progress)


class _CallableModule(types.ModuleType):
    """Lets ``turboinfer.optimize(...)`` call ``optimize`` although the name is also this
    subpackage: Python rebinds ``turboinfer.optimize`` to the module on every import of
    it, so a plain function re-export at the top level would be overwritten."""

    def __call__(self, *args: Any, **kwargs: Any) -> OptimizeReport:
        return optimize(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
