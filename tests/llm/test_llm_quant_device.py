"""Weight-only int8/int4 for the general path: the fallback is exact dequantization, a
kernel is kept only where it agrees with it."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from turboinfer.llm.model.config import QuantMode
from turboinfer.llm.model.llama import LlamaModel
from turboinfer.llm.model.quant import dequantize_int4, quantize_int4, quantize_int8
from turboinfer.llm.model.quant_device import (
    DequantInt4Linear,
    DequantInt8Linear,
    quantize_for_device,
    quantized_linear,
)


def _linear(out_f: int = 48, in_f: int = 64, bias: bool = True) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(in_f, out_f, bias=bias)


def test_the_int8_fallback_is_the_dequantized_matmul() -> None:
    linear = _linear()
    layer = quantized_linear(linear, QuantMode.INT8, 32)
    assert isinstance(layer, DequantInt8Linear) and not layer.use_kernel
    q, scales = quantize_int8(linear.weight.detach())
    x = torch.randn(5, 64)
    torch.testing.assert_close(layer(x), F.linear(x, q.float() * scales[:, None], linear.bias),
                               rtol=0, atol=0)


def test_the_int4_fallback_unpacks_its_nibbles_exactly() -> None:
    linear = _linear(bias=False)
    layer = quantized_linear(linear, QuantMode.INT4, 32)
    assert isinstance(layer, DequantInt4Linear) and layer.packed.dtype == torch.uint8
    q, scales, low = quantize_int4(linear.weight.detach(), 32)
    assert torch.equal(layer.weight(torch.float32), dequantize_int4(q, scales, low, 32))
    x = torch.randn(3, 2, 64)
    assert layer(x).shape == (3, 2, 48)
    assert quantized_linear(_linear(in_f=48), QuantMode.INT4, 32) is None  # not whole groups


@pytest.mark.parametrize("mode", [QuantMode.INT8, QuantMode.INT4])
def test_a_quantized_model_computes_with_its_dequantized_weights(tiny_model: LlamaModel,
                                                                 mode: QuantMode) -> None:
    quantized = copy.deepcopy(tiny_model)
    counts = quantize_for_device(quantized, mode, group_size=32, kernels=False)
    linears = dict(tiny_model.named_modules())
    assert counts["dequant"] == sum(isinstance(m, nn.Linear) for m in linears.values())
    assert not any(isinstance(m, nn.Linear) for m in quantized.modules())
    # The float model with each layer's weight replaced by its dequantized one.
    reference = copy.deepcopy(tiny_model)
    for name, layer in quantized.named_modules():
        if isinstance(layer, DequantInt8Linear | DequantInt4Linear):
            target = reference.get_submodule(name)
            target.weight = nn.Parameter(layer.weight(torch.float32), requires_grad=False)
    ids = torch.tensor([5, 9, 17, 33, 2, 80])
    want = reference.logits(reference(ids, torch.arange(6)))
    got = quantized.logits(quantized(ids, torch.arange(6)))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_int8_stays_close_to_float(tiny_model: LlamaModel) -> None:
    model = copy.deepcopy(tiny_model)
    quantize_for_device(model, QuantMode.INT8)   # the CPU's int8 kernel where it agrees
    ids = torch.tensor([5, 9, 17, 33, 2, 80])
    want = tiny_model.logits(tiny_model(ids, torch.arange(6)))
    got = model.logits(model(ids, torch.arange(6)))
    assert (got - want).abs().max() < 0.1 * want.abs().max()


def test_without_kernels_every_layer_dequantizes(tiny_model: LlamaModel) -> None:
    model = copy.deepcopy(tiny_model)
    counts = quantize_for_device(model, QuantMode.INT8, kernels=False)
    assert counts["kernel"] == 0 and counts["dequant"] > 0
    assert quantize_for_device(model, QuantMode.NONE) == {"kernel": 0, "dequant": 0}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", [QuantMode.INT8, QuantMode.INT4])
def test_on_cuda_the_kernels_run_and_agree(tiny_model: LlamaModel, mode: QuantMode) -> None:
    model = copy.deepcopy(tiny_model).to("cuda", torch.bfloat16)
    counts = quantize_for_device(model, mode, group_size=32)
    assert counts["kernel"] > 0, counts
