"""NNCF variants: built when openvino is a tune engine, judged on openvino, kept within the
budget by accuracy control, saved as OpenVINO IR that the repository serves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper

from turboinfer.engines import EngineSettings, ModelArtifact, load_session
from turboinfer.optimize import tune
from turboinfer.optimize.builders.nncf_variants import is_transformer, wanted
from turboinfer.optimize.settings import OptimizeSettings, Variant, parse_variants
from turboinfer.serve.config import ModelConfig, write_entry
from turboinfer.serve.sources import DirectorySource

pytest.importorskip("nncf")


@pytest.fixture(scope="module")
def mlp_tune(mlp_model: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    # A budget of 0.005 in cosine: tight enough that full INT8 may miss it.
    return tune(mlp_model, tmp_path_factory.mktemp("repo"), slo_p99_ms=50.0,
                max_accuracy_drop=0.005, engines=["openvino"], variants=["int8-static"],
                batch_sizes=[1], threads=[1], calib_count=100)


def test_nncf_variants_are_ir_judged_on_openvino(mlp_tune: Any) -> None:
    plain = mlp_tune.optimize.get("nncf-int8")
    assert plain.variant is Variant.NNCF_INT8 and plain.path.suffix == ".xml"
    assert plain.path.with_suffix(".bin").is_file()
    assert plain.metric is not None and plain.within_budget is not None
    assert plain.details["engine"] == "openvino" and plain.details["fake_quantize_ops"] > 0
    assert plain.details["calibration_samples"] == 100  # the int8-static variants' samples
    labels = [m.candidate.label for m in mlp_tune.candidates]
    assert "nncf-int8/openvino/t1" in labels


def test_accuracy_control_keeps_layers_in_float_until_the_budget_holds(mlp_tune: Any) -> None:
    plain = mlp_tune.optimize.get("nncf-int8")
    controlled = mlp_tune.optimize.get("nncf-accuracy")
    if plain.within_budget:
        assert controlled.skipped == "nncf-int8 already meets the budget"
        return
    assert controlled.path is not None and controlled.within_budget is True
    assert controlled.metric > plain.metric
    assert controlled.details["fake_quantize_ops"] < plain.details["fake_quantize_ops"]


def test_nncf_joins_only_with_openvino_and_static_int8(mlp_tune: Any) -> None:
    report = mlp_tune.optimize
    static = OptimizeSettings(variants=parse_variants(["int8-static"]))
    assert wanted(static, ("onnxruntime", "openvino"), report)
    assert not wanted(static, ("onnxruntime",), report)
    assert not wanted(OptimizeSettings(variants=parse_variants(["graph"])), ("openvino",),
                      report)


def test_an_ir_variant_is_served_from_the_repository(mlp_tune: Any, tmp_path: Path) -> None:
    ir = mlp_tune.optimize.get("nncf-int8").path
    version = write_entry(tmp_path, "mlp", ir, ModelConfig(engine="openvino"))
    assert sorted(p.name for p in version.iterdir()) == ["model.bin", "model.xml"]
    source = DirectorySource(tmp_path / "mlp")
    snapshot = source.read()
    assert snapshot.config.model_file == "model.xml" and snapshot.versions[1] is not None
    session = load_session(source.artifact(1, snapshot.config), "openvino", EngineSettings())
    direct = load_session(ModelArtifact("ir", ir), "openvino", EngineSettings())
    feeds = {"input": np.random.default_rng(0).standard_normal((3, 32), dtype=np.float32)}
    np.testing.assert_allclose(session.run(feeds)["output"], direct.run(feeds)["output"])


def test_attention_marks_a_transformer() -> None:
    nodes = [helper.make_node("MatMul", ["q", "k"], ["scores"]),
             helper.make_node("Softmax", ["scores"], ["weights"]),
             helper.make_node("MatMul", ["weights", "v"], ["out"])]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 4]) for n in "qkv"]
    graph = helper.make_graph(nodes, "attention", inputs,
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [4, 4])])
    assert is_transformer(helper.make_model(graph))
    softmax_head = [helper.make_node("MatMul", ["q", "k"], ["logits"]),
                    helper.make_node("Softmax", ["logits"], ["out"])]
    graph = helper.make_graph(softmax_head, "classifier", inputs[:2],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [4, 4])])
    assert not is_transformer(helper.make_model(graph))
