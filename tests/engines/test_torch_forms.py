"""The torch engine's forms on the CPU (fp32, bf16, channels_last, torch.compile) against
ONNX Runtime on the same model, and its CUDA path where a GPU is present."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from turboinfer.engines import (
    CompileMode,
    EngineSettings,
    Precision,
    Toggle,
    load_session,
)
from turboinfer.engines.torch import does_not_fit
from turboinfer.engines.torch.buckets import bucket_for, bucket_sizes
from turboinfer.engines.torch.forms import flat_tensors
from turboinfer.errors import ConfigError, InvalidInputError
from turboinfer.models import ResolvedModel, resolve_model

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def digits() -> ResolvedModel:
    return resolve_model("builtin:digits-cnn")


def feeds(model: ResolvedModel, rows: int) -> dict[str, np.ndarray]:
    assert model.entry is not None
    return dict(model.entry.example_inputs(rows))


def reference(model: ResolvedModel, rows: int) -> dict[str, np.ndarray]:
    return load_session(model.artifact, "onnxruntime").run(feeds(model, rows))


def test_fp32_matches_onnxruntime_names_shapes_and_values(digits: ResolvedModel) -> None:
    ort = load_session(digits.artifact, "onnxruntime")
    session = load_session(digits.artifact, "torch")
    assert [s.to_dict() for s in session.inputs] == [s.to_dict() for s in ort.inputs]
    assert [s.to_dict() for s in session.outputs] == [s.to_dict() for s in ort.outputs]
    got, want = session.run(feeds(digits, 5)), reference(digits, 5)
    assert list(got) == list(want)
    for name, value in want.items():
        assert got[name].dtype == np.float32 and got[name].shape == value.shape
        np.testing.assert_allclose(got[name], value, atol=1e-4)


def test_bf16_is_close_to_fp32_and_answers_in_float32(digits: ResolvedModel) -> None:
    session = load_session(digits.artifact, "torch", EngineSettings(precision=Precision.BF16))
    assert session.form["precision"] == "bf16"  # type: ignore[attr-defined]
    got, want = session.run(feeds(digits, 8)), reference(digits, 8)
    for name, value in want.items():
        assert got[name].dtype == np.float32
        # bf16 keeps 8 bits of mantissa: logits agree to a few hundredths, classes agree.
        np.testing.assert_allclose(got[name], value, atol=0.25, rtol=0.05)
        assert (got[name].argmax(1) == value.argmax(1)).mean() >= 0.75


def test_channels_last_on_gives_the_same_result(digits: ResolvedModel) -> None:
    session = load_session(digits.artifact, "torch", EngineSettings(channels_last=Toggle.ON))
    assert session.form["channels_last"] is True  # type: ignore[attr-defined]
    got, want = session.run(feeds(digits, 3)), reference(digits, 3)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, atol=1e-4)


def test_channels_last_auto_stays_off_on_the_cpu(digits: ResolvedModel) -> None:
    session = load_session(digits.artifact, "torch", EngineSettings(precision=Precision.BF16))
    assert session.form["channels_last"] is False  # type: ignore[attr-defined]


@pytest.mark.slow
def test_compiled_at_load_runs_every_batch_size(digits: ResolvedModel) -> None:
    session = load_session(digits.artifact, "torch", EngineSettings(
        compile=CompileMode.DEFAULT, max_batch_size=8))
    for rows in (1, 2, 7):
        got, want = session.run(feeds(digits, rows)), reference(digits, rows)
        for name, value in want.items():
            assert got[name].shape == value.shape
            np.testing.assert_allclose(got[name], value, atol=1e-4)


@pytest.mark.parametrize(("settings", "message"), [
    (EngineSettings(precision=Precision.FP16), "fp16 runs on device cuda"),
    (EngineSettings(precision=Precision.TF32), "tf32 is a CUDA tensor-core mode"),
    (EngineSettings(device="tensorrt"), "ONNX Runtime's TensorRT provider"),
])
def test_forms_the_cpu_cannot_run_are_config_errors(digits: ResolvedModel,
                                                      settings: EngineSettings,
                                                      message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_session(digits.artifact, "torch", settings)


def test_cuda_graphs_need_a_gpu_device() -> None:
    with pytest.raises(ConfigError, match="cuda_graphs needs a GPU device"):
        EngineSettings(cuda_graphs=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_device_cuda_without_a_gpu_is_a_config_error(digits: ResolvedModel) -> None:
    with pytest.raises(ConfigError, match=r"device 'cuda' needs a CUDA build of torch"):
        load_session(digits.artifact, "torch", EngineSettings(device="cuda"))


def test_a_wrong_dtype_is_refused_not_converted(digits: ResolvedModel) -> None:
    session = load_session(digits.artifact, "torch")
    wrong = {k: v.astype(np.float64) for k, v in feeds(digits, 2).items()}
    with pytest.raises(InvalidInputError, match="dtype float64, expected float32"):
        session.run(wrong)


def test_other_engines_refuse_the_torch_forms(digits: ResolvedModel) -> None:
    with pytest.raises(ConfigError, match="does not take compile=default"):
        load_session(digits.artifact, "onnxruntime",
                     EngineSettings(compile=CompileMode.DEFAULT))


def test_buckets_are_powers_of_two_and_the_maximum() -> None:
    assert bucket_sizes(64) == (1, 2, 4, 8, 16, 32, 64)
    assert bucket_sizes(48) == (1, 2, 4, 8, 16, 32, 48)
    assert bucket_sizes(0) == (1,)
    assert bucket_for(5, bucket_sizes(64)) == 8
    assert bucket_for(64, bucket_sizes(64)) == 64
    assert bucket_for(65, bucket_sizes(64)) is None


def test_outputs_of_any_structure_flatten_in_order() -> None:
    a, b, c = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    assert [t.item() for t in flat_tensors({"x": a, "y": (b, [c])})] == [0.0, 1.0, 2.0]


def test_the_load_error_of_a_model_too_large_names_sizes() -> None:
    text = does_not_fit("resnet50", EngineSettings(max_batch_size=64), 102 * 2**20,
                        3 * 2**30, 80 * 2**30)
    assert "model 'resnet50' does not fit on the GPU" in text
    assert "0.10 GiB" in text and "3.00 of 80.00 GiB are free" in text
    assert "\n" not in text


# --- CUDA only -------------------------------------------------------------------------


@needs_cuda
@pytest.mark.parametrize("precision", [Precision.FP32, Precision.FP16])
def test_cuda_graphs_replay_padded_batches_like_eager(digits: ResolvedModel,
                                                      precision: Precision) -> None:
    eager = load_session(digits.artifact, "torch", EngineSettings(device="cuda",
                                                                  precision=precision))
    graphed = load_session(digits.artifact, "torch", EngineSettings(
        device="cuda", precision=precision, cuda_graphs=True, max_batch_size=16))
    assert graphed.form["cuda_graphs"] == [1, 2, 4, 8, 16]  # type: ignore[attr-defined]
    for rows in (1, 3, 16, 17):  # 3 pads to 4; 17 is beyond the buckets: eager
        want, got = eager.run(feeds(digits, rows)), graphed.run(feeds(digits, rows))
        for name, value in want.items():
            assert got[name].shape == value.shape and got[name].dtype == np.float32
            np.testing.assert_allclose(got[name], value, atol=1e-2 if precision.value ==
                                       "fp16" else 1e-4)


@needs_cuda
def test_each_instance_runs_on_its_own_stream(digits: ResolvedModel) -> None:
    settings = EngineSettings(device="cuda", cuda_graphs=True, max_batch_size=4)
    one, two = (load_session(digits.artifact, "torch", settings) for _ in range(2))
    streams = [s.runner.stream for s in (one, two)]  # type: ignore[attr-defined]
    assert streams[0] != streams[1]
    assert torch.cuda.current_stream() not in streams


@needs_cuda
def test_results_do_not_change_when_the_next_batch_runs(digits: ResolvedModel) -> None:
    session = load_session(digits.artifact, "torch", EngineSettings(
        device="cuda", cuda_graphs=True, max_batch_size=8))
    first = session.run(feeds(digits, 4))
    kept = {k: v.copy() for k, v in first.items()}
    session.run({k: v * 0 for k, v in feeds(digits, 4).items()})
    for name, value in kept.items():
        np.testing.assert_array_equal(first[name], value)
