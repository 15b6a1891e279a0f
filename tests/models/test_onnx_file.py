from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from turboinfer.errors import ModelLoadError, UnknownModelError
from turboinfer.models import resolve_model
from turboinfer.models.onnx_file import check_onnx, input_specs, output_specs
from turboinfer.models.zoo import RunFn

OrtRunner = Callable[[Path], RunFn]


def _matmul_model(weight: np.ndarray) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", weight.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", weight.shape[1]])],
        initializer=[numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


@pytest.fixture
def weight() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((32, 8)).astype(np.float32)


@pytest.fixture
def external_model(tmp_path: Path, weight: np.ndarray) -> Path:
    path = tmp_path / "ext" / "model.onnx"
    path.parent.mkdir()
    onnx.save_model(
        _matmul_model(weight),
        str(path),
        save_as_external_data=True,
        location="model.onnx.data",
        size_threshold=0,
    )
    return path


def test_missing_file_is_unknown_model(tmp_path: Path) -> None:
    missing = tmp_path / "nope.onnx"
    with pytest.raises(UnknownModelError, match=f"model file not found: {missing}"):
        check_onnx(missing)
    with pytest.raises(UnknownModelError, match="model file not found"):
        resolve_model(str(missing))


@pytest.mark.parametrize("content", [os.urandom(4096), b"", b"not an onnx model\n"])
def test_corrupt_file_is_load_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "broken.onnx"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError) as info:
        resolve_model(str(path))
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_directory_is_load_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not a file"):
        check_onnx(tmp_path)


def test_external_data_resolves_beside_the_model(
    external_model: Path,
    weight: np.ndarray,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    ort_run: OrtRunner,
) -> None:
    monkeypatch.chdir(tmp_path)  # the data file must be found next to the model, not here
    resolved = resolve_model(str(external_model))
    assert resolved.name == "model" and resolved.entry is None
    assert resolved.artifact.torch_module is None
    loaded = check_onnx(external_model, load_weights=True)
    np.testing.assert_array_equal(numpy_helper.to_array(loaded.graph.initializer[0]), weight)
    x = np.ones((3, 32), np.float32)
    y = ort_run(external_model)({"x": x})["y"]
    np.testing.assert_allclose(y, x @ weight, rtol=1e-5)


def test_missing_external_data_is_load_error(external_model: Path) -> None:
    (external_model.parent / "model.onnx.data").unlink()
    with pytest.raises(ModelLoadError, match=r"weight 'w' lives in .*model\.onnx\.data.*missing"):
        check_onnx(external_model)


def test_truncated_external_data_is_load_error(external_model: Path) -> None:
    data = external_model.parent / "model.onnx.data"
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(ModelLoadError, match="truncated"):
        check_onnx(external_model)


def test_specs_keep_symbolic_dims(tmp_path: Path, weight: np.ndarray) -> None:
    model = _matmul_model(weight)
    # Older exporters list weights among the inputs; callers must not be asked to feed them.
    model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [32, 8]))
    (spec,) = input_specs(model)
    assert (spec.name, spec.dtype, spec.shape) == ("x", np.dtype(np.float32), ("batch", 32))
    assert output_specs(model)[0].to_dict() == {
        "name": "y",
        "dtype": "float32",
        "shape": ["batch", 8],
    }
