"""Mixed precision under an accuracy budget: the fewest float layers that meet it.

Layers go back to float in a fixed order: first and last layer (the usual culprits),
then by sensitivity. The number kept in float is found by bisection over that order,
so the metric is evaluated O(log n) times, not once per layer.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from turboinfer.optimize.builders.context import Context
from turboinfer.optimize.judge.measure import judge_built, metric_of
from turboinfer.optimize.report import Built, MixedResult, MixedStep, OptimizeReport
from turboinfer.optimize.settings import CalibrationMethod, Variant


def float_order(layers: tuple[str, ...], ranking: list[str]) -> list[str]:
    """First and last layer, then the rest by sensitivity, then any left unranked."""
    order = [layers[0], layers[-1], *ranking, *layers]
    return list(dict.fromkeys(name for name in order if name in layers))


def search(order: list[str], evaluate: Callable[[int], float], full: float,
           meets: Callable[[float], bool]) -> tuple[int | None, list[MixedStep]]:
    """Smallest k such that keeping ``order[:k]`` in float meets the budget, or None.

    ``full`` is the metric with nothing in float. At least one layer stays quantized,
    else the result would be the float model under another name.
    """
    steps = [MixedStep(0, full, meets(full))]
    if steps[0].meets:
        return 0, steps

    def probe(k: int) -> bool:
        value = evaluate(k)
        steps.append(MixedStep(k, value, meets(value)))
        return steps[-1].meets

    highest = len(order) - 1
    first = min(2, highest)
    if first > 0 and probe(first):
        return first, steps
    low = first  # fails
    if highest <= low or not probe(highest):
        return None, steps
    high = highest  # meets
    while high - low > 1:
        mid = (low + high) // 2
        if probe(mid):
            high = mid
        else:
            low = mid
    return high, steps


def add_mixed_precision(report: OptimizeReport, ctx: Context) -> OptimizeReport:
    """Search from the best-calibrated static model; record the outcome in the report."""
    best = report.best_static()
    budget = ctx.settings.budget
    target = report.reference.metric
    method = best.calibration if best is not None else None
    if budget is None or best is None or method is None or best.metric is None or target is None:
        return report.with_notes("mixed precision: no calibrated int8-static model to start from")
    order = float_order(ctx.layers, [s.node for s in report.sensitivity])

    def evaluate(k: int) -> float:
        path = ctx.static(method, ctx.work / f"mixed-{k}.onnx", tuple(order[:k]))
        value = metric_of(path, ctx.judge)
        assert value is not None  # the judge has a metric, checked by the caller
        return value

    higher = ctx.judge.higher_is_better
    k, steps = search(order, evaluate, best.metric,
                      lambda value: budget.meets(target, value, higher))
    if k is None:
        reason = (f"no mixed-precision model meets the budget ({budget}) with at least one "
                  "layer quantized: the FP32 model is the answer")
        result = MixedResult(False, method.value, (), tuple(steps), len(order), reason)
        return replace(report, mixed=result).with_notes(reason)
    if k == 0:
        reason = f"full int8 quantization ({method.value}) already meets the budget ({budget})"
        result = MixedResult(True, method.value, (), tuple(steps), len(order), reason)
        return replace(report, mixed=result)
    reason = f"{k} of {len(order)} layers kept in float to meet the budget ({budget})"
    result = MixedResult(True, method.value, tuple(order[:k]), tuple(steps), len(order), reason)
    return _add_variant(replace(report, mixed=result), ctx, ctx.work / f"mixed-{k}.onnx", method)


def _add_variant(report: OptimizeReport, ctx: Context, source: Path,
                 method: CalibrationMethod) -> OptimizeReport:
    """Keep the chosen file as ``mixed.onnx`` and judge it like any other variant."""
    assert report.mixed is not None
    path = ctx.out / "mixed.onnx"
    shutil.copyfile(source, path)
    built = Built("mixed", Variant.MIXED, path, calibration=method,
                  details={"float_layers": list(report.mixed.float_layers)})
    judged = judge_built(built, ctx.judge, reference=report.reference,
                         budget=ctx.settings.budget)
    return replace(report, variants=(*report.variants, judged))
