"""Pruned candidates for ``tune``: prune the built-in model, quantize the pruned file like
any other source, and judge every pruned variant against the *unpruned* FP32 metric, so
that one accuracy budget covers pruning and quantization together.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from turboinfer.engines import ModelArtifact
from turboinfer.errors import ConfigError
from turboinfer.models import ResolvedModel
from turboinfer.optimize.pipeline import Progress, run_optimize
from turboinfer.optimize.report import OptimizeReport
from turboinfer.optimize.settings import AccuracyBudget, OptimizeSettings, PruneRequest

PREFIX = "pruned-"


@dataclass(frozen=True)
class PrunedVariants:
    resolved: ResolvedModel
    report: OptimizeReport  # variants named pruned-*, judged against the unpruned FP32
    summary: Mapping[str, Any]  # sparsity, parameters, MACs, metric before/after

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary, "optimize": self.report.to_dict()}


def check_prunable(resolved: ResolvedModel) -> None:
    """Fail before any slow work: the pruner needs the zoo's PyTorch model and Torch-Pruning."""
    if resolved.entry is None:
        raise ConfigError("--prune needs a built-in model (builtin:NAME); for your own "
                          "torch.nn.Module call turboinfer.prune.prune() and tune its ONNX")
    # why: turboinfer.prune loads torch (seconds); only a tune that prunes comes here.
    from turboinfer.prune.requires import torch_pruning

    torch_pruning()  # the prune extra, before the variants are built


def build_pruned(resolved: ResolvedModel, reference: OptimizeReport, work: Path,
                 request: PruneRequest, settings: OptimizeSettings,
                 say: Progress) -> PrunedVariants:
    """Prune, then run the optimizer on the pruned ONNX with what is left of the budget."""
    # why: turboinfer.prune loads torch and Torch-Pruning (seconds), needed only here.
    from turboinfer.prune import DistillSettings, PruneSettings, prune_for_tune

    check_prunable(resolved)
    entry = resolved.entry
    assert entry is not None  # checked by check_prunable
    distill = DistillSettings() if request.epochs is None else DistillSettings(
        epochs=request.epochs)
    say(f"pruning {request.sparsity:g} of the channels")
    pruned = prune_for_tune(f"builtin:{entry.name}",
                            PruneSettings(target_sparsity=request.sparsity, distill=distill),
                            work / "pruned")
    source = ResolvedModel(f"{resolved.name}-pruned",
                           ModelArtifact(f"{resolved.name}-pruned", pruned.onnx_path), entry)
    budget = _remaining(settings.budget, reference, pruned.metric)
    say("building variants of the pruned model")
    report = run_optimize(source, work / "pruned-variants", replace(settings, budget=budget),
                          say)
    rejudged = rejudge(report, reference, settings.budget)
    summary = _summary(request, pruned.report_path)
    return PrunedVariants(source, rejudged, summary)


def _remaining(budget: AccuracyBudget | None, reference: OptimizeReport,
               pruned_metric: float | None) -> AccuracyBudget | None:
    """The budget the pruned model's mixed-precision search may still spend: what pruning
    cost comes off the top, in absolute points, so that search aims at the real target."""
    ref = reference.reference.metric
    if budget is None or ref is None or pruned_metric is None or reference.metric is None:
        return budget
    spent = budget.drop(ref, pruned_metric, reference.metric.higher_is_better)
    return AccuracyBudget(budget.allowed_drop(ref) - spent)


def rejudge(report: OptimizeReport, reference: OptimizeReport,
            budget: AccuracyBudget | None) -> OptimizeReport:
    """Rename the pruned variants and restate delta and budget against the unpruned FP32."""
    ref = reference.reference.metric
    higher = reference.metric.higher_is_better if reference.metric else True
    variants = []
    for v in report.variants:
        delta = within = None
        if v.metric is not None and ref is not None:
            delta = v.metric - ref
            within = budget.meets(ref, v.metric, higher) if budget is not None else None
        variants.append(replace(v, name=PREFIX + v.name, delta=delta, within_budget=within))
    return replace(report, variants=tuple(variants))


def _summary(request: PruneRequest, report_path: Path) -> dict[str, Any]:
    data = orjson.loads(report_path.read_bytes())
    return {"sparsity": request.sparsity, "parameters": data.get("parameters"),
            "macs": data.get("macs"), "metric": data.get("metric"),
            "speedup_p50": data.get("speedup_p50"), "report": str(report_path)}
