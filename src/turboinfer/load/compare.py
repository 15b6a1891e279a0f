"""``turboinfer load compare A.json B.json``: the candidate's numbers as ratios of the
baseline's, load point by load point (matched by label)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from turboinfer.errors import InvalidInputError
from turboinfer.load.results import REPORT_FORMAT
from turboinfer.output import format_table

# (report key, column name, higher is better)
METRICS = (
    ("qps", "qps", True),
    ("p50_ms", "p50", False),
    ("p90_ms", "p90", False),
    ("p99_ms", "p99", False),
    ("p999_ms", "p99.9", False),
    ("max_ms", "max", False),
    ("error_rate", "errors", False),
)


def read_report(path: Path) -> dict[str, Any]:
    try:
        doc = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise InvalidInputError(f"cannot read {path}: {exc.strerror or exc}") from None
    except orjson.JSONDecodeError as exc:
        raise InvalidInputError(f"{path} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != REPORT_FORMAT:
        raise InvalidInputError(f"{path} is not a 'turboinfer load --output' report")
    return doc


def _point(run: dict[str, Any]) -> dict[str, float]:
    values = {key: float(run["latency"][key]) for key, _, _ in METRICS
              if key in run.get("latency", {})}
    values["qps"] = float(run["qps"])
    values["error_rate"] = float(run.get("error_rate", 0.0))
    return values


def _ratio(base: float, new: float) -> float | None:
    return new / base if base else None


def compare(baseline: dict[str, Any], candidate: dict[str, Any]) -> dict[str, Any]:
    """Ratios candidate/baseline per shared load point, with which side each favours."""
    base_runs = {run["label"]: _point(run) for run in baseline["runs"]}
    rows = []
    for run in candidate["runs"]:
        if run["label"] not in base_runs:
            continue
        base, new = base_runs[run["label"]], _point(run)
        ratios = {key: _ratio(base[key], new[key]) for key, _, _ in METRICS if key in base}
        rows.append({"label": run["label"], "baseline": base, "candidate": new,
                     "ratios": ratios})
    result: dict[str, Any] = {
        "baseline": {"url": baseline["url"], "model": baseline["model"],
                     "started_at": baseline.get("started_at", "")},
        "candidate": {"url": candidate["url"], "model": candidate["model"],
                      "started_at": candidate.get("started_at", "")},
        "points": rows,
        "unmatched": sorted(set(base_runs) ^ {r["label"] for r in candidate["runs"]}),
    }
    base_max = (baseline.get("maxrate") or {}).get("max_rate")
    new_max = (candidate.get("maxrate") or {}).get("max_rate")
    if base_max is not None and new_max is not None:
        result["maxrate"] = {"baseline": base_max, "candidate": new_max,
                             "ratio": _ratio(base_max, new_max)}
    return result


def compare_files(baseline: Path, candidate: Path) -> dict[str, Any]:
    result = compare(read_report(baseline), read_report(candidate))
    if not result["points"] and "maxrate" not in result:
        raise InvalidInputError(f"{baseline} and {candidate} share no load point "
                                f"(labels: {', '.join(result['unmatched'])})")
    return result


def format_comparison(result: dict[str, Any]) -> str:
    """A table of ratios; '+' marks where the candidate is better, '-' worse."""
    headers = ["run"] + [name for _, name, _ in METRICS]
    rows = [[point["label"]] + [_cell(point["ratios"].get(key), better)
                                for key, _, better in METRICS]
            for point in result["points"]]
    lines = [f"baseline:  {result['baseline']['url']} ({result['baseline']['model']})",
             f"candidate: {result['candidate']['url']} ({result['candidate']['model']})",
             "candidate / baseline (+ better, - worse):"]
    if rows:
        lines.append(format_table(headers, rows))
    if "maxrate" in result:
        m = result["maxrate"]
        lines.append(f"max rate: {m['baseline']:g} -> {m['candidate']:g} req/s "
                     f"({_cell(m['ratio'], True)})")
    if result["unmatched"]:
        lines.append("only in one report: " + ", ".join(result["unmatched"]))
    return "\n".join(lines)


def _cell(ratio: float | None, higher_is_better: bool) -> str:
    if ratio is None:
        return "-"
    if abs(ratio - 1.0) < 0.02:
        return f"{ratio:.2f}x"
    better = ratio > 1.0 if higher_is_better else ratio < 1.0
    return f"{ratio:.2f}x{'+' if better else '-'}"
