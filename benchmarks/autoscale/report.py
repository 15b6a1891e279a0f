"""The HTML report of an autoscaling run: instances, rate and p99 over time.

    python benchmarks/autoscale/report.py [results.json] [-o report.html]

One self-contained page (plotly.js inlined, as the tune and load reports): the machine
and the configuration, the three timelines on one time axis with the phases and the
scale events marked, and the log line of every decision.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from turboinfer import charts

HERE = Path(__file__).resolve().parent


def _events(fig: go.Figure, result: dict[str, Any]) -> None:
    for event in result["events"]:
        kind = event["line"].split(" ", 1)[0]
        fig.add_vline(x=event["t"], line={"color": "#999", "dash": "dot", "width": 1})
        fig.add_annotation(x=event["t"], y=1, yref="paper", text=kind, showarrow=False,
                           textangle=-90, xanchor="right", yanchor="top",
                           font={"size": 10, "color": "#666"})


def _phases(fig: go.Figure, result: dict[str, Any]) -> None:
    for index, phase in enumerate(result["phases"]):
        windows = phase["windows"]
        if not windows:
            continue
        end = windows[-1]["start_s"] + windows[-1]["duration_s"]
        fig.add_vrect(x0=phase["start_s"], x1=end, fillcolor=charts.style(index).colour,
                      opacity=0.07, line_width=0, annotation_text=phase["name"],
                      annotation_position="top left")


def instances_chart(result: dict[str, Any]) -> str:
    samples = result["samples"]
    fig = charts.figure("Instances", "seconds", "instances")
    fig.add_trace(go.Scatter(x=[s["t"] for s in samples], y=[s["instances"] for s in samples],
                             mode="lines", line={"shape": "hv", "width": 3},
                             name="instances (server /metrics)"))
    fig.update_yaxes(rangemode="tozero", dtick=1)
    _phases(fig, result)
    _events(fig, result)
    return charts.chart(fig, "instances")


def rate_chart(result: dict[str, Any]) -> str:
    fig = charts.figure("Request rate", "seconds", "requests/s")
    windows = [w for p in result["phases"] for w in p["windows"]]
    look = charts.style(0)
    fig.add_trace(go.Scatter(x=[w["start_s"] + w["duration_s"] for w in windows],
                             y=[w["qps"] for w in windows], mode="lines+markers",
                             name="answered (client, 1 s windows)",
                             line={"color": look.colour},
                             marker={"symbol": look.symbol, "size": 4}))
    samples = result["samples"]
    pairs = list(itertools.pairwise(samples))
    fig.add_trace(go.Scatter(x=[b["t"] for _, b in pairs],
                             y=[(b["success"] - a["success"]) / (b["t"] - a["t"])
                                for a, b in pairs],
                             mode="lines", name="answered (server /metrics)",
                             line={"color": charts.style(2).colour, "width": 1}))
    offered = [(p["start_s"], p["target_rate"]) for p in result["phases"] if p["target_rate"]]
    for start, target in offered:
        phase = next(p for p in result["phases"] if p["start_s"] == start)
        end = phase["windows"][-1]["start_s"] + phase["windows"][-1]["duration_s"]
        fig.add_trace(go.Scatter(x=[start, end], y=[target, target], mode="lines",
                                 name=f"offered {target:g}/s",
                                 line={"color": charts.style(1).colour, "dash": "dash"}))
    charts.horizontal_line(fig, result["autoscaling_defaults"]["scale_down_rate_qps"],
                           "scale-down threshold")
    _phases(fig, result)
    return charts.chart(fig, "rate")


def p99_chart(result: dict[str, Any]) -> str:
    windows = [w for p in result["phases"] for w in p["windows"] if w["ok"]]
    values = [w["p99_ms"] for w in windows]
    fig = charts.figure("p99 latency per 1 s window", "seconds", "p99 (ms)",
                        log_y=charts.wide(values))
    fig.add_trace(go.Scatter(x=[w["start_s"] + w["duration_s"] for w in windows], y=values,
                             mode="lines+markers", name="p99 (client)",
                             marker={"size": 4}))
    _phases(fig, result)
    _events(fig, result)
    return charts.chart(fig, "p99")


def render(result: dict[str, Any]) -> str:
    machine = result["machine"]
    counts = [s["instances"] for s in result["samples"]]
    facts = charts.fields([
        ("CPU", machine["cpu"]),
        ("cores (usable)", f"{machine['cores']} ({machine['usable_cores']})"),
        ("load average before / after", f"{machine['load_average_before'][0]:.2f} / "
                                        f"{machine['load_average_after'][0]:.2f}"),
        ("model", f"{result['model']}, {result['rows_per_request']} rows per request"),
        ("model config", json.dumps(result["config"])),
        ("one instance (probe, concurrency 4)", f"{result['one_instance_capacity_qps']:.1f}/s"),
        ("step rate", f"{result['step_rate']:g}/s"),
        ("instances min / max seen", f"{min(counts):g} / {max(counts):g}"),
        ("failed requests (client / server)",
         f"{result['failed_requests']} / {result['server_failures']:g}"),
        ("cold start (server) / first request after idle",
         f"{result['cold_start_seconds'] or 0:.3f} s / {result['cold_request']['seconds']:.3f} s"),
    ])
    phases = charts.table(
        ["phase", "from (s)", "offered/s", "answered/s", "ok", "failed", "p99 (ms)"],
        [[charts.cell(p["name"]), charts.cell(p["start_s"]), charts.cell(p["target_rate"]),
          charts.cell(p["qps"]), charts.cell(p["ok"]), charts.cell(p["failed"]),
          charts.cell(p["p99_ms"])] for p in result["phases"]])
    events = charts.table(["t (s)", "decision"], [[charts.cell(e["t"]), charts.cell(e["line"])]
                                                  for e in result["events"]])
    return charts.page("turboinfer autoscaling: step load, then quiet", [
        "<h1>Autoscaling: step load, then quiet</h1>", facts,
        "<h2>Timeline</h2>", instances_chart(result), rate_chart(result), p99_chart(result),
        "<h2>Phases</h2>", phases, "<h2>Scale decisions (server log)</h2>", events])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, nargs="?", default=HERE / "results.json")
    parser.add_argument("-o", "--output", type=Path, default=HERE / "report.html")
    args = parser.parse_args()
    args.output.write_text(render(json.loads(args.results.read_text())))
    print(f"written {args.output}")


if __name__ == "__main__":
    main()
