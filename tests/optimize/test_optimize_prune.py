"""tune with --prune: pruned candidates share the table and the budget of the unpruned
FP32 model, and a chosen pruned model is a servable entry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from turboinfer.cli import main
from turboinfer.errors import ConfigError
from turboinfer.optimize import tune
from turboinfer.optimize.settings import PruneRequest

FAST = {"engines": ["onnxruntime"], "batch_sizes": [1, 4], "threads": [1]}


@pytest.fixture(scope="module")
def pruned_tune(digits_model: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    repo = tmp_path_factory.mktemp("repo")
    return tune(digits_model, repo, slo_p99_ms=50.0, max_accuracy_drop=1,
                variants=["int8-static"], calib_count=100, prune=0.3, prune_epochs=2, **FAST)


def test_pruned_candidates_join_the_table(pruned_tune: Any) -> None:
    labels = [m.candidate.label for m in pruned_tune.candidates]
    assert "fp32/onnxruntime/t1" in labels and "pruned-fp32/onnxruntime/t1" in labels
    assert any(label.startswith("pruned-int8-static-") for label in labels)


def test_pruned_variants_are_judged_against_the_unpruned_fp32(pruned_tune: Any) -> None:
    reference = pruned_tune.optimize.reference.metric
    pruned = pruned_tune.pruning["optimize"]["variants"]
    assert pruned[0]["name"] == "pruned-fp32"
    for variant in pruned:
        if variant["metric"] is not None:
            assert variant["delta"] == pytest.approx(variant["metric"] - reference)
            assert variant["within_budget"] == (reference - variant["metric"] <= 1 + 1e-9)
    for m in pruned_tune.candidates:
        if m.candidate.variant_name.startswith("pruned-") and m.candidate.metric is not None:
            assert m.candidate.within_budget == (reference - m.candidate.metric <= 1 + 1e-9)


def test_the_report_records_the_pruning(pruned_tune: Any) -> None:
    data = json.loads((pruned_tune.work / "report.json").read_text())
    pruning = data["pruning"]
    assert pruning["sparsity"] == 0.3
    assert pruning["macs"]["after"] < pruning["macs"]["before"]
    assert any("pruned 0.3 of the channels" in note for note in data["notes"])
    assert any(c["variant"].startswith("pruned-") for c in data["candidates"])
    assert "pruned-fp32" in (pruned_tune.work / "report.html").read_text()


def test_a_chosen_pruned_model_is_servable(pruned_tune: Any, digits_model: Any,
                                           tmp_path: Path) -> None:
    """The tuner's own entry when a pruned candidate won; otherwise the entry the tuner
    would write for the fastest pruned one (timing noise decides the winner on 2 cores)."""
    from turboinfer.engines import EngineSettings, ModelArtifact, load_session
    from turboinfer.optimize.search.tune_report import write_entry_for

    entry = pruned_tune.entry
    if not pruned_tune.best.candidate.variant_name.startswith("pruned-"):
        pruned = [m for m in pruned_tune.candidates
                  if m.candidate.variant_name.startswith("pruned-") and m.eligible]
        assert pruned
        entry = write_entry_for(tmp_path, "digits-cnn", max(pruned, key=lambda m: m.plan.qps))
    session = load_session(ModelArtifact("entry", entry / "model.onnx"), "onnxruntime",
                           EngineSettings())
    outputs = session.run(digits_model.entry.example_inputs(2))
    assert np.isfinite(next(iter(outputs.values()))).all()


def test_prune_rejects_a_plain_onnx_file(linear_onnx: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["tune", str(linear_onnx), "--slo-p99-ms", "50", "--max-accuracy-drop", "1",
                 "-o", str(tmp_path), "--prune", "0.3"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and "builtin:NAME" in err and len(err.splitlines()) == 1


def test_prune_sparsity_outside_zero_one_is_an_error() -> None:
    with pytest.raises(ConfigError, match="not in"):
        PruneRequest(1.5)
