"""Report pages: Plotly charts and HTML tables in one self-contained file.

plotly.js is inlined once in the page head, so a report opens anywhere with no network
(no CDN, no MathJax, no fetched fonts or maps). Every chart shares one styling table so
that many series stay told apart: colour, marker and dash all vary with the index.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

# 24 colours, 8 marker symbols and 4 dashes cycle at different periods, so the first 24
# series differ in colour and no two of the first 96 share all three.
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#e7ba52", "#637939", "#ad494a",
           "#7b4173", "#3182bd", "#31a354", "#fd8d3c", "#636363", "#843c39", "#6baed6",
           "#b5cf6b", "#de9ed6", "#9c9ede")
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "triangle-down", "cross",
           "pentagon")
DASHES = ("solid", "dash", "dot", "dashdot")
HIGHLIGHT = "#d62728"
CONFIG = {"displaylogo": False, "responsive": True}

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; color: #222; max-width: 1100px;
       padding: 0 1em; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.8em; }
table { border-collapse: collapse; font-size: 13px; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; vertical-align: top; }
th { background: #f3f3f3; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.highlight td { background: #fff1f0; font-weight: 600; }
td.bad { color: #b00020; } td.good { color: #1b7f3b; }
.chart { margin: 0.5em 0 1.5em; }
"""


@dataclass(frozen=True)
class Style:
    colour: str
    symbol: str
    dash: str


def style(index: int) -> Style:
    return Style(COLOURS[index % len(COLOURS)], SYMBOLS[index % len(SYMBOLS)],
                 DASHES[index // len(COLOURS) % len(DASHES)])


def figure(title: str, x_title: str, y_title: str, *, log_x: bool = False,
           log_y: bool = False) -> go.Figure:
    """An empty figure with titled axes; the legend sits right of the plot so long
    candidate names never cover data or get clipped."""
    fig = go.Figure()
    fig.update_layout(
        title={"text": title}, height=460, template="plotly_white",
        margin={"l": 70, "r": 20, "t": 50, "b": 60}, hovermode="closest",
        legend={"font": {"size": 11}},
        xaxis={"title": {"text": x_title}, "type": "log" if log_x else "linear"},
        yaxis={"title": {"text": y_title}, "type": "log" if log_y else "linear"})
    return fig


def horizontal_line(fig: go.Figure, y: float, label: str, colour: str = HIGHLIGHT) -> None:
    """A labelled line across the plot (an SLO, a bound, a budget) that is in the legend
    and the hover, and that the y range always includes."""
    fig.add_hline(y=y, line={"color": colour, "dash": "dash", "width": 2})
    # Annotations on a log axis are placed by log10 of the value, unlike shapes and traces.
    log = fig.layout.yaxis.type == "log"
    fig.add_annotation(text=label, x=0, xref="paper", xanchor="left", yanchor="bottom",
                       y=math.log10(y) if log and y > 0 else y, showarrow=False,
                       font={"color": colour})
    # An invisible point on the line keeps it inside the autoscaled range.
    fig.add_trace(go.Scatter(x=[None], y=[y], mode="lines", name=label, hoverinfo="skip",
                             line={"color": colour, "dash": "dash", "width": 2}))


def wide(values: Iterable[float]) -> bool:
    """A log axis once values span two decades, so one stall does not flatten the rest."""
    positive = [v for v in values if v > 0]
    return bool(positive) and max(positive) / min(positive) > 100


def chart(fig: go.Figure, div_id: str) -> str:
    """The figure as a div and its drawing script; plotly.js comes from the page head."""
    html: str = fig.to_html(full_html=False, include_plotlyjs=False, config=CONFIG,
                            div_id=div_id)
    return f'<div class="chart">{html}</div>'


def number(value: float) -> str:
    """Three significant figures below 100 (0.0123, 1.23, 12.3), whole numbers above."""
    if math.isnan(value):
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def cell(value: Any) -> str:
    """A table cell: numbers right-aligned with a sensible precision, text escaped."""
    if value is None:
        return "<td>-</td>"
    if isinstance(value, bool):
        return f"<td>{'yes' if value else 'no'}</td>"
    if isinstance(value, int):
        return f'<td class="num">{value:,}</td>'
    if isinstance(value, float):
        return f'<td class="num">{number(value)}</td>'
    return f"<td>{escape(str(value))}</td>"


def verdict_cell(text: str, good: Sequence[str] = ("ok", "yes", "stable"),
                 bad: Sequence[str] = ("over", "miss", "error", "no", "drift")) -> str:
    kind = "good" if text in good else "bad" if text in bad else ""
    return f'<td class="{kind}">{escape(text)}</td>' if kind else cell(text)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]],
          highlight: int | None = None) -> str:
    """An HTML table of pre-rendered ``<td>`` cells (see ``cell``); row ``highlight``
    stands out; no header row when ``headers`` is empty."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    thead = f"<thead><tr>{head}</tr></thead>" if head else ""
    body = "".join(
        f'<tr{" class=highlight" if index == highlight else ""}>{"".join(row)}</tr>'
        for index, row in enumerate(rows))
    return f"<table>{thead}<tbody>{body}</tbody></table>"


def fields(pairs: Iterable[tuple[str, Any]]) -> str:
    """A two-column table of names and values: the facts at the top of a report."""
    return table((), [[f"<th>{escape(name)}</th>", cell(value)] for name, value in pairs])


def bullets(items: Iterable[str]) -> str:
    lines = "".join(f"<li>{escape(item)}</li>" for item in items)
    return f"<ul>{lines}</ul>" if lines else ""


def page(title: str, body: Sequence[str]) -> str:
    """The whole document: plotly.js inline in the head, then ``body`` (trusted HTML)."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{STYLE}</style>\n"
            f"<script>{get_plotlyjs()}</script>\n</head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")
