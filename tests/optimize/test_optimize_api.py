"""optimize() end to end on digits-cnn and tiny models: files, report, budget behaviour."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from turboinfer.errors import ConfigError, InvalidInputError
from turboinfer.optimize import MeasureSettings, OptimizeReport, OptimizeSettings, Variant, optimize
from turboinfer.optimize.judge.measure import open_session
from turboinfer.optimize.settings import settings_from

CALIBRATIONS = ("minmax", "entropy", "percentile")
# Latency is not under test here: a short timing window keeps the suite fast.
QUICK = MeasureSettings(min_runs=3, min_seconds=0.02, warmup_runs=1)


def quick(variants: list[str], **fields: Any) -> OptimizeSettings:
    """Settings as the API builds them from keywords, with the short timing window."""
    return replace(settings_from(variants, **fields), measure=QUICK)


@pytest.fixture(scope="module")
def digits_report(digits_model: Any, tmp_path_factory: pytest.TempPathFactory
                  ) -> OptimizeReport:
    out = tmp_path_factory.mktemp("digits-opt")
    settings = quick(["graph", "int8-static", "int4"], calib_count=200, sensitivity=True)
    return optimize(digits_model, out, settings=settings)


def test_every_calibration_stays_within_one_point(digits_report: OptimizeReport) -> None:
    reference = digits_report.reference
    assert reference.metric is not None and reference.metric > 90.0
    assert reference.size_bytes is not None
    for method in CALIBRATIONS:
        result = digits_report.get(f"int8-static-{method}")
        assert result.delta is not None and abs(result.delta) <= 1.0, method
        assert result.path is not None and result.path.is_file()
        assert result.size_bytes is not None and result.size_bytes < reference.size_bytes


def test_report_json_carries_what_the_issue_asks(digits_report: OptimizeReport) -> None:
    data = json.loads((digits_report.output_dir / "report.json").read_text())
    names = [v["name"] for v in data["variants"]]
    assert names[0] == "fp32" and "graph" in names
    for row in data["variants"]:
        if row["skipped"] is None:
            assert row["p50_ms"] > 0 and row["p99_ms"] >= row["p50_ms"]
            assert row["size_bytes"] > 0 and row["delta"] is not None
    graph = next(v for v in data["variants"] if v["name"] == "graph")
    assert (digits_report.output_dir / graph["path"]).is_file()
    ops = graph["details"]
    assert sum(ops["ops_after"].values()) < sum(ops["ops_before"].values())
    int4 = next(v for v in data["variants"] if v["name"] == "int4")
    assert "no large MatMul" in int4["skipped"]
    activation = data["activation_type"]
    assert set(activation["measured_p50_ms"]) == {"uint8", "int8"}
    assert activation["chosen"] in ("uint8", "int8")
    assert data["calibration"]["count"] == 200


def test_sensitivity_ranks_every_weighted_layer(digits_report: OptimizeReport) -> None:
    ranking = digits_report.sensitivity
    assert {s.op_type for s in ranking} == {"Conv", "Gemm"}
    losses = [s.loss_db for s in ranking if s.loss_db is not None]
    assert losses and losses == sorted(losses, reverse=True)


def test_tight_budget_keeps_layers_in_float_and_meets_it(mlp_model: Any,
                                                          tmp_path: Path) -> None:
    full = optimize(mlp_model, tmp_path / "full",
                    settings=quick(["int8-static"], calibrations=["minmax"]))
    full_metric = full.get("int8-static-minmax").metric
    assert full_metric is not None and full_metric < 1.0
    budget = (1.0 - full_metric) / 4
    report = optimize(mlp_model, tmp_path / "mixed",
                      settings=quick(["int8-static"], calibrations=["minmax"],
                                     max_accuracy_drop=budget))
    assert report.mixed is not None and report.mixed.met
    assert 0 < len(report.mixed.float_layers) < report.mixed.total_layers
    mixed = report.get("mixed")
    assert mixed.path is not None and mixed.within_budget is True
    # Re-measure the returned file on the evaluation set, independently of the report.
    entry = mlp_model.entry
    value = entry.metric.compute(open_session(mixed.path).run, entry.evaluation())
    assert 1.0 - value <= budget + 1e-9


def test_budget_nothing_meets_returns_fp32(digits_model: Any, tmp_path: Path) -> None:
    settings = quick(["int8-static"], calibrations=["minmax"], calib_count=100,
                     max_accuracy_drop="-1")
    report = optimize(digits_model, tmp_path, settings=settings)
    assert report.mixed is not None and not report.mixed.met
    assert any("FP32 model is the answer" in note for note in report.notes)
    assert all(v.within_budget is False for v in report.variants[1:])
    assert report.reference.variant is Variant.FP32 and report.reference.within_budget


def test_nothing_to_quantize_is_said(weightless_model: Any, tmp_path: Path) -> None:
    report = optimize(weightless_model, tmp_path,
                      settings=quick(["int8-dynamic", "int8-static", "int4"]))
    assert all("nothing to quantize" in (v.skipped or "") for v in report.variants[1:])
    assert any("nothing to quantize" in note for note in report.notes)


def test_calibration_data_that_does_not_fit_names_the_input(digits_model: Any,
                                                            tmp_path: Path) -> None:
    np.savez(tmp_path / "wrong-name.npz", pixels=np.zeros((4, 1, 8, 8), np.float32))
    np.savez(tmp_path / "wrong-shape.npz", input=np.zeros((4, 1, 28, 28), np.float32))
    with pytest.raises(InvalidInputError, match="'pixels'"):
        optimize(digits_model, tmp_path / "a", settings=quick(
            ["int8-static"], calib_data=tmp_path / "wrong-name.npz"))
    with pytest.raises(InvalidInputError, match=r"'input' has shape \[4, 1, 28, 28\]"):
        optimize(digits_model, tmp_path / "b", settings=quick(
            ["int8-static"], calib_data=tmp_path / "wrong-shape.npz"))


def test_unwritable_output_dir_is_a_clear_error(digits_model: Any, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot write to output directory"):
        optimize(digits_model, blocker / "out", settings=quick(["graph"]))


def test_fewer_calibration_samples_than_asked_is_said(mlp_model: Any, tmp_path: Path) -> None:
    report = optimize(mlp_model, tmp_path, settings=quick(
        ["int8-static"], calibrations=["minmax"], calib_count=1000))
    assert report.calibration["count"] == 256
    assert any("fewer than the 1000" in note for note in report.notes)


def test_synthetic_calibration_only_when_asked(mlp_model: Any, tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    path = str(mlp_model.artifact.onnx_path)  # a plain ONNX file: no zoo data, no metric
    with pytest.raises(ConfigError, match="--calib-data"):
        optimize(path, tmp_path / "a", settings=quick(["int8-static"]))
    report = optimize(path, tmp_path / "b", settings=quick(
        ["int8-static"], calibrations=["minmax"], synthetic_calib=True, calib_count=32))
    assert "SYNTHETIC DATA" in caplog.text
    assert any("synthetic" in note for note in report.notes)
    assert report.metric is None and report.get("int8-static-minmax").usable
