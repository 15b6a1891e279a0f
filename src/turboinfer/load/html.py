"""``--html``: one self-contained page with the table, the verdicts and three charts:
latency over time, the latency CDF, and throughput against p99."""

from __future__ import annotations

import math
from html import escape
from pathlib import Path

from turboinfer.load.charts import Axis, Series, line_chart, nines_ticks
from turboinfer.load.report import format_report
from turboinfer.load.results import LoadReport

# The CDF's x axis stops at 99.999%: beyond that a run rarely has a sample.
MAX_NINES = 5.0

STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; max-width: 1000px; }
pre { background: #f6f6f6; padding: 1em; overflow-x: auto; font-size: 12px; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
"""


def latency_over_time(report: LoadReport) -> str:
    """p50 and p99 per window; runs laid end to end on one time axis."""
    series, offset = [], 0.0
    for run in report.runs:
        windows = [w for w in run.windows if w.ok]
        if not windows:
            continue
        base = offset - windows[0].start_s
        p50 = tuple((base + w.start_s + w.duration_s, w.p50_ms) for w in windows)
        p99 = tuple((base + w.start_s + w.duration_s, w.p99_ms) for w in windows)
        series += [Series(f"{run.label} p50", p50), Series(f"{run.label} p99", p99, True)]
        offset = p99[-1][0]
    return line_chart("Latency over time", series[:20], Axis("seconds"),
                      Axis("latency (ms)", log=_wide(series)))


def latency_cdf(report: LoadReport) -> str:
    series = []
    for run in report.runs:
        points = tuple((_nines(p), ms) for p, ms in run.cdf if _nines(p) <= MAX_NINES)
        if points:
            series.append(Series(run.label, points))
    return line_chart("Latency by percentile", series[:10],
                      Axis("percentile", ticks=nines_ticks),
                      Axis("latency (ms)", log=_wide(series)))


def throughput_vs_p99(report: LoadReport) -> str:
    closed = tuple((r.qps, r.latency.p99_ms) for r in report.runs
                   if r.mode == "closed" and r.ok)
    opened = tuple(sorted((r.qps, r.latency.p99_ms) for r in report.runs
                          if r.mode == "open" and r.ok))
    series = [s for s in (Series("closed loop (concurrency)", closed),
                          Series("open loop (rate)", opened)) if s.points]
    return line_chart("Throughput against p99", series, Axis("requests/s"),
                      Axis("p99 (ms)", log=_wide(series)), markers=True)


def _nines(percentile: float) -> float:
    remaining = max(1.0 - percentile / 100.0, 10 ** -MAX_NINES)
    return -math.log10(remaining)


def _wide(series: list[Series]) -> bool:
    """A log axis once values span two decades, so a stall does not flatten the rest."""
    values = [y for s in series for _, y in s.points if y > 0]
    return bool(values) and max(values) / min(values) > 100


def render_html(report: LoadReport) -> str:
    charts = [("Latency over time", latency_over_time(report)),
              ("Latency distribution", latency_cdf(report))]
    if len(report.runs) > 1:
        charts.append(("Throughput against p99", throughput_vs_p99(report)))
    title = f"turboinfer load: {report.model} at {report.url}"
    body = [f"<h1>{escape(title)}</h1>",
            f"<p>{escape(report.started_at)} · scenario {escape(report.scenario)} · "
            f"{escape(str(report.machine.get('cpu', '')))}, "
            f"{escape(str(report.machine.get('logical_cores', '?')))} logical cores</p>",
            f"<pre>{escape(format_report(report))}</pre>"]
    body += [f"<h2>{escape(name)}</h2>\n{chart}" for name, chart in charts]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def write_html(report: LoadReport, path: Path) -> None:
    path.write_text(render_html(report), encoding="utf-8")
