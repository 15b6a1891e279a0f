"""The tune report page: drawn from the dict ``report.json`` holds, rendered in headless
Chromium with no network."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from report_browser import render
from turboinfer.optimize.report import budget_dict
from turboinfer.optimize.search.batching import CurvePoint, plan_batching
from turboinfer.optimize.search.candidates import Candidate, Measured
from turboinfer.optimize.search.html import budget_floor, pareto_front, render_tune_html
from turboinfer.optimize.settings import AccuracyBudget, Variant

SLO_MS = 5.0
REFERENCE = 98.3
# (variant name, kind, metric, batch-1 p50 ms at one thread)
VARIANTS = [("fp32", Variant.FP32, REFERENCE, 1.6), ("graph", Variant.GRAPH, REFERENCE, 1.4),
            ("fp16", Variant.FP16, 98.2, 1.9), ("int8-dynamic", Variant.INT8_DYNAMIC, 97.9, 1.1),
            ("int8-static-minmax", Variant.INT8_STATIC, 97.0, 0.7),
            ("int8-static-entropy", Variant.INT8_STATIC, 97.6, 0.75),
            ("int8-static-percentile", Variant.INT8_STATIC, 96.9, 0.72),
            ("int4", Variant.INT4, 91.2, 1.2), ("mixed", Variant.MIXED, 97.8, 0.9)]
ENGINES = [("onnxruntime", 1, 1.0), ("onnxruntime", 2, 0.6), ("openvino", 2, 0.8)]
BATCH_SIZES = (1, 4, 16, 64)


def _measured(name: str, kind: Variant, metric: float, p50: float, engine: str,
              threads: int) -> Measured:
    # Latency grows sub-linearly with the batch, p99 a fixed factor above p50: the shape
    # a real sweep has, with numbers that put some candidates over the SLO at batch 64.
    curve = tuple(CurvePoint(b, p50 * b ** 0.7, p50 * b ** 0.7 * 1.4, b / (p50 * b ** 0.7) * 1e3)
                  for b in BATCH_SIZES)
    candidate = Candidate(name, kind, Path(f"/work/{name}.onnx"), engine, threads, metric,
                          REFERENCE - metric <= 1 + 1e-9)
    notes = ("mixed precision kept 3 layers in float",) if kind is Variant.MIXED else ()
    return Measured(candidate, curve, plan_batching(curve, SLO_MS), notes=notes)


def tune_dict() -> dict[str, Any]:
    """A report of ``TuneReport.to_dict()``'s shape: 27 candidates plus the torch
    baseline, the candidates drawn by the tuner's own types."""
    measured = [_measured(name, kind, metric, p50 * factor, engine, threads)
                for name, kind, metric, p50 in VARIANTS for engine, threads, factor in ENGINES]
    baseline = Measured(Candidate("fp32", Variant.FP32, Path("/work/fp32.onnx"), "torch", 2,
                                  REFERENCE, True),
                        tuple(CurvePoint(b, 6.0 * b, 9.0 * b, b / (6.0 * b) * 1e3)
                              for b in BATCH_SIZES))
    failed = Measured(Candidate("int4", Variant.INT4, Path("/work/int4.onnx"), "openvino", 1),
                      error="openvino cannot read MatMulNBits")
    candidates = [m.to_dict() for m in (*measured, baseline, failed)]
    chosen = next(c for c in candidates if c["label"] == "int8-static-entropy/onnxruntime/t2")
    return {
        "model": "digits-cnn", "name": "digits-cnn", "slo_p99_ms": SLO_MS,
        "max_accuracy_drop": {"value": 1.0, "relative": False, "text": "1"},
        "budget_floor": REFERENCE - 1.0, "chosen": chosen, "entry": "/work/repo/digits-cnn/1",
        "candidates": candidates,
        "optimize": {"model": "digits-cnn",
                     "metric": {"name": "accuracy", "unit": "%", "higher_is_better": True,
                                "reference": REFERENCE},
                     "budget": {"value": 1.0, "relative": False, "text": "1",
                                "floor": REFERENCE - 1.0},
                     "variants": [{"name": name, "variant": kind.value, "calibration": None,
                                   "size_bytes": 120_000, "metric": metric,
                                   "delta": metric - REFERENCE,
                                   "within_budget": REFERENCE - metric <= 1, "p50_ms": p50,
                                   "p99_ms": p50 * 1.4}
                                  for name, kind, metric, p50 in VARIANTS],
                     "notes": []},
        "pruning": None,
        "notes": ["static INT8 uses uint8 activations (measured faster here)"],
        "elapsed_s": 42.0, "machine": {"cpu": "test CPU", "logical_cores": 2},
    }


def _png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", header[16:24])
    return width, height


def test_the_tune_report_renders_offline_in_chromium(tmp_path: Path) -> None:
    data = json.loads(json.dumps(tune_dict()))  # exactly what report.json would hold
    page = tmp_path / "report.html"
    page.write_text(render_tune_html(data))
    shot = tmp_path / "tune-report.png"
    seen = render(page, shot, charts=2)
    assert seen.console_errors == []
    assert seen.outside_requests == [] and seen.failed_requests == []
    assert seen.charts == 2
    # 28 latency curves (the failed candidate has none) plus the SLO line; 28 points,
    # the Pareto front and the budget line.
    assert seen.traces[0] >= 28 and seen.traces[1] >= 28
    assert seen.tables == 3  # the facts, the candidates, the variants
    # The hover label names a candidate and its numbers at batch 1.
    assert "/t" in seen.hover_text and "batch 1" in seen.hover_text
    assert "samples/s" in seen.hover_text
    width, height = _png_size(shot)
    assert width >= 1000 and height >= 900 and shot.stat().st_size > 10_000


def test_the_page_carries_its_script_and_marks_the_choice() -> None:
    page = render_tune_html(tune_dict())
    assert "<script src=" not in page  # plotly.js is inline, nothing to download
    assert "<pre>" not in page
    assert page.count("<tr class=highlight>") == 1
    highlighted = page.split("<tr class=highlight>")[1].split("</tr>")[0]
    assert "int8-static-entropy/onnxruntime/t2" in highlighted and "chosen" in highlighted
    assert "openvino cannot read MatMulNBits" in page
    assert "SLO p99 5 ms" in page and "Pareto front" in page and "accuracy budget" in page


def test_a_report_with_nothing_chosen_still_renders() -> None:
    data = tune_dict() | {"chosen": None, "entry": None}
    data["optimize"]["metric"] = None
    page = render_tune_html(data)
    assert "nothing chosen" in page and "<tr class=highlight>" not in page


def test_the_pareto_front_keeps_only_unbeaten_points() -> None:
    points = [(1.0, 90.0), (2.0, 95.0), (3.0, 94.0), (0.5, 80.0), (4.0, 96.0), (2.0, 93.0)]
    assert pareto_front(points, higher_is_better=True) == [
        (0.5, 80.0), (1.0, 90.0), (2.0, 95.0), (4.0, 96.0)]
    assert pareto_front(points, higher_is_better=False) == [(0.5, 80.0)]


@pytest.mark.parametrize(("budget", "higher", "floor"), [
    ("1", True, 97.3), ("10%", True, 88.47), ("1", False, 99.3)])
def test_the_budget_line_sits_at_the_worst_allowed_metric(budget: str, higher: bool,
                                                          floor: float) -> None:
    numbers = budget_dict(AccuracyBudget.parse(budget), REFERENCE, higher)
    assert numbers is not None and numbers["floor"] == pytest.approx(floor)
    assert isinstance(numbers["value"], float) and numbers["text"] == budget
    data = tune_dict() | {"budget_floor": numbers["floor"]}
    assert budget_floor(data) == pytest.approx(floor)
