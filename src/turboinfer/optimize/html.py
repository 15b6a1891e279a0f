"""``report.html`` for tune: self-contained (inline SVG, no scripts, no downloads).

Two plots: p99 latency against batch size, one line per candidate; and metric against
batch-1 latency, one point per candidate. The chosen candidate is drawn in red.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from turboinfer.output import format_table

if TYPE_CHECKING:
    from turboinfer.optimize.tune_report import TuneReport

WIDTH, HEIGHT, PAD = 640, 360, 50
PALETTE = ("#4e79a7", "#f28e2b", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac")
CHOSEN = "#d62728"

Point = tuple[float, float]


def _scale(values: Sequence[float]) -> tuple[float, float]:
    low, high = min(values), max(values)
    if high - low < 1e-12:
        low, high = low - 1.0, high + 1.0
    return low, high


def _log(value: float) -> float:
    return math.log10(max(value, 1e-9))


def _svg(series: Sequence[tuple[str, Sequence[Point], str, bool]], x_label: str,
         y_label: str, lines: bool, log_x: bool = False, log_y: bool = False) -> str:
    """An SVG plot of ``(label, points, colour, highlighted)`` series.

    Latency axes are logarithmic: one slow baseline (torch eager, an overloaded thread
    setting) would otherwise flatten every other curve against the axis.
    """
    fx = _log if log_x else float
    fy = _log if log_y else float
    xs = [fx(x) for _, pts, _, _ in series for x, _ in pts] or [0.0]
    ys = [fy(y) for _, pts, _, _ in series for _, y in pts] or [0.0]
    (x0, x1), (y0, y1) = _scale(xs), _scale(ys)
    shown_x = (lambda v: 10**v) if log_x else (lambda v: v)
    shown_y = (lambda v: 10**v) if log_y else (lambda v: v)

    def at(x: float, y: float) -> str:
        px = PAD + (fx(x) - x0) / (x1 - x0) * (WIDTH - 2 * PAD)
        py = HEIGHT - PAD - (fy(y) - y0) / (y1 - y0) * (HEIGHT - 2 * PAD)
        return f"{px:.1f},{py:.1f}"

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}">',
             f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white" stroke="#ccc"/>',
             f'<text x="{WIDTH / 2}" y="{HEIGHT - 10}" text-anchor="middle">{x_label}</text>',
             f'<text x="12" y="{HEIGHT / 2}" transform="rotate(-90 12 {HEIGHT / 2})" '
             f'text-anchor="middle">{y_label}</text>',
             f'<text x="{PAD}" y="{HEIGHT - PAD + 15}">{shown_x(x0):.3g}</text>',
             f'<text x="{WIDTH - PAD}" y="{HEIGHT - PAD + 15}" '
             f'text-anchor="end">{shown_x(x1):.3g}</text>',
             f'<text x="{PAD - 5}" y="{HEIGHT - PAD}" text-anchor="end">{shown_y(y0):.4g}</text>',
             f'<text x="{PAD - 5}" y="{PAD}" text-anchor="end">{shown_y(y1):.4g}</text>']
    for label, points, colour, chosen in series:
        width = 3 if chosen else 1.5
        title = f"<title>{html.escape(label)}</title>"
        if lines and len(points) > 1:
            path = " ".join(at(x, y) for x, y in points)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" '
                         f'stroke-width="{width}">{title}</polyline>')
        for x, y in points:
            cx, cy = at(x, y).split(",")
            parts.append(f'<circle cx="{cx}" cy="{cy}" r="{6 if chosen else 4}" '
                         f'fill="{colour}">{title}</circle>')
    parts.append("</svg>")
    return "\n".join(parts)


def _legend(series: Sequence[tuple[str, Sequence[Point], str, bool]]) -> str:
    items = [f'<span style="color:{c}">&#9679; {html.escape(label)}'
             f'{" (chosen)" if chosen else ""}</span>' for label, _, c, chosen in series]
    return "<p>" + " &nbsp; ".join(items) + "</p>"


def render_tune_html(report: TuneReport) -> str:
    curves, scatter = [], []
    for index, m in enumerate(report.candidates):
        chosen = index == report.chosen
        colour = CHOSEN if chosen else PALETTE[index % len(PALETTE)]
        label = m.candidate.label
        if m.curve:
            curves.append((label, [(p.batch_size, p.p99_ms) for p in m.curve], colour, chosen))
            if m.candidate.metric is not None:
                scatter.append((label, [(m.curve[0].p50_ms, m.candidate.metric)], colour,
                                chosen))
    from turboinfer.optimize.tune_report import TABLE_COLUMNS

    table = format_table(TABLE_COLUMNS, report.table_rows())
    metric = report.optimize.metric
    metric_label = f"{metric.name} ({metric.unit})" if metric else "metric"
    best = report.best
    summary = best.candidate.label if best else "nothing chosen"
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in report.notes)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>turboinfer tune: {html.escape(report.model)}</title>
<style>body{{font-family:sans-serif;margin:2em}} pre{{background:#f6f6f6;padding:1em}}</style>
</head><body>
<h1>tune: {html.escape(report.model)}</h1>
<p>SLO p99 {report.settings.slo_p99_ms:g} ms, accuracy budget {report.settings.budget};
chosen: <b>{html.escape(summary)}</b>; entry: {html.escape(str(report.entry))}</p>
<ul>{notes}</ul>
<h2>Latency vs batch size (p99)</h2>
{_svg(curves, "batch size (log)", "p99 ms (log)", lines=True, log_x=True, log_y=True)}
{_legend(curves)}
<h2>Accuracy vs latency (batch 1, p50)</h2>
{_svg(scatter, "p50 ms at batch 1 (log)", metric_label, lines=False, log_x=True)}
{_legend(scatter)}
<h2>Candidates</h2>
<pre>{html.escape(table)}</pre>
</body></html>
"""
