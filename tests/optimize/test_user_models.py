"""A user's own models (a small CNN and MLP built here, exported to ONNX): evaluation
data with labels, the fidelity budget when there are none, synthetic and image-folder
calibration, and a budget with nothing to measure against."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from turboinfer.cli import main
from turboinfer.engines.base import TensorSpec
from turboinfer.errors import ConfigError
from turboinfer.models.export import export_onnx
from turboinfer.optimize import MetricKind, optimize, tune
from turboinfer.optimize.data.synthetic import synthetic_feeds
from turboinfer.optimize.judge.evaluation import infer_kind
from turboinfer.optimize.judge.fidelity import fidelity_kind

# The export tests' models (tests/models/user_models.py), loaded without touching sys.path.
_SPEC = importlib.util.spec_from_file_location(
    "user_models", Path(__file__).resolve().parents[1] / "models" / "user_models.py")
assert _SPEC is not None and _SPEC.loader is not None
user_models = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(user_models)

QUICK = ["--engines", "onnxruntime", "--threads", "1", "--batch-sizes", "1",
         "--calib-count", "64"]


def _export(module: torch.nn.Module, name: str, shape: tuple[int, ...], path: Path) -> Path:
    example = {name: torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))}
    return export_onnx(module, example, path, input_names=[name], output_names=["logits"],
                       dynamic_axes={name: {0: "batch"}, "logits": {0: "batch"}})


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _export(user_models.make_mlp(), "x", (16,),
                   tmp_path_factory.mktemp("mlp") / "mlp.onnx")


@pytest.fixture(scope="module")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _export(user_models.make_cnn(), "image", (3, 16, 16),
                   tmp_path_factory.mktemp("cnn") / "cnn.onnx")


def _mlp_data(folder: Path, count: int, *, labels: bool) -> Path:
    rng = np.random.default_rng(3)
    arrays: dict[str, Any] = {"x": rng.standard_normal((count, 16)).astype(np.float32)}
    if labels:
        arrays["labels"] = rng.integers(0, 4, count)
    path = folder / ("eval.npz" if labels else "calib.npz")
    np.savez(path, **arrays)
    return path


def test_tune_with_labels_enforces_the_budget(mlp: Path, tmp_path: Path) -> None:
    report = tune(mlp, tmp_path / "repo", slo_p99_ms=1000, max_accuracy_drop=0.01,
                  engines=["onnxruntime"], threads=[1], batch_sizes=[1],
                  variants=["int8-dynamic", "int8-static"], calib_count=64,
                  calib_data=_mlp_data(tmp_path, 128, labels=False),
                  eval_data=_mlp_data(tmp_path, 400, labels=True))
    reference = report.optimize.reference.metric
    assert reference is not None
    assert report.optimize.metric is not None and report.optimize.metric.name == "top1"
    for m in report.candidates:
        # A budget bounds the drop only: a variant that scores above FP32 (it happens
        # on some CPUs) is within it.
        dropped = reference - (m.candidate.metric or 0) > 0.01
        assert m.candidate.within_budget is (not dropped)
        assert not (dropped and m.eligible)
    assert report.best is not None and report.best.candidate.within_budget
    data = json.loads((report.work / "report.json").read_text())
    assert data["max_accuracy_drop"] == {"value": 0.01, "relative": False, "text": "0.01"}
    assert data["budget_floor"] == pytest.approx(reference - 0.01)


def test_tune_without_labels_checks_fidelity(mlp: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    calib = _mlp_data(tmp_path, 96, labels=False)
    code = main(["tune", str(mlp), "--slo-p99-ms", "1000", "--max-accuracy-drop", "1",
                 "-o", str(tmp_path / "repo"), "--variants", "int8-dynamic",
                 "--calib-data", str(calib), *QUICK])
    out = capsys.readouterr().out
    assert code == 0 and "fidelity:top1-agreement" in out and "why" in out
    data = json.loads((tmp_path / "repo" / "mlp" / "tune" / "report.json").read_text())
    metric = data["optimize"]["metric"]
    assert metric["name"] == "fidelity:top1-agreement" and metric["reference"] == 100.0
    assert "on 48 samples held out of the calibration data" in metric["description"]
    assert all(c["within_budget"] is not None for c in data["candidates"])


def test_a_budget_with_nothing_to_measure_is_an_error(mlp: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    code = main(["tune", str(mlp), "--slo-p99-ms", "1000", "--max-accuracy-drop", "1",
                 "-o", str(tmp_path / "repo"), *QUICK])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert "--max-accuracy-drop has nothing to measure against" in err


def test_synthetic_calibration_warns(cnn: Path, tmp_path: Path,
                                     caplog: pytest.LogCaptureFixture) -> None:
    report = optimize(cnn, tmp_path, variants=["int8-static"], calibrations=["minmax"],
                      synthetic_calib=True, calib_count=16, max_accuracy_drop=1)
    assert "CALIBRATING ON SYNTHETIC DATA" in caplog.text
    assert report.metric is not None and report.metric.name.startswith("fidelity:")
    assert report.calibration["held_out"] == 16 and report.calibration["count"] == 16
    assert any("synthetic" in note for note in report.notes)


def test_image_folder_calibration(cnn: Path, tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for index in range(6):
        pixels = rng.integers(0, 256, (24, 20 + index, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(images / f"{index}.png")
    code = main(["optimize", str(cnn), "-o", str(tmp_path / "out"), "--variants",
                 "int8-static", "--calibration", "minmax", "--calib-images", str(images),
                 "--resize", "18", "--max-accuracy-drop", "1", "--json"])
    assert code == 0
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["calibration"]["source"] == f"images in {images}"
    assert data["calibration"]["count"] == 3 and data["calibration"]["held_out"] == 3
    assert data["metric"]["name"] == "fidelity:top1-agreement"
    assert data["budget"]["value"] == 1.0 and data["budget"]["floor"] == 99.0


def test_a_metric_function_is_the_metric(mlp: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_metric.py").write_text(
        "import numpy as np\n"
        "def evaluate(run):\n"
        "    x = np.ones((4, 16), np.float32)\n"
        "    return float(np.abs(next(iter(run({'x': x}).values()))).mean())\n"
        "evaluate.higher_is_better = False\n"
        "evaluate.metric_name = 'mean |logit|'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    report = optimize(mlp, tmp_path / "out", variants=["int8-dynamic"],
                      eval_data="my_metric:evaluate", max_accuracy_drop=1)
    assert report.metric is not None and report.metric.name == "mean |logit|"
    assert not report.metric.higher_is_better
    assert report.get("int8-dynamic").within_budget is not None


def test_eval_data_is_checked_once(mlp: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--eval-data"):
        optimize(mlp, tmp_path, eval_data=tmp_path / "missing.npz")
    with pytest.raises(ConfigError, match="--metric needs --eval-data"):
        optimize(mlp, tmp_path, metric="f1")


def test_synthetic_token_ids_stay_below_the_vocabulary(tmp_path: Path) -> None:
    table = numpy_helper.from_array(np.zeros((30, 4), np.float32), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "input_ids"], ["embedded"])], "embed",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", 8]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["b", 8])],
        [helper.make_tensor_value_info("embedded", TensorProto.FLOAT, ["b", 8, 4])],
        initializer=[table])
    path = tmp_path / "embed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    specs = [TensorSpec("input_ids", np.dtype(np.int64), ("b", 8)),
             TensorSpec("attention_mask", np.dtype(np.int64), ("b", 8))]
    feeds = synthetic_feeds(specs, 64, path)
    assert feeds["input_ids"].shape == (64, 8) and feeds["input_ids"].max() < 30
    assert feeds["input_ids"].max() >= 16  # the vocabulary, not the small-integer default
    assert (feeds["attention_mask"] == 1).all()


@pytest.mark.parametrize(("labels", "output", "kind"), [
    (np.array([0, 2]), np.zeros((2, 3)), MetricKind.TOP1),
    (np.array([0, 1]), np.zeros((2, 1)), MetricKind.F1),
    (np.zeros((2, 4, 8)), np.zeros((2, 4, 8)), MetricKind.COSINE),
    (np.zeros((2, 1)), np.zeros((2, 1)), MetricKind.MAE)])
def test_the_metric_is_inferred_from_labels_and_output(labels: Any, output: Any,
                                                       kind: MetricKind) -> None:
    assert infer_kind(labels, output) is kind


def test_the_fidelity_kind_follows_the_output() -> None:
    assert fidelity_kind(np.zeros((4, 10), np.float32), "logits") == "top1-agreement"
    assert fidelity_kind(np.zeros((4, 10), np.float32), "sentence_embedding") == "cosine"
    assert fidelity_kind(np.zeros((4, 7, 10), np.float32), "last_hidden_state") == "cosine"
    assert fidelity_kind(np.zeros((4, 1), np.float32), "price") == "relative-error"
