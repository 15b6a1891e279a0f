"""``--html``: one self-contained page with the summary table, the verdicts and
interactive charts: latency over time, latency by percentile on a nines axis, throughput
against p99 and, for a soak, the server's memory. The p99 bound of a ``maxrate`` search
is drawn on the latency charts."""

from __future__ import annotations

import math
from html import escape
from pathlib import Path

import plotly.graph_objects as go

from turboinfer import charts
from turboinfer.load.results import LoadReport, RunResult

# The percentile axis stops at 99.999%: beyond that a run rarely has a sample.
MAX_NINES = 5
NINES_LABELS = ("0", "90", "99", "99.9", "99.99", "99.999")
CLIENT_COLUMNS = ("run", "mode", "seconds", "ok", "errors", "req/s", "p50 ms", "p90 ms",
                  "p99 ms", "p99.9 ms", "max ms", "corrected p99 ms", "stable")
SERVER_COLUMNS = ("queue ms", "compute ms", "batch", "batch efficiency", "memory MB")


def _bound(report: LoadReport) -> float | None:
    return report.maxrate.p99_bound_ms if report.maxrate else None


def _bound_line(fig: go.Figure, report: LoadReport) -> None:
    bound = _bound(report)
    if bound:
        charts.horizontal_line(fig, bound, f"p99 bound {bound:g} ms")


def latency_over_time(report: LoadReport) -> go.Figure:
    """p50 and p99 per window; runs laid end to end on one time axis."""
    traces, offset = [], 0.0
    for index, run in enumerate(report.runs):
        windows = [w for w in run.windows if w.ok]
        if not windows:
            continue
        base = offset - windows[0].start_s
        ends = [base + w.start_s + w.duration_s for w in windows]
        look = charts.style(index)
        for name, values, dash in (("p50", [w.p50_ms for w in windows], "solid"),
                                   ("p99", [w.p99_ms for w in windows], "dash")):
            traces.append(go.Scatter(
                x=ends, y=values, name=f"{run.label} {name}", legendgroup=run.label,
                mode="lines+markers", line={"color": look.colour, "dash": dash},
                marker={"symbol": look.symbol, "size": 5},
                hovertemplate=f"{escape(run.label)} {name}<br>%{{x:.1f}} s<br>"
                              "%{y:.3f} ms<extra></extra>"))
        offset = ends[-1]
    values = [v for t in traces for v in t.y]
    fig = charts.figure("Latency over time", "seconds", "latency (ms)", log_y=charts.wide(values))
    fig.add_traces(traces)
    _bound_line(fig, report)
    return fig


def nines(percentile: float) -> float:
    """A percentile on the nines axis: 90 -> 1, 99 -> 2, 99.9 -> 3."""
    remaining = max(1.0 - percentile / 100.0, 10.0 ** -MAX_NINES)
    return -math.log10(remaining)


def latency_by_percentile(report: LoadReport) -> go.Figure:
    traces = []
    for index, run in enumerate(report.runs):
        points = [(p, ms) for p, ms in run.cdf if nines(p) <= MAX_NINES]
        if not points:
            continue
        look = charts.style(index)
        traces.append(go.Scatter(
            x=[nines(p) for p, _ in points], y=[ms for _, ms in points],
            customdata=[p for p, _ in points], name=run.label, mode="lines",
            line={"color": look.colour, "dash": look.dash},
            hovertemplate=f"{escape(run.label)}<br>p%{{customdata:.4g}}<br>"
                          "%{y:.3f} ms<extra></extra>"))
    values = [v for t in traces for v in t.y]
    fig = charts.figure("Latency by percentile", "percentile", "latency (ms)",
                        log_y=charts.wide(values))
    fig.add_traces(traces)
    fig.update_xaxes(tickvals=list(range(MAX_NINES + 1)), ticktext=list(NINES_LABELS),
                     range=[0, MAX_NINES])
    _bound_line(fig, report)
    return fig


def throughput_vs_p99(report: LoadReport) -> go.Figure:
    fig = charts.figure("Throughput against p99", "requests/s", "p99 latency (ms)")
    for index, (mode, name) in enumerate((("closed", "closed loop (concurrency)"),
                                          ("open", "open loop (rate)"))):
        # In the order the load was raised: past capacity the line turns back on itself,
        # more latency for no more throughput, which is what the chart is for.
        runs = sorted((r for r in report.runs if r.mode == mode and r.ok),
                      key=lambda r: (r.concurrency or 0, r.target_rate or 0.0))
        if not runs:
            continue
        look = charts.style(index)
        fig.add_trace(go.Scatter(
            x=[r.qps for r in runs], y=[r.latency.p99_ms for r in runs],
            text=[r.label for r in runs], name=name, mode="lines+markers",
            line={"color": look.colour}, marker={"symbol": look.symbol, "size": 9},
            hovertemplate="%{text}<br>%{x:,.1f} req/s<br>p99 %{y:.3f} ms<extra></extra>"))
    values = [r.latency.p99_ms for r in report.runs]
    fig.update_yaxes(type="log" if charts.wide(values) else "linear")
    _bound_line(fig, report)
    return fig


def memory_over_time(report: LoadReport) -> go.Figure | None:
    series = report.soak.memory_series if report.soak else ()
    if not series:
        return None
    fig = charts.figure("Server memory during the soak", "seconds", "memory (MB)")
    fig.add_trace(go.Scatter(x=[s for s, _ in series], y=[mb for _, mb in series],
                             name="server memory", mode="lines+markers",
                             hovertemplate="%{x:.0f} s<br>%{y:.1f} MB<extra></extra>"))
    return fig


def _run_row(run: RunResult, with_server: bool) -> list[str]:
    lat = run.latency
    row = [charts.cell(run.label), charts.cell(run.mode), charts.cell(run.duration_s),
           charts.cell(run.ok), charts.cell(run.failed), charts.cell(run.qps),
           charts.cell(lat.p50_ms), charts.cell(lat.p90_ms), charts.cell(lat.p99_ms),
           charts.cell(lat.p999_ms), charts.cell(lat.max_ms), charts.cell(run.corrected_p99_ms),
           charts.verdict_cell({True: "yes", False: "no", None: "-"}[run.stable])]
    if with_server:
        s = run.server
        values = ((s.queue_ms, s.compute_ms, s.avg_batch_size, s.batch_efficiency,
                   s.memory_mb) if s else (None,) * len(SERVER_COLUMNS))
        row += [charts.cell(v) for v in values]
    return row


def summary_table(report: LoadReport) -> str:
    with_server = any(run.server is not None for run in report.runs)
    headers = CLIENT_COLUMNS + (SERVER_COLUMNS if with_server else ())
    return charts.table(headers, [_run_row(run, with_server) for run in report.runs])


def verdicts(report: LoadReport) -> list[str]:
    """The maxrate and soak findings, validity and warnings, one line each."""
    lines = []
    m = report.maxrate
    if m is not None:
        tried = ", ".join(f"{rate:g} {'pass' if ok else 'fail'}" for rate, ok in m.trials)
        lines.append(f"max rate with p99 <= {m.p99_bound_ms:g} ms and < {m.max_error_rate:.0%} "
                     f"errors: {m.max_rate:g} req/s (capacity {m.capacity_qps:,.0f} req/s; "
                     f"tried {tried})")
    s = report.soak
    if s is not None:
        lines.append(f"soak: {s.verdict}: p99 {s.p99_first_ms:.2f} -> {s.p99_last_ms:.2f} ms "
                     f"({s.p99_ratio:.2f}x)" + "".join(f"; {r}" for r in s.reasons))
    valid, reasons = report.validity()
    lines.append("valid: yes" if valid else "valid: NO (" + "; ".join(reasons) + ")")
    warnings = [w for run in report.runs for w in run.warnings] + report.warnings
    return lines + [f"warning: {w}" for w in warnings]


def render_html(report: LoadReport) -> str:
    figures = [("latency-over-time", latency_over_time(report)),
               ("latency-by-percentile", latency_by_percentile(report))]
    if len(report.runs) > 1:
        figures.append(("throughput-vs-p99", throughput_vs_p99(report)))
    memory = memory_over_time(report)
    if memory is not None:
        figures.append(("memory-over-time", memory))
    title = f"turboinfer load: {report.model} at {report.url}"
    body = [f"<h1>{escape(title)}</h1>",
            charts.fields([("started", report.started_at), ("scenario", report.scenario),
                           ("protocol", f"{report.protocol} ({report.encoding})"),
                           ("machine", f"{report.machine.get('cpu', '?')}, "
                                       f"{report.machine.get('logical_cores', '?')} "
                                       "logical cores")]),
            "<h2>Summary</h2>", summary_table(report), charts.bullets(verdicts(report))]
    body += [charts.chart(fig, div_id) for div_id, fig in figures]
    return charts.page(title, body)


def write_html(report: LoadReport, path: Path) -> None:
    path.write_text(render_html(report), encoding="utf-8")
