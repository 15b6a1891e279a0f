"""Fake quantization against the engine's own quantizer, and the QAT loop on real models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

from turboinfer.models import digits
from turboinfer.models.export import export_onnx
from turboinfer.models.zoo import get_entry
from turboinfer.prune.data import TrainData
from turboinfer.qat.fakequant import (
    LEVELS,
    ActivationFakeQuant,
    WeightFakeQuant,
    fake_quantized,
    observe_inputs,
)
from turboinfer.qat.train import QATSettings, qat_finetune


def test_weights_are_quantized_as_onnx_runtime_quantizes_them(tmp_path: Path) -> None:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3, bias=False).eval()
    with torch.no_grad():
        conv.weight.mul_(torch.logspace(-2, 1, 8)[:, None, None, None])  # spread channels
    path = export_onnx(conv, {"x": np.zeros((1, 3, 6, 6), np.float32)}, tmp_path / "c.onnx",
                       input_names=["x"], output_names=["y"], dynamic_axes={})

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter([{"x": np.random.default_rng(0).standard_normal(
                (1, 3, 6, 6)).astype(np.float32)}])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    quantize_static(str(path), str(tmp_path / "q.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True, weight_type=QuantType.QInt8)
    model = onnx.load(str(tmp_path / "q.onnx"))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    dequant = next(n for n in model.graph.node if n.op_type == "DequantizeLinear"
                   and inits.get(n.input[0]) is not None and inits[n.input[0]].ndim == 4)
    q, scale = inits[dequant.input[0]], inits[dequant.input[1]]
    engine = q.astype(np.float32) * scale[:, None, None, None]
    ours = WeightFakeQuant()(conv.weight.detach()).numpy()
    np.testing.assert_allclose(ours, engine, rtol=1e-6, atol=1e-7)


def test_activations_take_256_levels_and_train_their_range() -> None:
    quant = ActivationFakeQuant(-1.0, 3.0)
    x = torch.linspace(-2, 5, 1000, requires_grad=True)
    y = quant(x)
    step = 4.0 / LEVELS
    assert torch.allclose(y.detach().min(), torch.tensor(-1.0), atol=step)
    assert torch.allclose(y.detach().max(), torch.tensor(3.0), atol=step)
    assert len(torch.unique(y.detach())) <= LEVELS + 1
    y.sum().backward()
    assert x.grad is not None
    inside = (x.detach() > -0.99) & (x.detach() < 2.99)
    assert torch.all(x.grad[inside] == 1) and torch.all(x.grad[x.detach() > 3.1] == 0)
    assert quant.log_high.grad is not None and quant.log_high.grad != 0


def test_fake_quantization_is_removed_and_keeps_the_trained_weights() -> None:
    model = get_entry("digits-cnn").build()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.from_numpy(digits.data().test_x[:16])
    ranges = observe_inputs(model, [(x,)])
    assert set(ranges) == {"features.0", "features.3", "classifier.2"}
    with torch.no_grad(), fake_quantized(model, ranges) as quantizers:
        assert set(quantizers) == set(ranges)
        noisy = model(x)
    assert not hasattr(model, "activation_quantizers")
    assert model.state_dict().keys() == before.keys()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with torch.no_grad():
        assert not torch.equal(noisy, model(x))


def test_qat_returns_a_clamped_copy_whose_export_carries_the_ranges(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    model = get_entry("digits-dsconv").build()
    split = digits.data()
    data = TrainData({"input": split.train_x[:256]}, split.train_y[:256], batch_size=64)
    result = qat_finetune(model, data, QATSettings(epochs=1, calib_batches=2))
    assert result.model is not model and len(result.losses) == 1
    assert set(result.ranges_after) == set(result.ranges_before)
    path = export_onnx(result.model, {"input": split.test_x[:2]}, tmp_path / "qat.onnx",
                       input_names=["input"], output_names=["logits"], dynamic_axes={})
    clips = [n for n in onnx.load(str(path)).graph.node if n.op_type == "Clip"]
    assert len(clips) == len(result.ranges_after)


@pytest.mark.parametrize("name", ["digits-cnn", "digits-dsconv"])
def test_the_spread_model_computes_what_it_was_trained_to(name: str) -> None:
    # digits-dsconv's channel spread keeps the function: both are trained to ~99%.
    model = get_entry(name).build()
    split = digits.data()
    with torch.no_grad():
        predicted = model(torch.from_numpy(split.test_x)).argmax(-1).numpy()
    assert (predicted == split.test_y).mean() > 0.97


def test_a_time_budget_stops_training_after_the_batch_that_spends_it() -> None:
    torch.set_num_threads(1)
    model = get_entry("digits-cnn").build()
    split = digits.data()
    data = TrainData({"input": split.train_x[:256]}, split.train_y[:256], batch_size=64)
    result = qat_finetune(model, data, QATSettings(epochs=5, calib_batches=1, minutes=1e-6))
    assert len(result.losses) == 1
