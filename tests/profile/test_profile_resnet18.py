"""``turboinfer profile builtin:resnet18``, FP32 and int8-static: the per-operator times
plus the reported overhead make up the measured session time, the operator times are
those of the chrome trace the command writes (re-added here from its events), ONNX
Runtime's own clock of each run agrees with the measured session time within 10%, and
the int8-static variant reports the share of its QuantizeLinear/DequantizeLinear nodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from turboinfer.cli import main
from turboinfer.models import resolve_model
from turboinfer.models.onnx_file import input_specs
from turboinfer.optimize.builders.quantize import StaticQuant, prepare, quantize_int8_static
from turboinfer.optimize.data.calibration import CalibrationSet, compute_ranges
from turboinfer.optimize.settings import ActivationType, CalibrationMethod, OptimizeSettings
from turboinfer.profile import QDQ_OP_TYPES

pytestmark = pytest.mark.slow  # ResNet-18 runs in tens of milliseconds each on 2 cores

RUNS = 3
KERNEL = "_kernel_time"


def profile(capsys: pytest.CaptureFixture[str], model: str, trace: Path) -> dict[str, Any]:
    assert main(["profile", model, "--runs", str(RUNS), "--warmup", "1", "--json",
                 "--trace", str(trace)]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def check_adds_up(report: dict[str, Any], trace: Path) -> None:
    session, kernels, overhead = (report[k] for k in ("session_ms", "kernels_ms",
                                                      "overhead_ms"))
    assert report["runs"] == RUNS
    # Operators run inside their run: their sum cannot pass the run's wall time.
    assert 0 <= kernels <= session
    assert abs(sum(n["ms"] for n in report["nodes"]) + overhead - session) <= 0.1 * session
    assert sum(n["ms"] for n in report["nodes"]) == pytest.approx(kernels)
    assert sum(t["ms"] for t in report["op_types"]) == pytest.approx(kernels)
    events = json.loads(trace.read_text())["traceEvents"]
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    nodes = [e for e in events if e.get("cat") == "Node"
             and str(e.get("name", "")).endswith(KERNEL)]
    assert len(runs) == RUNS
    # The report's operator time is the trace's node events, per run (microseconds).
    assert sum(e["dur"] for e in nodes) / 1e3 / RUNS == pytest.approx(kernels, rel=1e-6)
    # ONNX Runtime's own clock of each run against the session time measured around it.
    ort_session = sum(e["dur"] for e in runs) / 1e3 / RUNS
    assert abs(kernels + overhead - ort_session) <= 0.1 * ort_session


def test_resnet18_fp32_adds_up(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "resnet18.json"
    report = profile(capsys, "builtin:resnet18", trace)
    check_adds_up(report, trace)
    assert report["qdq_share"] == 0.0
    assert report["op_types"][0]["op_type"] == "Conv"


@pytest.fixture(scope="module")
def resnet18_int8_static(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ResNet-18 statically quantized to QDQ (S8S8), calibrated on four samples."""
    model = resolve_model("builtin:resnet18")
    assert model.entry is not None
    out = tmp_path_factory.mktemp("resnet18-int8")
    prepared = prepare(model.artifact.onnx_path, out / "prepared.onnx")
    feeds = {name: np.asarray(value) for name, value in model.entry.calibration(4).items()}
    ranges = compute_ranges(prepared, CalibrationSet(feeds, "test"), CalibrationMethod.MINMAX,
                            OptimizeSettings(), input_specs(onnx.load(str(prepared))),
                            out / "ranges")
    quant = StaticQuant(CalibrationMethod.MINMAX, ranges, ActivationType.INT8)
    return quantize_int8_static(prepared, out / "int8-static.onnx", quant)


def test_resnet18_int8_static_reports_its_qdq_share(
        resnet18_int8_static: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "int8.json"
    report = profile(capsys, str(resnet18_int8_static), trace)
    check_adds_up(report, trace)
    qdq = [t for t in report["op_types"] if t["op_type"] in QDQ_OP_TYPES]
    assert qdq, [t["op_type"] for t in report["op_types"]]
    assert report["qdq_share"] == pytest.approx(sum(t["share"] for t in qdq))
    assert report["qdq_share"] == pytest.approx(sum(t["ms"] for t in qdq) / report["kernels_ms"])
    assert 0 < report["qdq_share"] < 1
