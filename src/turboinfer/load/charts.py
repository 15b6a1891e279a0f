"""Line charts as inline SVG: no script, no CDN, one file that opens anywhere."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 640, 300
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 64, 150, 28, 44
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf")


@dataclass(frozen=True)
class Series:
    name: str
    points: tuple[tuple[float, float], ...]
    dashed: bool = False


@dataclass(frozen=True)
class Axis:
    label: str
    log: bool = False
    ticks: Callable[[float, float], list[tuple[float, str]]] | None = None


def _scale(lo: float, hi: float, log: bool, size: float, flip: bool) -> Callable[[float], float]:
    if log:
        lo, hi = math.log10(max(lo, 1e-9)), math.log10(max(hi, 1e-9))
    span = (hi - lo) or 1.0

    def to_px(value: float) -> float:
        v = math.log10(max(value, 1e-9)) if log else value
        frac = (v - lo) / span
        return size * (1 - frac) if flip else size * frac

    return to_px


def _default_ticks(lo: float, hi: float, log: bool) -> list[tuple[float, str]]:
    if log:
        first, last = math.floor(math.log10(max(lo, 1e-9))), math.ceil(math.log10(hi))
        return [(10.0 ** e, f"{10.0 ** e:g}") for e in range(first, last + 1)]
    step = 10 ** math.floor(math.log10((hi - lo) or 1.0))
    while (hi - lo) / step > 8:
        step *= 2
    start = math.ceil(lo / step) * step
    count = int((hi - start) / step) + 1
    return [(start + i * step, f"{start + i * step:g}") for i in range(count)]


def _bounds(values: Sequence[float], log: bool) -> tuple[float, float]:
    usable = [v for v in values if v > 0] if log else list(values)
    if not usable:
        return (1.0, 10.0) if log else (0.0, 1.0)
    lo, hi = min(usable), max(usable)
    if not log:
        lo = min(lo, 0.0)
    if hi <= lo:
        hi = lo * 10 if log else lo + 1.0
    return lo, hi


def line_chart(title: str, series: Sequence[Series], x: Axis, y: Axis, *,
               markers: bool = False) -> str:
    plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT
    plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
    xs = [px for s in series for px, _ in s.points]
    ys = [py for s in series for _, py in s.points]
    x_lo, x_hi = _bounds(xs, x.log)
    y_lo, y_hi = _bounds(ys, y.log)
    to_x = _scale(x_lo, x_hi, x.log, plot_w, flip=False)
    to_y = _scale(y_lo, y_hi, y.log, plot_h, flip=True)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11">',
             f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" font-size="13">'
             f"{escape(title)}</text>",
             f'<g transform="translate({MARGIN_LEFT},{MARGIN_TOP})">',
             f'<rect width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>']
    parts += _ticks(x, x_lo, x_hi, to_x, plot_h, horizontal=True)
    parts += _ticks(y, y_lo, y_hi, to_y, plot_w, horizontal=False)
    for i, s in enumerate(series):
        parts += _series(s, COLORS[i % len(COLORS)], to_x, to_y, markers, i, plot_w)
    parts.append(f'<text x="{plot_w / 2}" y="{plot_h + 34}" text-anchor="middle">'
                 f"{escape(x.label)}</text>")
    parts.append(f'<text transform="translate(-48,{plot_h / 2}) rotate(-90)" '
                 f'text-anchor="middle">{escape(y.label)}</text>')
    parts.append("</g></svg>")
    return "\n".join(parts)


def _ticks(axis: Axis, lo: float, hi: float, to_px: Callable[[float], float], length: float,
           *, horizontal: bool) -> list[str]:
    ticks = axis.ticks(lo, hi) if axis.ticks else _default_ticks(lo, hi, axis.log)
    out = []
    for value, text in ticks:
        pos = to_px(value)
        if not -0.5 <= pos <= (length if not horizontal else to_px(hi)) + 0.5:
            continue
        if horizontal:
            out.append(f'<line x1="{pos:.1f}" x2="{pos:.1f}" y1="0" y2="{length}" '
                       f'stroke="#eee"/><text x="{pos:.1f}" y="{length + 14}" '
                       f'text-anchor="middle">{escape(text)}</text>')
        else:
            out.append(f'<line x1="0" x2="{length}" y1="{pos:.1f}" y2="{pos:.1f}" '
                       f'stroke="#eee"/><text x="-6" y="{pos + 4:.1f}" '
                       f'text-anchor="end">{escape(text)}</text>')
    return out


def _series(s: Series, color: str, to_x: Callable[[float], float],
            to_y: Callable[[float], float], markers: bool, index: int,
            plot_w: float) -> list[str]:
    coords = " ".join(f"{to_x(px):.1f},{to_y(py):.1f}" for px, py in s.points)
    dash = ' stroke-dasharray="5,3"' if s.dashed else ""
    out = [f'<polyline points="{coords}" fill="none" stroke="{color}" '
           f'stroke-width="1.6"{dash}/>']
    if markers:
        out += [f'<circle cx="{to_x(px):.1f}" cy="{to_y(py):.1f}" r="3" fill="{color}"/>'
                for px, py in s.points]
    legend_y = 10 + 16 * index
    out.append(f'<line x1="{plot_w + 10}" x2="{plot_w + 28}" y1="{legend_y}" '
               f'y2="{legend_y}" stroke="{color}" stroke-width="2"{dash}/>'
               f'<text x="{plot_w + 32}" y="{legend_y + 4}">{escape(s.name)}</text>')
    return out


def nines_ticks(lo: float, hi: float) -> list[tuple[float, str]]:
    """Ticks for a percentile axis plotted as -log10(1 - p): 0, 90, 99, 99.9..."""
    labels = ["0", "90", "99", "99.9", "99.99", "99.999"]
    return [(float(i), labels[i]) for i in range(len(labels)) if i <= math.ceil(hi)]
