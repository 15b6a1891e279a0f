"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

# Every test times its kernels as it runs (the servers it starts too): choices remembered
# on disk from an earlier run would make one test's outcome depend on another's.
# tests/llm/test_kernel_decision_cache.py turns the cache on where it tests it.
os.environ["TURBOINFER_KERNEL_CACHE"] = "off"


def make_linear_onnx(path: Path, weight: np.ndarray, bias: np.ndarray) -> Path:
    """A one-Gemm ONNX model ``logits = input @ weight + bias`` with a dynamic batch."""
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["input", "weight", "bias"], ["logits"])],
        "linear",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", weight.shape[0]])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", weight.shape[1]])],
        initializer=[numpy_helper.from_array(weight, "weight"),
                     numpy_helper.from_array(bias, "bias")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="session")
def linear_weights() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (rng.standard_normal((16, 4)).astype(np.float32),
            rng.standard_normal(4).astype(np.float32))


@pytest.fixture(scope="session")
def linear_onnx(tmp_path_factory: pytest.TempPathFactory,
                linear_weights: tuple[np.ndarray, np.ndarray]) -> Path:
    return make_linear_onnx(tmp_path_factory.mktemp("linear") / "linear.onnx", *linear_weights)
