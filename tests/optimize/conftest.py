"""Fixtures for the optimizer: digits-cnn (real, trained) and tiny hand-made ONNX models
wrapped as resolved models with their own evaluation set and metric."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from turboinfer.engines import ModelArtifact
from turboinfer.models import metrics
from turboinfer.models.zoo import EvalSet, Metric, ZooEntry


@dataclass(frozen=True)
class FakeResolved:
    """The shape of ``turboinfer.models.ResolvedModel`` for models built in tests."""

    name: str
    artifact: ModelArtifact
    entry: Any


def save(nodes: list[onnx.NodeProto], weights: dict[str, np.ndarray], path: Path,
         width_in: int, width_out: int) -> Path:
    graph = helper.make_graph(
        nodes, path.stem,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", width_in])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", width_out])],
        initializer=[numpy_helper.from_array(w, name) for name, w in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def mlp_onnx(path: Path, layers: int = 4, width: int = 32) -> Path:
    """``layers`` MatMul+Relu blocks with seeded weights; the last has no Relu."""
    rng = np.random.default_rng(1)
    nodes, weights, current = [], {}, "input"
    for index in range(layers):
        weights[f"w{index}"] = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(
            np.float32)
        out = "output" if index == layers - 1 else f"h{index}"
        matmul_out = out if index == layers - 1 else f"m{index}"
        nodes.append(helper.make_node("MatMul", [current, f"w{index}"], [matmul_out],
                                      name=f"fc{index}"))
        if index < layers - 1:
            nodes.append(helper.make_node("Relu", [matmul_out], [out], name=f"relu{index}"))
        current = out
    return save(nodes, weights, path, width, width)


def weightless_onnx(path: Path, width: int = 8) -> Path:
    """Relu and Add only: nothing a quantizer can act on."""
    nodes = [helper.make_node("Relu", ["input"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "input"], ["output"], name="add")]
    return save(nodes, {}, path, width, width)


def cosine_entry(path: Path, name: str, width: int, count: int = 256) -> ZooEntry:
    """An entry whose metric is the mean cosine of outputs to the FP32 model's outputs."""
    rng = np.random.default_rng(2)
    calib = rng.standard_normal((count, width)).astype(np.float32)
    evaluation = rng.standard_normal((count, width)).astype(np.float32)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    reference = session.run(None, {"input": evaluation})[0]
    return ZooEntry(
        name=name, description="test model", build=lambda: None,
        example_inputs=lambda batch: {"input": np.resize(evaluation, (batch, width))},
        calibration=lambda n: {"input": calib[:n]},
        evaluation=lambda: EvalSet({"input": evaluation}, reference),
        metric=Metric("cosine", partial(metrics.mean_cosine, output="output"), True, ""),
        input_names=("input",), output_names=("output",))


@pytest.fixture(scope="session")
def mlp_model(tmp_path_factory: pytest.TempPathFactory) -> FakeResolved:
    path = mlp_onnx(tmp_path_factory.mktemp("mlp") / "mlp.onnx")
    return FakeResolved("mlp", ModelArtifact("mlp", path), cosine_entry(path, "mlp", 32))


@pytest.fixture(scope="session")
def weightless_model(tmp_path_factory: pytest.TempPathFactory) -> FakeResolved:
    path = weightless_onnx(tmp_path_factory.mktemp("weightless") / "weightless.onnx")
    return FakeResolved("weightless", ModelArtifact("weightless", path),
                        cosine_entry(path, "weightless", 8))


@pytest.fixture(scope="session")
def digits_model() -> Any:
    from turboinfer.models import resolve_model

    return resolve_model("builtin:digits-cnn")

