"""``optimize``: build the requested variants, judge each against FP32, write report.json."""

from __future__ import annotations

import logging
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import onnx

from turboinfer.errors import ConfigError, TurboinferError
from turboinfer.models import ResolvedModel, resolve_model
from turboinfer.models.onnx_file import check_onnx, input_specs
from turboinfer.models.zoo import ZooEntry
from turboinfer.optimize.builders.activation import MachineFacts, decide_activation, machine_facts
from turboinfer.optimize.builders.context import Context
from turboinfer.optimize.builders.mixed import add_mixed_precision
from turboinfer.optimize.builders.quantize import prepare, weighted_nodes
from turboinfer.optimize.builders.sensitivity import add_sensitivity
from turboinfer.optimize.builders.variants import BUILDERS, NOTHING_TO_QUANTIZE
from turboinfer.optimize.judge.fidelity import PREFIX as FIDELITY
from turboinfer.optimize.judge.judging import judge_and_calibration
from turboinfer.optimize.judge.measure import Judge, failure_line, judge_built, judge_reference
from turboinfer.optimize.report import (
    ActivationDecision,
    Built,
    MetricInfo,
    OptimizeReport,
    VariantResult,
)
from turboinfer.optimize.settings import OptimizeSettings, Variant
from turboinfer.optimize.settings import settings_from as settings_from  # the command line's import

log = logging.getLogger(__name__)

# Called with a short status line at each slow step.
Progress = Callable[[str], None]
# What the API accepts as a model: a reference to resolve, or a resolved model.
ModelRef = str | Path | ResolvedModel


def ensure_writable(path: Path) -> Path:
    """Create ``path`` and prove a file can be written there, before any slow work."""
    probe = path / f".turboinfer-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"cannot write to output directory {path}: {reason}") from None
    return path


def resolve(model: ModelRef) -> ResolvedModel:
    """A ``ResolvedModel`` from ``builtin:NAME``, an ONNX path, or one already resolved."""
    if isinstance(model, str | Path):
        return resolve_model(str(model))
    return model


def run_optimize(model: ModelRef, output_dir: Path, settings: OptimizeSettings,
                 progress: Progress | None = None) -> OptimizeReport:
    say = progress or (lambda message: log.info("%s", message))
    resolved = resolve(model)
    out = ensure_writable(Path(output_dir))
    facts = machine_facts()
    with tempfile.TemporaryDirectory(prefix=".work-", dir=out) as tmp:
        ctx = _context(resolved, out, Path(tmp), settings, facts, say)
        reference = judge_reference(ctx.source, ctx.judge, budget=settings.budget)
        results = [reference]
        for variant in settings.variants:
            say(f"building {variant.value}")
            for built in build_variant(variant, ctx):
                results.append(judge_built(built, ctx.judge, reference=reference,
                                           budget=settings.budget))
        evaluator = ctx.judge.scorer
        report = OptimizeReport(
            model=resolved.name, metric=_metric_info(ctx.judge),
            variants=tuple(results), output_dir=out, budget=settings.budget,
            activation=ctx.activation if settings.needs_calibration and ctx.layers else None,
            calibration=_calibration_info(ctx), notes=_notes(ctx, resolved.entry, results),
            machine=facts.summary, evaluate=evaluator.compute if evaluator else None)
        report = _precision_steps(report, ctx, say)
    report.write()
    return report


def _context(resolved: ResolvedModel, out: Path, work: Path, settings: OptimizeSettings,
             facts: MachineFacts, say: Progress) -> Context:
    source = Path(resolved.artifact.onnx_path)
    specs = input_specs(check_onnx(source))
    say("preparing the float model")
    base = prepare(source, work / "base.onnx")
    layers = tuple(weighted_nodes(onnx.load(str(base), load_external_data=False)))
    judge, calib = judge_and_calibration(resolved, source, specs, settings,
                                         calibrate=settings.needs_calibration and bool(layers))
    ctx = Context(source, base, out, work, settings, judge, specs, layers, calib,
                  ActivationDecision(facts.activation, facts.activation), facts.fast_fp16,
                  torch_module=resolved.artifact.torch_module, entry=resolved.entry)
    if calib is not None:
        say("choosing the activation type")
        ctx = replace(ctx, activation=decide_activation(ctx, facts.activation))
    return ctx


def _precision_steps(report: OptimizeReport, ctx: Context, say: Progress) -> OptimizeReport:
    """Sensitivity ranking and the mixed-precision search, when asked and possible."""
    if ctx.calib is None or Variant.INT8_STATIC not in ctx.settings.variants:
        return report
    if ctx.settings.sensitivity or ctx.settings.budget is not None:
        say("ranking layer sensitivity")
        report = add_sensitivity(report, ctx)
    if ctx.settings.budget is not None and ctx.judge.has_metric:
        say("searching mixed precision under the budget")
        report = add_mixed_precision(report, ctx)
    return report


def build_variant(variant: Variant, ctx: Context) -> list[Built]:
    """The variant's files, or one skipped record saying why its build failed: one
    variant that a quantizer cannot handle must not end the run for the others."""
    try:
        return BUILDERS[variant](ctx)
    except TurboinferError as exc:
        if isinstance(exc, ConfigError):
            raise  # the user's settings: every variant would fail the same way
        reason = failure_line(exc)
    except Exception as exc:  # quantizers raise anything on a graph they cannot handle
        reason = failure_line(exc)
    log.warning("building %s failed: %s", variant.value, reason)
    return [Built(variant.value, variant, skipped=f"build failed: {reason}; leave it out "
                  "with --variants or report the layer named")]


def _metric_info(judge: Judge) -> MetricInfo | None:
    evaluator = judge.scorer
    if evaluator is None:
        return None
    return MetricInfo(evaluator.name, evaluator.unit, evaluator.higher_is_better,
                      evaluator.description)


def _calibration_info(ctx: Context) -> dict[str, Any]:
    if ctx.calib is None:
        return {}
    held_out = ctx.calib.held_out
    return {"source": ctx.calib.source, "count": ctx.calib.count,
            "held_out": len(next(iter(held_out.values()))) if held_out else 0,
            "methods": [m.value for m in ctx.settings.calibrations],
            "notes": list(ctx.calib.notes)}


def _notes(ctx: Context, entry: ZooEntry | None,
           results: list[VariantResult]) -> tuple[str, ...]:
    notes: list[str] = []
    if not ctx.layers:
        notes.append(f"{NOTHING_TO_QUANTIZE}; the FP32 model is the answer")
    scorer = ctx.judge.scorer
    if scorer is None:
        notes.append("no --eval-data and no --max-accuracy-drop: variants are not compared "
                     "on accuracy")
    elif scorer.name.startswith(FIDELITY):
        notes.append(f"no labels: the budget is checked on {scorer.description}")
    if entry is not None and entry.random_weights:
        notes.append("the model has random weights: metrics compare variants to FP32 only")
    if ctx.calib is not None:
        notes.extend(ctx.calib.notes)
    fp16 = next((r for r in results if r.variant is Variant.FP16 and r.latency), None)
    if fp16 is not None and fp16.latency and results[0].latency and not ctx.fast_fp16:
        notes.append(f"no fast FP16 on this machine: fp16 p50 {fp16.latency.p50_ms:.3g} ms "
                     f"vs FP32 {results[0].latency.p50_ms:.3g} ms (it halves the file only)")
    return tuple(notes)
