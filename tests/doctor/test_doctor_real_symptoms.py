"""Symptoms provoked for real: a self-run profile of a model with unfused QDQ pairs, a
calibration set of two samples, and a server log with allocation failures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import orjson
import pytest
from onnx import TensorProto, helper, numpy_helper

from turboinfer.doctor.logs import read_log

# ONNX Runtime's own words when an arena cannot grow, as a server logs them.
ORT_OOM = ("2026-01-01 12:00:00 ERROR turboinfer.serve model big version 1: "
           "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned "
           "while running Conv node. Name:'conv1' Status Message: "
           "/onnxruntime/core/framework/bfc_arena.cc:376 void* "
           "onnxruntime::BFCArena::AllocateRawInternal(size_t, bool, Stream*) "
           "Failed to allocate memory for requested buffer of size 8589934592")


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "turboinfer", "doctor", *args],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONWARNINGS="error"))


def unfused_qdq_onnx(path: Path, width: int = 16, layers: int = 8) -> Path:
    """Quantize -> Dequantize -> Tanh, ``layers`` times: no integer kernel takes Tanh, so
    every QDQ pair runs as two conversions, as in an INT8 model without the fast path."""
    nodes, previous = [], "input"
    for i in range(layers):
        nodes += [helper.make_node("QuantizeLinear", [previous, "scale", "zero"], [f"q{i}"]),
                  helper.make_node("DequantizeLinear", [f"q{i}", "scale", "zero"], [f"d{i}"]),
                  helper.make_node("Tanh", [f"d{i}"], [f"t{i}"])]
        previous = f"t{i}"
    nodes.append(helper.make_node("Identity", [previous], ["output"]))
    graph = helper.make_graph(
        nodes, "unfused_qdq",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", width])],
        initializer=[numpy_helper.from_array(np.array(0.01, np.float32), "scale"),
                     numpy_helper.from_array(np.array(128, np.uint8), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_self_run_profiles_and_names_unfused_qdq(tmp_path: Path) -> None:
    model = unfused_qdq_onnx(tmp_path / "qdq.onnx")
    done = doctor(str(model), "--threads", "1", "--batch-sizes", "1,2", "--json")
    assert done.returncode == 0, done.stderr
    doc = orjson.loads(done.stdout)
    assert "profile" in doc["sources"]
    found = {f["rule"]: f for f in doc["findings"]}
    assert "of operator time in QuantizeLinear/DequantizeLinear" in found["qdq_share"]["symptom"]
    assert found["qdq_share"]["evidence"].startswith("qdq_share 0.")
    # Its share of time outside operators depends on the moment; judged it must be.
    assert "framework_overhead" in doc["passed"] + list(found)


@pytest.fixture(scope="module")
def thin_calibration(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real optimize report: int8-static (entropy) calibrated on two samples."""
    out = tmp_path_factory.mktemp("thin-calib")
    subprocess.run([sys.executable, "-m", "turboinfer", "optimize", "builtin:digits-cnn",
                    "-o", str(out), "--variants", "int8-static", "--calibration", "entropy",
                    "--calib-count", "2", "--max-accuracy-drop", "1", "--json"],
                   capture_output=True, text=True, timeout=300, check=True)
    return out / "report.json"


def test_two_calibration_samples_lose_accuracy_and_doctor_says_so(
        thin_calibration: Path) -> None:
    report = orjson.loads(thin_calibration.read_bytes())
    over = [v for v in report["variants"] if v["within_budget"] is False]
    if not over:
        pytest.skip("two calibration samples kept int8-static within 1 point on this run")
    done = doctor("--tune", str(thin_calibration), "--json")
    assert done.returncode == 0, done.stderr
    found = {f["rule"]: f for f in orjson.loads(done.stdout)["findings"]}
    drop = found["accuracy_drop"]
    assert f"{over[0]['name']}: metric" in drop["symptom"]
    assert "calibrated on 2 samples" in drop["evidence"]
    assert "most sensitive:" in drop["evidence"]
    assert "--calib-count 512" in drop["fix"] and "--sensitivity" in drop["fix"]


def test_allocation_failures_in_the_log_are_named(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("INFO model big version 1 ready\n" + f"{ORT_OOM}\n" * 3)
    assert read_log(log).oom_lines == 3
    done = doctor("--server-log", str(log), "--json")
    assert done.returncode == 0, done.stderr
    finding = {f["rule"]: f for f in orjson.loads(done.stdout)["findings"]}["out_of_memory"]
    assert finding["severity"] == "critical"
    assert finding["symptom"] == f"3 allocation-failure line(s) in {log} (4 lines)"
    assert "Failed to allocate memory" in finding["evidence"]
    assert finding["fix"].startswith("config.yaml: max_batch_size:")


def test_a_clean_log_passes(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("INFO model small version 1 ready\n")
    done = doctor("--server-log", str(log), "--json")
    assert done.returncode == 0, done.stderr
    assert "out_of_memory" in orjson.loads(done.stdout)["passed"]
