"""``turboinfer profile`` on real engines: the per-operator times add up with the
overhead to the session time, shares sum to one, the trace opens as chrome-trace JSON,
and an int8 QDQ model shows time in its quantize/dequantize nodes."""

from __future__ import annotations

import json
import re
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

QUICK = ["--runs", "5", "--warmup", "1"]


def _profile(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["profile", *args, *QUICK, "--json"]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def _check_identity(report: dict[str, Any]) -> None:
    session = report["session_ms"]
    assert session > 0 and report["kernels_ms"] > 0
    assert abs(report["kernels_ms"] + report["overhead_ms"] - session) <= 0.1 * session
    assert report["overhead_share"] == pytest.approx(report["overhead_ms"] / session)
    for rows in (report["op_types"], report["nodes"]):
        assert rows
        assert sum(row["share"] for row in rows) == pytest.approx(1.0, abs=0.01)
    assert sum(row["ms"] for row in report["nodes"]) == pytest.approx(report["kernels_ms"])


@pytest.mark.parametrize("engine", ["onnxruntime", "openvino", "torch"])
def test_profile_adds_up_and_writes_a_trace(engine: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    if engine == "openvino":
        pytest.importorskip("openvino", reason="the openvino extra is not installed")
    trace = tmp_path / "trace.json"
    report = _profile(capsys, "builtin:digits-cnn", "--engine", engine, "--trace", str(trace))
    assert (report["engine"], report["batch_size"], report["runs"]) == (engine, 1, 5)
    assert report["machine"] and report["unprofiled_session_ms"] > 0
    assert report["profiler_cost_ms"] == pytest.approx(
        report["session_ms"] - report["unprofiled_session_ms"])
    assert report["qdq_share"] == 0.0
    _check_identity(report)
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(event.get("ph") == "X" and event.get("dur", -1) >= 0 for event in events)


def test_the_table_names_overhead_and_the_hot_ops(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "builtin:digits-cnn", "--batch-size", "4", *QUICK]) == 0
    out = capsys.readouterr().out
    assert "batch: 4" in out and "framework overhead" in out and "Conv" in out
    assert re.search(r"QDQ share\s+0\.0% of operator time", out)


@pytest.fixture(scope="module")
def int8_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """digits-cnn statically quantized to QDQ with int8 activations (S8S8)."""
    model = resolve_model("builtin:digits-cnn")
    assert model.entry is not None
    out = tmp_path_factory.mktemp("int8")
    prepared = prepare(model.artifact.onnx_path, out / "prepared.onnx")
    specs = input_specs(onnx.load(str(prepared)))
    feeds = {name: np.asarray(value) for name, value in model.entry.calibration(16).items()}
    ranges = compute_ranges(prepared, CalibrationSet(feeds, "test"), CalibrationMethod.MINMAX,
                            OptimizeSettings(), specs, out / "ranges")
    quant = StaticQuant(CalibrationMethod.MINMAX, ranges, ActivationType.INT8)
    return quantize_int8_static(prepared, out / "int8-static.onnx", quant)


def test_an_int8_static_model_reports_its_qdq_share(
        int8_onnx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = _profile(capsys, str(int8_onnx))
    _check_identity(report)
    assert report["qdq_share"] > 0
    qdq = {"QuantizeLinear", "DequantizeLinear"}
    assert report["qdq_share"] == pytest.approx(
        sum(row["share"] for row in report["op_types"] if row["op_type"] in qdq))


@pytest.mark.parametrize(("args", "words"), [
    (["builtin:no-such-model"], "unknown builtin model"),
    (["builtin:digits-cnn", "--engine", "tensorrt"], "unknown engine"),
    (["builtin:digits-cnn", "--batch-size", "0"], "batch size"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], words: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", *args, *QUICK]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err


def test_the_torch_engine_needs_a_module(int8_onnx: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", str(int8_onnx), "--engine", "torch", *QUICK]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "PyTorch module" in err
