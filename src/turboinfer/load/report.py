"""The report for people: one table row per load point, then verdicts and warnings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from turboinfer.load.results import LoadReport, RunResult
from turboinfer.output import format_table

CLIENT_COLUMNS = ("run", "qps", "p50_ms", "p90_ms", "p99_ms", "p99.9_ms", "max_ms", "errors")
SERVER_COLUMNS = ("queue_ms", "compute_ms", "batch", "mem_mb")
# With a server that pre- and post-processes, its time splits four ways.
PREPOST_COLUMNS = ("pre_ms", "queue_ms", "compute_ms", "post_ms", "batch", "mem_mb")


def _client_cells(run: RunResult) -> list[Any]:
    lat = run.latency
    stable = {True: "", False: " (unstable)", None: ""}[run.stable]
    return [run.label + stable, run.qps, lat.p50_ms, lat.p90_ms, lat.p99_ms, lat.p999_ms,
            lat.max_ms, run.failed]


def _server_cells(run: RunResult, prepost: bool) -> list[Any]:
    server = run.server
    if server is None:
        return ["-"] * len(PREPOST_COLUMNS if prepost else SERVER_COLUMNS)
    values: tuple[float | None, ...] = (server.queue_ms, server.compute_ms,
                                        server.avg_batch_size, server.memory_mb)
    if prepost:
        values = (server.preprocess_ms, server.queue_ms, server.compute_ms,
                  server.postprocess_ms, server.avg_batch_size, server.memory_mb)
    return ["-" if v is None else v for v in values]


def _prepost(report: LoadReport) -> bool:
    return any(run.server is not None and (run.server.preprocess_ms is not None
                                           or run.server.postprocess_ms is not None)
               for run in report.runs)


def format_report(report: LoadReport) -> str:
    lines = [f"server: {report.url}  model: {report.model}  protocol: {report.protocol} "
             f"({report.encoding})  scenario: {report.scenario}"]
    has_server = any(run.server is not None for run in report.runs)
    prepost = _prepost(report)
    server_columns = PREPOST_COLUMNS if prepost else SERVER_COLUMNS
    headers = CLIENT_COLUMNS + (server_columns if has_server else ())
    rows = [_client_cells(r) + (_server_cells(r, prepost) if has_server else [])
            for r in report.runs]
    if rows:
        lines.append(format_table(headers, rows))
    lines += _batching_lines(report)
    lines += _maxrate_lines(report)
    lines += _soak_lines(report)
    valid, reasons = report.validity()
    lines.append("valid: yes" if valid else "valid: NO (" + "; ".join(reasons) + ")")
    warnings = [w for run in report.runs for w in run.warnings] + report.warnings
    lines += [f"warning: {w}" for w in warnings]
    return "\n".join(lines)


def _batching_lines(report: LoadReport) -> list[str]:
    out = []
    for run in report.runs:
        server = run.server
        if server is None or server.batch_efficiency is None:
            continue
        out.append(f"{run.label}: server batch {server.avg_batch_size:.2f} of "
                   f"max {server.max_batch_size} (efficiency {server.batch_efficiency:.0%})")
    return out


def _maxrate_lines(report: LoadReport) -> list[str]:
    m = report.maxrate
    if m is None:
        return []
    tried = ", ".join(f"{rate:g}{'✓' if ok else '✗'}" for rate, ok in m.trials)
    return [f"max rate with p99 <= {m.p99_bound_ms:g} ms and < {m.max_error_rate:.0%} "
            f"errors: {m.max_rate:g} req/s (capacity {m.capacity_qps:,.0f} req/s; "
            f"tried {tried})"]


def _soak_lines(report: LoadReport) -> list[str]:
    s = report.soak
    if s is None:
        return []
    line = (f"soak: {s.verdict}: p99 {s.p99_first_ms:.2f} -> {s.p99_last_ms:.2f} ms "
            f"({s.p99_ratio:.2f}x)")
    if s.memory_growth is not None:
        line += (f", server memory {s.memory_first_mb:.0f} -> {s.memory_last_mb:.0f} MB "
                 f"({s.memory_growth:+.1%})")
    return [line] + [f"  {reason}" for reason in s.reasons]


def to_json(report: LoadReport) -> bytes:
    return orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2)


def write_json(report: LoadReport, path: Path) -> None:
    path.write_bytes(to_json(report) + b"\n")
