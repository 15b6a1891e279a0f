"""The pruning report: size, metric at each stage, latency, and every layer's width."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from turboinfer.prune.api import PruneResult
from turboinfer.prune.measure import Latency
from turboinfer.prune.settings import PruneSettings
from turboinfer.prune.sparsity24 import NOTE as SEMI_STRUCTURED_NOTE


@dataclass(frozen=True)
class Budget:
    """How far the metric may fall from the unpruned model's, and whether it held."""

    max_drop: float
    drop: float | None  # None when the metric was not measured

    @classmethod
    def of(cls, max_drop: float | None, before: float | None,
           after: float | None) -> Budget | None:
        if max_drop is None:
            return None
        return cls(max_drop, None if before is None or after is None else before - after)

    @property
    def met(self) -> bool:
        # A budget bounds the drop: a pruned model that scores higher keeps it.
        return self.drop is not None and self.drop <= self.max_drop

    def to_dict(self) -> dict[str, Any]:
        return {"max_drop": self.max_drop, "drop": self.drop, "met": self.met}


@dataclass(frozen=True)
class PruneReport:
    model: str
    metric_name: str
    settings: dict[str, Any]
    result: PruneResult
    latency: dict[str, Latency]  # "original", "pruned" and, with 2:4, "structured"
    files: dict[str, str] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    budget: Budget | None = None

    def to_dict(self) -> dict[str, Any]:
        r = self.result
        return {
            "model": self.model,
            "settings": self.settings,
            "parameters": _before_after(r.size_before.parameters, r.size_after.parameters),
            "macs": _before_after(r.size_before.macs, r.size_after.macs),
            "metric": {"name": self.metric_name, "before": r.metrics.before,
                       "after_pruning": r.metrics.pruned,
                       "after_semi_structured": r.metrics.semi_structured,
                       "after_distillation": r.metrics.distilled},
            "latency_onnxruntime": {k: v.to_dict() for k, v in self.latency.items()},
            "speedup_p50": self.speedup(),
            "protected_layers": r.protected,
            "layers": _layers(r),
            "attention_heads": {"before": r.heads_before, "after": r.heads_after},
            "distill_loss_per_epoch": r.distill_losses,
            "semi_structured": self._semi_structured(),
            "budget": self.budget.to_dict() if self.budget else None,
            "files": self.files,
            "machine": self.machine,
        }

    def speedup(self) -> float | None:
        if "original" not in self.latency or "pruned" not in self.latency:
            return None
        return self.latency["original"].p50_ms / self.latency["pruned"].p50_ms

    def _semi_structured(self) -> dict[str, Any] | None:
        if self.result.zero_fraction is None:
            return None
        dense, sparse = self.latency.get("structured"), self.latency.get("pruned")
        effect = dense.p50_ms / sparse.p50_ms if dense and sparse else None
        return {"zero_fraction": self.result.zero_fraction, "speedup_p50_vs_dense": effect,
                "note": SEMI_STRUCTURED_NOTE}


def settings_dict(settings: PruneSettings) -> dict[str, Any]:
    return {
        "target_sparsity": settings.target_sparsity,
        "schedule": [f"{p.criterion}:{p.amount:g}" for p in settings.phases],
        "steps_per_phase": settings.steps_per_phase,
        "protect": sorted(p.value for p in settings.protect),
        "semi_structured": settings.semi_structured,
        "distill_epochs": settings.distill.epochs,
        "distill_objective": settings.distill.objective.value,
        "temperature": settings.distill.temperature,
    }


def _before_after(before: int, after: int) -> dict[str, float]:
    return {"before": before, "after": after, "reduction": before / after if after else 0.0}


def _layers(result: PruneResult) -> list[dict[str, Any]]:
    after = {w.name: w for w in result.widths_after}
    rows = []
    for w in result.widths_before:
        now = after.get(w.name)
        rows.append({"name": w.name, "kind": w.kind, "in_before": w.in_channels,
                     "out_before": w.out_channels,
                     "in_after": now.in_channels if now else None,
                     "out_after": now.out_channels if now else None})
    return rows


def format_text(report: dict[str, Any]) -> str:
    """A short human summary of ``PruneReport.to_dict()``."""
    metric, lat = report["metric"], report["latency_onnxruntime"]
    lines = [
        f"model: {report['model']}  schedule: {', '.join(report['settings']['schedule'])}",
        _ratio_line("parameters", report["parameters"]),
        _ratio_line("MACs", report["macs"]),
        f"{metric['name']}: before {_num(metric['before'])}, after pruning "
        f"{_num(metric['after_pruning'])}"
        + (f", after 2:4 {_num(metric['after_semi_structured'])}"
           if metric["after_semi_structured"] is not None else "")
        + f", after distillation {_num(metric['after_distillation'])}",
    ]
    budget = report.get("budget")
    if budget:
        verdict = "kept" if budget["met"] else (
            "MISSED: distil longer or faster (--distill-epochs, --lr) or prune less "
            "(--target-sparsity)")
        lines.append(f"budget: drop {_num(budget['drop'])} against at most "
                     f"{budget['max_drop']:g}: {verdict}")
    for label, row in lat.items():
        lines.append(f"onnxruntime {label}: p50 {row['p50_ms']:.3f} ms, p99 {row['p99_ms']:.3f} ms")
    if report["speedup_p50"]:
        lines.append(f"speed-up (p50): {report['speedup_p50']:.2f}x")
    semi = report["semi_structured"]
    if semi:
        lines.append(f"2:4: {semi['zero_fraction']:.0%} zeros in masked layers; "
                     f"p50 vs dense {_num(semi['speedup_p50_vs_dense'])}x. {semi['note']}")
    if report["attention_heads"]["after"]:
        lines.append(f"heads per layer: {report['attention_heads']['before']} -> "
                     f"{report['attention_heads']['after']}")
    lines.append("layers (out channels before -> after):")
    lines += [f"  {r['name']:<40} {r['out_before']:>6} -> {r['out_after']}"
              for r in report["layers"]]
    return "\n".join(lines)


def _ratio_line(label: str, row: dict[str, float]) -> str:
    return f"{label}: {row['before']:,} -> {row['after']:,} ({row['reduction']:.2f}x fewer)"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"
