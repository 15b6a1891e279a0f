"""tune() and the two subcommands: the repository entry, the reports, errors on one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from turboinfer.cli import main
from turboinfer.optimize import tune
from turboinfer.serve.config import load_config

FAST = {"engines": ["onnxruntime"], "batch_sizes": [1, 4], "threads": [1]}


@pytest.fixture(scope="module")
def digits_tune(digits_model: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    repo = tmp_path_factory.mktemp("repo")
    return tune(digits_model, repo, slo_p99_ms=50.0, max_accuracy_drop=1,
                variants=["int8-static"], calib_count=100, **FAST)


def test_tune_writes_an_entry_the_server_reads(digits_tune: Any) -> None:
    assert digits_tune.best is not None and digits_tune.best.eligible
    entry = digits_tune.entry
    assert (entry / "model.onnx").is_file() and entry.name == "1"
    config = load_config(entry.parent / "config.yaml")
    assert config.engine == "onnxruntime"
    assert config.engine_settings.intra_op_threads == 1
    plan = digits_tune.best.plan
    assert config.max_batch_size == plan.max_batch_size
    if plan.max_batch_size:
        assert config.dynamic_batching is not None


def test_tune_reports_json_and_html(digits_tune: Any) -> None:
    data = json.loads((digits_tune.work / "report.json").read_text())
    labels = [c["label"] for c in data["candidates"]]
    assert "fp32/onnxruntime/t1" in labels
    assert any(label.startswith("int8-static-") for label in labels)
    assert data["chosen"]["eligible"] and data["optimize"]["variants"]
    page = (digits_tune.work / "report.html").read_text()
    assert 'id="latency-vs-batch"' in page and 'id="metric-vs-latency"' in page
    assert "(chosen)" in page and data["chosen"]["label"] in page


def test_tune_returns_fp32_when_nothing_quantizes(weightless_model: Any,
                                                  tmp_path: Path) -> None:
    report = tune(weightless_model, tmp_path, slo_p99_ms=50.0, max_accuracy_drop=0.01,
                  variants=["int8-static"], **FAST)
    assert report.best is not None and report.best.candidate.variant_name == "fp32"
    assert any("nothing to quantize" in note for note in report.notes)


def test_tune_with_an_unmeetable_budget_keeps_fp32(digits_model: Any, tmp_path: Path) -> None:
    report = tune(digits_model, tmp_path, slo_p99_ms=50.0, max_accuracy_drop="-1",
                  variants=["int8-dynamic"], **FAST)
    assert report.best is not None and report.best.candidate.variant_name == "fp32"
    assert any("FP32" in note for note in report.notes)


def test_cli_errors_are_one_line_with_exit_code_2(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = main(["optimize", "builtin:digits-cnn", "-o", str(blocker / "out"),
                 "--variants", "graph"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: cannot write") and "\n" not in err
    np.savez(tmp_path / "bad.npz", image=np.zeros((2, 1, 8, 8), np.float32))
    code = main(["optimize", "builtin:digits-cnn", "-o", str(tmp_path / "o"), "--variants",
                 "int8-static", "--calib-data", str(tmp_path / "bad.npz")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "'image'" in err and "\n" not in err
    code = main(["tune", "builtin:digits-cnn", "--slo-p99-ms", "5", "--max-accuracy-drop",
                 "lots", "-o", str(tmp_path / "r")])
    assert code == 2 and "budget" in capsys.readouterr().err


def test_cli_optimize_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["optimize", "builtin:digits-cnn", "-o", str(tmp_path), "--variants",
                 "graph", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and [v["name"] for v in data["variants"]] == ["fp32", "graph"]
