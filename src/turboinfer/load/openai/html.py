"""``--html``: one self-contained page (plotly.js inlined, no CDN) with the text table,
per-request latencies over the run, the latency distributions and output tokens/s."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

import numpy as np

from turboinfer.load.openai.report import LlmLoadReport, format_text

STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; max-width: 1000px; }
pre { background: #f6f6f6; padding: 1em; overflow-x: auto; font-size: 12px; }
"""


def _ok(report: LlmLoadReport) -> list[dict[str, Any]]:
    return [r for r in report.requests if r["error"] is None]


def latency_over_run(report: LlmLoadReport) -> Any:
    import plotly.graph_objects as go  # heavy: loaded only when a report is written

    done = sorted(_ok(report), key=lambda r: r["start_s"])
    starts = [r["start_s"] for r in done]
    fig = go.Figure()
    for key in ("ttft_ms", "e2el_ms"):
        fig.add_trace(go.Scatter(x=starts, y=[r[key] for r in done], mode="markers",
                                 name=key[:-3].upper()))
    fig.update_layout(title="Per request, by send time", xaxis_title="seconds into the run",
                      yaxis_title="ms")
    return fig


def distributions(report: LlmLoadReport) -> Any:
    import plotly.graph_objects as go  # heavy: loaded only when a report is written

    done = _ok(report)
    series = {"TTFT": [r["ttft_ms"] for r in done],
              "TPOT": [r["tpot_ms"] for r in done if r["output_tokens"] > 1],
              "ITL": [gap for r in done for gap in r["itl_ms"]],
              "E2EL": [r["e2el_ms"] for r in done]}
    fig = go.Figure()
    for name, values in series.items():
        ordered = np.sort(np.asarray(values, dtype=np.float64))
        share = np.arange(1, len(ordered) + 1) / max(len(ordered), 1) * 100
        fig.add_trace(go.Scatter(x=ordered, y=share, mode="lines", name=name))
    fig.update_layout(title="Latency distributions (CDF)", xaxis_title="ms",
                      xaxis_type="log", yaxis_title="percent of samples")
    return fig


def tokens_per_second(report: LlmLoadReport) -> Any:
    """Output chunks per one-second bucket of the run (a chunk is usually one token)."""
    import plotly.graph_objects as go  # heavy: loaded only when a report is written

    stamps = []
    for r in _ok(report):
        first = r["start_s"] + r["ttft_ms"] / 1e3
        stamps += (first + np.concatenate(([0.0], np.cumsum(r["itl_ms"]) / 1e3))).tolist()
    counts = np.bincount(np.asarray(stamps, dtype=np.int64)) if stamps else np.zeros(0)
    fig = go.Figure(go.Bar(x=np.arange(len(counts)), y=counts, name="chunks"))
    fig.update_layout(title="Streamed chunks per second", xaxis_title="second of the run",
                      yaxis_title="chunks/s")
    return fig


def render_html(report: LlmLoadReport) -> str:
    figures = [latency_over_run(report), distributions(report), tokens_per_second(report)]
    charts = [fig.to_html(full_html=False, include_plotlyjs=(i == 0))
              for i, fig in enumerate(figures)]
    title = f"turboinfer llm load: {report.model or '?'} at {report.settings['url']}"
    body = [f"<h1>{escape(title)}</h1>", f"<p>{escape(report.started_at)}</p>",
            f"<pre>{escape(format_text(report))}</pre>", *charts]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def write_html(report: LlmLoadReport, path: Path) -> None:
    path.write_text(render_html(report), encoding="utf-8")
