"""The command end to end: saved reports produced here, the self-run, bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from turboinfer.hardware import profile


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "turboinfer", "doctor", *args],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONWARNINGS="error"))


@pytest.fixture(scope="module")
def bench_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("doctor-bench") / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "turboinfer", "bench", "builtin:digits-cnn", "--json",
         "--batch-sizes", "1,8", "--min-seconds", "0.1", "--min-runs", "10"],
        capture_output=True, text=True, timeout=300, check=True)
    path.write_text(done.stdout)
    return path


def test_saved_bench_report_is_judged(bench_report: Path, tmp_path: Path) -> None:
    html = tmp_path / "doctor.html"
    done = doctor("--bench", str(bench_report), "--json", "--html", str(html))
    assert done.returncode == 0, done.stderr
    doc = orjson.loads(done.stdout)
    assert doc["sources"] == ["bench"]
    judged = doc["passed"] + [f["rule"] for f in doc["findings"]]
    assert "superlinear_batch" in judged and "oversubscription" in judged
    assert "turboinfer doctor" in html.read_text()


def test_more_threads_than_cores_is_named_with_its_latency() -> None:
    cores = profile(engines=False, gpus=False).cpu.usable_cores
    done = doctor("builtin:digits-cnn", "--threads", f"1,{cores + 2}", "--json")
    assert done.returncode == 0, done.stderr
    found = {f["rule"]: f for f in orjson.loads(done.stdout)["findings"]}
    finding = found["oversubscription"]
    assert f"at {cores + 2} intra-op threads against" in finding["symptom"]
    assert f"{cores + 2} threads on {cores} usable cores" in finding["evidence"]
    assert finding["fix"] == f"config.yaml: engine_settings: {{intra_op_threads: {cores}}}"


def test_recorded_tune_and_profile_reports(tmp_path: Path) -> None:
    tune = {"model": "builtin:digits-cnn", "budget": {"value": 1.0, "text": "1 point"},
            "calibration": {"source": "synthetic", "count": 8},
            "activation_type": {"chosen": "int8", "by_profile": "uint8"},
            "variants": [
                {"name": "fp32", "variant": "fp32", "latency": {"p50_ms": 0.20}},
                {"name": "int8-static-minmax", "variant": "int8-static", "metric": 91.0,
                 "delta": -6.5, "within_budget": False, "latency": {"p50_ms": 0.31}}],
            "sensitivity": [{"node": "conv2", "op_type": "Conv", "tensor": "t",
                             "sqnr_db": 12.0, "loss_db": 9.5}]}
    prof = {"model": "builtin:digits-cnn", "overhead_share": 0.42, "qdq_share": 0.3}
    (tmp_path / "tune.json").write_bytes(orjson.dumps(tune))
    (tmp_path / "profile.json").write_bytes(orjson.dumps(prof))
    done = doctor("--tune", str(tmp_path / "tune.json"), "--profile",
                  str(tmp_path / "profile.json"))
    assert done.returncode == 0, done.stderr
    for expected in ("accuracy_drop", "calibrated on 8 samples", "conv2 (9.5 dB)",
                     "quantized_not_faster", "p50 0.310 ms vs FP32 0.200 ms",
                     "framework_overhead", "42%", "qdq_share", "--calib-count 512"):
        assert expected in done.stdout


@pytest.mark.parametrize("args", [
    ("http://127.0.0.1:9", "--window", "1s"),
    ("--bench", "/nonexistent/bench.json"),
    ("--load", __file__),
    (),
])
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...]) -> None:
    done = doctor(*args)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stdout == ""
