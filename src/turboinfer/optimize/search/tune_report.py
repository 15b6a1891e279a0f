"""The tune result: every candidate measured, the one chosen, and the entry written."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turboinfer.engines import Precision
from turboinfer.optimize.report import OptimizeReport, budget_dict, write_json
from turboinfer.optimize.search.candidates import Measured
from turboinfer.optimize.search.html import render_tune_html
from turboinfer.optimize.settings import TuneSettings
from turboinfer.serve.config import (
    DynamicBatching,
    EngineSettingsConfig,
    ModelConfig,
    write_entry,
    write_source_entry,
)

TABLE_COLUMNS = ("candidate", "device", "metric", "budget", "p50@1", "p99@1", "max_batch",
                 "delay_ms", "qps", "slo", "why")


@dataclass(frozen=True)
class TuneReport:
    model: str
    name: str
    settings: TuneSettings
    candidates: tuple[Measured, ...]
    chosen: int | None
    entry: Path | None
    optimize: OptimizeReport
    work: Path
    elapsed_s: float
    pruning: Mapping[str, Any] | None = None  # the prune summary and its optimize report
    devices: tuple[str, ...] = ("cpu",)  # the devices searched
    search_notes: tuple[str, ...] = ()  # why candidates one may expect are not there

    @property
    def best(self) -> Measured | None:
        return None if self.chosen is None else self.candidates[self.chosen]

    @property
    def notes(self) -> list[str]:
        notes = [*self.optimize.notes, *self.search_notes]
        if self.pruning is not None:
            notes.append(prune_note(self.pruning))
        best = self.best
        if best is None:
            notes.append("no servable candidate ran: nothing was written")
        elif not best.eligible:
            notes.append(self._slo_miss_note(best))
        elif best.candidate.variant_name == "fp32" and best.candidate.placement.precision in (
                Precision.FP32, Precision.TF32):
            notes.append("the FP32 model is the best configuration within the budget")
        return notes

    def _slo_miss_note(self, best: Measured) -> str:
        slo = self.settings.slo_p99_ms
        p99 = best.plan.p99_ms if best.plan is not None else float("nan")
        written = ("it was written as asked" if self.entry is not None
                   else "nothing was written (--write-on-slo-miss writes it)")
        return (f"no candidate meets the p99 SLO of {slo:g} ms: the lowest-latency one, "
                f"{best.candidate.label}, has p99 {p99:.3g} ms ({p99 - slo:.3g} ms over); "
                + written)

    def budget(self) -> dict[str, Any]:
        """The budget as numbers, with the worst metric it allows (``floor``)."""
        metric = self.optimize.metric
        data = budget_dict(self.optimize.budget, self.optimize.reference.metric,
                           metric.higher_is_better if metric else True)
        assert data is not None  # tune always has a budget
        return data

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        budget = self.budget()
        return {
            "model": self.model, "name": self.name,
            "slo_p99_ms": self.settings.slo_p99_ms,
            "devices": list(self.devices),
            "max_accuracy_drop": {k: budget[k] for k in ("value", "relative", "text")},
            "budget_floor": budget["floor"],
            "chosen": best.to_dict() if best else None,
            "entry": str(self.entry) if self.entry else None,
            "candidates": [m.to_dict() for m in self.candidates],
            "optimize": self.optimize.to_dict(),
            "pruning": dict(self.pruning) if self.pruning is not None else None,
            "notes": self.notes,
            "elapsed_s": round(self.elapsed_s, 1),
            "machine": dict(self.optimize.machine),
        }

    def write(self) -> Path:
        write_json(self.work / "report.json", self.to_dict())
        (self.work / "report.html").write_text(render_tune_html(self.to_dict()))
        return self.work / "report.json"

    def table_rows(self) -> list[list[Any]]:
        """One row per candidate, then one per variant that never became one; the last
        column says why a row was not chosen."""
        rows = []
        for index, m in enumerate(self.candidates):
            first = m.curve[0] if m.curve else None
            plan = m.plan
            rows.append([
                m.candidate.label, m.candidate.device,
                "-" if m.candidate.metric is None else round(m.candidate.metric, 3),
                {True: "ok", False: "over", None: "-"}[m.candidate.within_budget],
                first.p50_ms if first else "-", first.p99_ms if first else "-",
                plan.max_batch_size if plan else "-",
                plan.max_queue_delay_ms if plan else "-",
                plan.qps if plan else "-",
                "error" if m.error else ("ok" if plan and plan.meets_slo else "miss"),
                "<- chosen" if index == self.chosen else self.why_not(m),
            ])
        for v in self.optimize.variants:
            if v.skipped is not None:
                failed = v.skipped.startswith(("build failed", "engine error"))
                rows.append([v.name, *["-"] * 9, v.skipped if failed else f"skipped: {v.skipped}"])
        return rows

    def why_not(self, m: Measured) -> str:
        """Why a candidate was not chosen, in a few words."""
        c = m.candidate
        if m.error:
            return m.error if m.error.startswith("engine error") else f"engine error: {m.error}"
        if c.within_budget is False and c.metric is not None:
            return f"over budget by {self._overshoot(c.metric):.3g}"
        if m.plan is None or not m.plan.meets_slo:
            p99 = m.curve[0].p99_ms if m.curve else None
            return ("SLO miss" if p99 is None else
                    f"SLO miss: p99 {p99:.3g} ms > {self.settings.slo_p99_ms:g} ms at batch 1")
        if not m.servable:
            if c.engine == "torch":  # an ONNX file, a pruned model, a test's own entry
                return "baseline: no PyTorch source the server could build it from"
            return f"baseline: {c.engine} is not served"
        return "lower throughput"

    def _overshoot(self, metric: float) -> float:
        """How far past the budget's floor ``metric`` is, in the metric's unit."""
        floor = self.budget()["floor"]
        return abs(metric - floor) if floor is not None else 0.0


def write_entry_for(repo: Path, name: str, measured: Measured) -> Path:
    """The repository entry of the chosen candidate: its file (or, on the torch engine,
    the PyTorch source the server builds), engine, where and in which form it runs
    (device, precision, channels_last, CUDA graphs), threads and batching."""
    plan = measured.plan
    assert plan is not None
    candidate = measured.candidate
    batching = None
    if plan.max_batch_size > 0:
        batching = DynamicBatching(max_queue_delay_ms=plan.max_queue_delay_ms,
                                   preferred_batch_sizes=(plan.max_batch_size,))
    config = ModelConfig(
        engine=candidate.engine,  # type: ignore[arg-type]
        source=candidate.source if candidate.engine == "torch" else None,
        max_batch_size=plan.max_batch_size,
        dynamic_batching=batching,
        engine_settings=EngineSettingsConfig(intra_op_threads=candidate.threads,
                                             **candidate.placement.entry_settings()),
    )
    if config.source is not None:  # the server builds the module: no model file
        return write_source_entry(repo, name, config)
    return write_entry(repo, name, candidate.path, config)


def prune_note(summary: Mapping[str, Any]) -> str:
    """What pruning did, from the summary ``tune_prune`` records."""
    macs = summary.get("macs") or {}
    metric = summary.get("metric") or {}
    return (f"pruned {summary['sparsity']:g} of the channels: MACs {macs.get('before')} -> "
            f"{macs.get('after')}; {metric.get('name')} {_fmt(metric.get('before'))} -> "
            f"{_fmt(metric.get('after_distillation'))} after distillation; pruned-* "
            "candidates are judged against the unpruned FP32 model")


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}"
