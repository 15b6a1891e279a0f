"""``report.html`` for tune, drawn from the plain dict that ``report.json`` holds.

Two interactive charts: p99 latency against batch size per candidate with the SLO as a
line; the metric against batch-1 latency with the Pareto front, the accuracy budget and
the chosen point. Then the candidates, the optimizer's variants and the notes as tables.
Working from the dict (not the report object) lets the page be redrawn from any
``report.json`` and keeps this module free of the tuner's types.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

import plotly.graph_objects as go

from turboinfer import charts

Row = Mapping[str, Any]
CANDIDATE_COLUMNS = ("candidate", "device", "metric", "budget", "p50@1 ms", "p99@1 ms", "max batch",
                     "queue delay ms", "samples/s", "plan p99 ms", "SLO", "role", "notes")
VARIANT_COLUMNS = ("variant", "kind", "calibration", "metric", "delta", "budget",
                   "p50 ms", "p99 ms", "size MB")


def render_tune_html(data: Mapping[str, Any]) -> str:
    """The page for one ``TuneReport.to_dict()``."""
    candidates: list[Row] = list(data.get("candidates") or [])
    chosen = _chosen_index(data, candidates)
    body = [f"<h1>tune: {escape(str(data['model']))}</h1>", _summary(data),
            charts.bullets(data.get("notes") or []),
            "<h2>p99 latency against batch size</h2>",
            charts.chart(latency_chart(candidates, chosen, data["slo_p99_ms"]),
                         "latency-vs-batch"),
            "<h2>Metric against latency at batch 1</h2>",
            charts.chart(accuracy_chart(data, candidates, chosen), "metric-vs-latency"),
            "<h2>Candidates</h2>", candidate_table(candidates, chosen)]
    variants = (data.get("optimize") or {}).get("variants") or []
    if variants:
        body += ["<h2>Variants</h2>", variant_table(variants)]
    return charts.page(f"turboinfer tune: {data['model']}", body)


def _chosen_index(data: Mapping[str, Any], candidates: Sequence[Row]) -> int | None:
    chosen = data.get("chosen")
    labels = [c["label"] for c in candidates]
    return labels.index(chosen["label"]) if chosen and chosen["label"] in labels else None


def _summary(data: Mapping[str, Any]) -> str:
    chosen = data.get("chosen")
    machine = data.get("machine") or {}
    rows = [("model", data["model"]), ("SLO", f"p99 <= {data['slo_p99_ms']:g} ms"),
            ("accuracy budget", f"drop <= {budget_text(data)}"),
            ("devices searched", ", ".join(data.get("devices") or ["cpu"])),
            ("chosen", chosen["label"] if chosen else "nothing chosen"),
            ("entry", data.get("entry") or "-"),
            ("machine", f"{machine.get('cpu', '?')}, "
                        f"{machine.get('logical_cores', '?')} logical cores"),
            ("elapsed", f"{data.get('elapsed_s', 0):g} s")]
    return charts.fields(rows)


def _name(c: Row, index: int, chosen: int | None) -> str:
    if index == chosen:
        return f"{c['label']} (chosen)"
    return c["label"] if c.get("servable", True) else f"{c['label']} (baseline)"


def latency_chart(candidates: Sequence[Row], chosen: int | None, slo_ms: float) -> go.Figure:
    """One line per candidate; both axes logarithmic, since one slow baseline would
    otherwise flatten every other curve."""
    fig = charts.figure("p99 latency against batch size", "batch size", "p99 latency (ms)",
                        log_x=True, log_y=True)
    sizes: set[int] = set()
    for index, c in enumerate(candidates):
        curve = c.get("curve") or []
        if not curve:
            continue
        sizes.update(p["batch_size"] for p in curve)
        look, top = charts.style(index), index == chosen
        fig.add_trace(go.Scatter(
            x=[p["batch_size"] for p in curve], y=[p["p99_ms"] for p in curve],
            customdata=[[p["p50_ms"], p["qps"]] for p in curve],
            name=_name(c, index, chosen), legendgroup=c["label"], mode="lines+markers",
            line={"color": charts.HIGHLIGHT if top else look.colour, "width": 4 if top else 1.8,
                  "dash": look.dash if c.get("servable", True) else "dot"},
            marker={"symbol": "star" if top else look.symbol, "size": 13 if top else 7},
            hovertemplate="<b>%{fullData.name}</b><br>batch %{x}<br>p99 %{y:.3f} ms<br>"
                          "p50 %{customdata[0]:.3f} ms<br>%{customdata[1]:,.0f} samples/s"
                          "<extra></extra>"))
    charts.horizontal_line(fig, slo_ms, f"SLO p99 {slo_ms:g} ms")
    fig.update_xaxes(tickvals=sorted(sizes), ticktext=[str(s) for s in sorted(sizes)])
    return fig


def _batch1(c: Row) -> Row | None:
    curve = c.get("curve") or []
    return min(curve, key=lambda p: p["batch_size"]) if curve else None


def pareto_front(points: Sequence[tuple[float, float]],
                 higher_is_better: bool) -> list[tuple[float, float]]:
    """The (latency, metric) points no other point beats on both: faster and better."""
    sign = 1.0 if higher_is_better else -1.0
    front: list[tuple[float, float]] = []
    for latency, metric in sorted(points, key=lambda p: (p[0], -sign * p[1])):
        if not front or sign * metric > sign * front[-1][1]:
            front.append((latency, metric))
    return front


def budget_floor(data: Mapping[str, Any]) -> float | None:
    """The worst metric the budget allows, as the report computed it (None: no metric)."""
    floor = data.get("budget_floor")
    return None if floor is None else float(floor)


def budget_text(data: Mapping[str, Any]) -> str:
    budget = data.get("max_accuracy_drop") or {}
    return str(budget.get("text", "-"))


def accuracy_chart(data: Mapping[str, Any], candidates: Sequence[Row],
                   chosen: int | None) -> go.Figure:
    metric = (data.get("optimize") or {}).get("metric") or {}
    unit = f" ({metric['unit']})" if metric.get("unit") else ""
    points, drawn = [], []
    for index, c in enumerate(candidates):
        first = _batch1(c)
        if first is not None and c.get("metric") is not None:
            points.append((first["p50_ms"], c["metric"]))
            drawn.append((index, c, first))
    fig = charts.figure("Metric against latency at batch 1", "p50 latency at batch 1 (ms)",
                        f"{metric.get('name', 'metric')}{unit}",
                        log_x=charts.wide(p[0] for p in points))
    for index, c, first in drawn:
        _add_point(fig, c, first, index, chosen)
    front = pareto_front(points, metric.get("higher_is_better", True))
    if len(front) > 1:
        fig.add_trace(go.Scatter(x=[p[0] for p in front], y=[p[1] for p in front],
                                 name="Pareto front", mode="lines", hoverinfo="skip",
                                 line={"color": "#555", "width": 1.5, "shape": "hv"}))
    floor = budget_floor(data)
    if floor is not None:
        charts.horizontal_line(fig, floor, f"accuracy budget: drop <= {budget_text(data)}",
                               colour="#1b7f3b")
    return fig


def _add_point(fig: go.Figure, c: Row, first: Row, index: int, chosen: int | None) -> None:
    look, top = charts.style(index), index == chosen
    verdict = {True: "within budget", False: "over budget", None: "no budget"}
    fig.add_trace(go.Scatter(
        x=[first["p50_ms"]], y=[c["metric"]], name=_name(c, index, chosen),
        legendgroup=c["label"], mode="markers",
        marker={"color": charts.HIGHLIGHT if top else look.colour, "size": 20 if top else 10,
                "symbol": "star" if top else look.symbol,
                "line": {"color": "#222", "width": 1.5 if top else 0.5}},
        customdata=[[first["p99_ms"], verdict[c.get("within_budget")]]],
        hovertemplate="<b>%{fullData.name}</b><br>metric %{y:.4g}<br>p50 %{x:.3f} ms<br>"
                      "p99 %{customdata[0]:.3f} ms<br>%{customdata[1]}<extra></extra>"))


def _slo_verdict(c: Row) -> str:
    if c.get("error"):
        return "error"
    plan = c.get("plan")
    return "ok" if plan and plan.get("meets_slo") else "miss"


def _candidate_row(c: Row, index: int, chosen: int | None) -> list[str]:
    first, plan = _batch1(c), c.get("plan") or {}
    budget = {True: "ok", False: "over", None: "-"}[c.get("within_budget")]
    role = "chosen" if index == chosen else "" if c.get("servable", True) else "baseline"
    notes = [*(c.get("notes") or []), *([c["error"]] if c.get("error") else [])]
    return [charts.cell(c["label"]), charts.cell(c.get("device", "cpu")),
            charts.cell(c.get("metric")),
            charts.verdict_cell(budget),
            charts.cell(first["p50_ms"] if first else None),
            charts.cell(first["p99_ms"] if first else None),
            charts.cell(plan.get("max_batch_size")), charts.cell(plan.get("max_queue_delay_ms")),
            charts.cell(plan.get("qps")), charts.cell(plan.get("p99_ms")),
            charts.verdict_cell(_slo_verdict(c)), charts.cell(role),
            charts.cell("; ".join(notes))]


def candidate_table(candidates: Sequence[Row], chosen: int | None) -> str:
    rows = [_candidate_row(c, index, chosen) for index, c in enumerate(candidates)]
    return charts.table(CANDIDATE_COLUMNS, rows, highlight=chosen)


def variant_table(variants: Sequence[Row]) -> str:
    rows = []
    for v in variants:
        size = v.get("size_bytes")
        budget = {True: "ok", False: "over", None: "-"}[v.get("within_budget")]
        rows.append([charts.cell(v["name"]), charts.cell(v.get("variant")),
                     charts.cell(v.get("calibration")), charts.cell(v.get("metric")),
                     charts.cell(v.get("delta")), charts.verdict_cell(budget),
                     charts.cell(v.get("p50_ms")), charts.cell(v.get("p99_ms")),
                     charts.cell(size / 1e6 if size else None)])
    return charts.table(VARIANT_COLUMNS, rows)
