"""ONNX Runtime's GPU providers: their options, the error without onnxruntime-gpu, and
the I/O-binding run (exercised on the CPU device here; on CUDA where a GPU is present)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from turboinfer.cli import main
from turboinfer.engines import EngineSettings, ModelArtifact, Precision, load_session
from turboinfer.engines.onnxruntime import session_options
from turboinfer.engines.onnxruntime_gpu import BoundRun, check_available, gpu_providers
from turboinfer.errors import ConfigError, InvalidInputError
from turboinfer.models import ResolvedModel, resolve_model

has_cuda_provider = "CUDAExecutionProvider" in ort.get_available_providers()


@pytest.fixture(scope="module")
def digits() -> ResolvedModel:
    return resolve_model("builtin:digits-cnn")


def _options(providers: list[object], name: str) -> dict[str, str]:
    return next(p[1] for p in providers if isinstance(p, tuple) and p[0] == name)


def test_tensorrt_takes_fp16_a_cache_folder_and_cuda_graphs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURBOINFER_CACHE_DIR", str(tmp_path))
    providers = gpu_providers(EngineSettings(device="tensorrt", precision=Precision.FP16,
                                             cuda_graphs=True))
    assert [p[0] if isinstance(p, tuple) else p for p in providers] == [
        "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    trt = _options(providers, "TensorrtExecutionProvider")
    assert trt["trt_fp16_enable"] == "1" and trt["trt_cuda_graph_enable"] == "1"
    assert trt["trt_engine_cache_enable"] == "1"
    assert trt["trt_engine_cache_path"] == str(tmp_path / "tensorrt")
    assert (tmp_path / "tensorrt").is_dir()
    assert "enable_cuda_graph" not in _options(providers, "CUDAExecutionProvider")


def test_cuda_takes_cuda_graphs_and_tf32_but_not_fp16() -> None:
    cuda = _options(gpu_providers(EngineSettings(device="cuda", cuda_graphs=True,
                                                 precision=Precision.TF32)),
                    "CUDAExecutionProvider")
    assert cuda == {"device_id": "0", "enable_cuda_graph": "1", "use_tf32": "1"}
    with pytest.raises(ConfigError, match="needs device tensorrt"):
        gpu_providers(EngineSettings(device="cuda", precision=Precision.FP16))


def test_a_missing_gpu_provider_names_the_gpu_extra() -> None:
    with pytest.raises(ConfigError, match=r"TensorrtExecutionProvider.*turboinfer\[gpu\]"):
        check_available("tensorrt", ["CPUExecutionProvider"])


@pytest.mark.skipif(has_cuda_provider, reason="this onnxruntime has the CUDA provider")
def test_bench_on_cuda_without_onnxruntime_gpu_is_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "builtin:digits-cnn", "--device", "cuda", "--min-runs", "1",
                 "--min-seconds", "0"]) == 2
    err = capsys.readouterr().err
    assert "turboinfer[gpu]" in err and "CUDAExecutionProvider" in err
    assert err.count("\n") == 1 and "Traceback" not in err


def _bound(model: ResolvedModel, fixed: bool) -> tuple[BoundRun, ort.InferenceSession]:
    path = str(model.artifact.onnx_path)
    session = ort.InferenceSession(path, session_options(EngineSettings()),
                                   providers=["CPUExecutionProvider"])
    plain = load_session(model.artifact, "onnxruntime")
    return BoundRun(session, plain.inputs, plain.outputs, device="cpu", fixed=fixed), session


def test_bound_runs_match_plain_runs_and_rebind_on_a_new_shape(digits: ResolvedModel) -> None:
    bound, session = _bound(digits, fixed=False)
    assert digits.entry is not None
    results = []
    for rows in (4, 4, 2, 4):
        feeds = dict(digits.entry.example_inputs(rows))
        want = session.run(None, feeds)[0]
        got = bound.run(feeds)
        np.testing.assert_allclose(got["logits"], want, atol=1e-6)
        assert got["logits"].shape == (rows, 10)
        results.append((got["logits"], want))
    for got_logits, want in results:  # each result is its own copy, not the bound buffer
        np.testing.assert_allclose(got_logits, want, atol=1e-6)


def test_fixed_binding_needs_fixed_shapes(digits: ResolvedModel) -> None:
    with pytest.raises(ConfigError, match="needs fixed shapes"):
        _bound(digits, fixed=True)


def test_a_fixed_binding_refuses_another_shape(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    path = tmp_path / "relu.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8   # what ONNX Runtime releases back to 1.15 load
    onnx.save(model, path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    plain = load_session(ModelArtifact("relu", path), "onnxruntime")
    bound = BoundRun(session, plain.inputs, plain.outputs, device="cpu", fixed=True)
    x = np.array([[-1, 2, -3], [4, -5, 6]], dtype=np.float32)
    np.testing.assert_array_equal(bound.run({"x": x})["y"], np.maximum(x, 0))
    first = bound.run({"x": x})["y"]
    bound.run({"x": -x})
    np.testing.assert_array_equal(first, np.maximum(x, 0))  # results are copies
    with pytest.raises(InvalidInputError, match=r"has shape \[1, 3\], expected \[2, 3\]"):
        bound.run({"x": np.zeros((1, 3), dtype=np.float32)})


@pytest.mark.skipif(not has_cuda_provider, reason="needs onnxruntime-gpu and CUDA")
def test_cuda_provider_with_binding_matches_the_cpu(digits: ResolvedModel) -> None:
    assert digits.entry is not None
    feeds = dict(digits.entry.example_inputs(8))
    want = load_session(digits.artifact, "onnxruntime").run(feeds)
    got = load_session(digits.artifact, "onnxruntime", EngineSettings(device="cuda")).run(feeds)
    np.testing.assert_allclose(got["logits"], want["logits"], atol=1e-3)
