"""The profile as a report: one JSON document (what ``--json`` prints and other stages
read) and a table for people."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from turboinfer.output import format_table
from turboinfer.profile.aggregate import Aggregate

TOP = 15  # rows per table on the terminal; --json lists everything


@dataclass(frozen=True)
class ProfileReport:
    model: str
    engine: str
    batch_size: int
    threads: int  # intra-op threads asked for; 0 lets the engine choose
    warmup_runs: int
    unprofiled_session_ms: float  # mean run with no profiler attached
    aggregate: Aggregate
    machine: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    trace: str | None = None

    @property
    def profiler_cost_ms(self) -> float:
        """What attaching the profiler added to a run (may be negative within noise)."""
        return self.aggregate.session_ms - self.unprofiled_session_ms

    def to_dict(self) -> dict[str, Any]:
        agg = self.aggregate
        return {
            "model": self.model, "engine": self.engine, "batch_size": self.batch_size,
            "threads": self.threads, "runs": agg.runs, "warmup_runs": self.warmup_runs,
            "session_ms": agg.session_ms, "kernels_ms": agg.kernels_ms,
            "overhead_ms": agg.overhead_ms, "overhead_share": agg.overhead_share,
            "unprofiled_session_ms": self.unprofiled_session_ms,
            "profiler_cost_ms": self.profiler_cost_ms,
            "qdq_share": agg.qdq_share,
            "op_types": [t.to_dict() for t in agg.op_types],
            "nodes": [n.to_dict() for n in agg.nodes],
            "machine": self.machine, "notes": self.notes, "trace": self.trace,
        }


def format_report(report: ProfileReport) -> str:
    agg = report.aggregate
    machine = report.machine
    lines = [
        f"model: {report.model}  engine: {report.engine}  batch: {report.batch_size}  "
        f"threads: {report.threads or 'engine default'}  runs: {agg.runs} "
        f"(after {report.warmup_runs} warm-up)",
        f"machine: {machine.get('cpu', '?')}, {machine.get('logical_cores', '?')} logical cores",
        "",
        f"session (profiled)    {agg.session_ms:9.3f} ms per run",
        f"  in operators        {agg.kernels_ms:9.3f} ms ({1 - agg.overhead_share:.1%})",
        f"  outside operators   {agg.overhead_ms:9.3f} ms ({agg.overhead_share:.1%}) "
        "framework overhead",
        f"session (unprofiled)  {report.unprofiled_session_ms:9.3f} ms per run; "
        f"the profiler cost {report.profiler_cost_ms:+.3f} ms",
        f"QDQ share             {agg.qdq_share:9.1%} of operator time",
        "",
        *_tables(agg),
    ]
    lines += [f"note: {note}" for note in report.notes]
    if report.trace:
        lines.append(f"trace: {report.trace} (open in https://ui.perfetto.dev)")
    return "\n".join(lines)


def _tables(agg: Aggregate) -> list[str]:
    """The slowest op types and nodes, milliseconds per run and share of operator time."""
    types = [[t.op_type, t.nodes, f"{t.ms:.3f}", f"{t.share:.1%}"] for t in agg.op_types[:TOP]]
    nodes = [[n.node, n.op_type, f"{n.ms:.3f}", f"{n.share:.1%}"] for n in agg.nodes[:TOP]]
    return [format_table(("op_type", "nodes", "ms", "share"), types), "",
            format_table(("node", "op_type", "ms", "share"), nodes)]
