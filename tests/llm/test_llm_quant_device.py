"""int8/int4/fp8 for the general path: the fallback is exact dequantization, a kernel is
kept only where it agrees with it and is not slower."""

from __future__ import annotations

import copy
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from turboinfer.llm.backends.cpu.kernels import read_bytes_per_token
from turboinfer.llm.model.config import QuantMode
from turboinfer.llm.model.llama import LlamaModel
from turboinfer.llm.model.quant import dequantize_int4, quantize_int4, quantize_int8
from turboinfer.llm.model.quant_device import (
    FP8,
    FP8_AGREEMENT,
    DequantInt4Linear,
    DequantInt8Linear,
    Fp8Linear,
    _try_kernel,
    quantize_for_device,
    quantize_fp8,
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


def test_fp8_keeps_each_channel_within_float8_rounding() -> None:
    weight = _linear().weight.detach()
    q, scales = quantize_fp8(weight)
    assert q.dtype == FP8 and scales.dtype == torch.float32
    back = q.float() * scales[:, None]
    # 3 mantissa bits: each weight within 1/16 of itself, or of the channel's smallest
    # float8 step; the largest weight of each channel lands on float8's largest value.
    assert ((back - weight).abs() <= weight.abs() / 16 + scales[:, None] * 2**-9).all()
    torch.testing.assert_close(back.abs().amax(1), weight.abs().amax(1))


def test_the_fp8_fallback_is_the_dequantized_matmul() -> None:
    linear = _linear()
    layer = quantized_linear(linear, QuantMode.FP8, 32)
    assert isinstance(layer, Fp8Linear) and not layer.use_kernel
    x = torch.randn(2, 3, 64)
    want = F.linear(x, layer.q.float() * layer.scales[:, None], linear.bias)
    torch.testing.assert_close(layer(x), want, rtol=0, atol=0)


def test_the_fp8_kernel_scales_each_row_of_activations() -> None:
    layer = quantized_linear(_linear(out_f=64), QuantMode.FP8, 32)
    assert isinstance(layer, Fp8Linear)
    # Rows a thousand times apart: one scale for the whole input would flush the small
    # row's activations to zero.
    x = torch.randn(2, 64) * torch.tensor([[1e3], [1.0]])
    want = layer(x)
    layer.enable_kernel()
    try:
        got = layer(x)
    except RuntimeError as err:   # torch builds before 2.12 scale float8 per tensor on CPUs
        pytest.skip(f"torch._scaled_mm with a scale per row does not run here: {err}")
    for row in range(2):
        err = (got[row] - want[row]).abs().max() / want[row].abs().max()
        assert err <= FP8_AGREEMENT, (row, float(err))


def test_fp8_leaves_the_lm_head_in_the_models_dtype(tiny_model: LlamaModel) -> None:
    model = copy.deepcopy(tiny_model)
    counts = quantize_for_device(model, QuantMode.FP8, kernels=False)
    assert type(model.lm_head) is nn.Linear
    fp8 = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    assert counts == {"kernel": 0, "dequant": len(fp8)} and fp8
    ids = torch.tensor([5, 9, 17, 33, 2, 80])
    want = tiny_model.logits(tiny_model(ids, torch.arange(6)))
    got = model.logits(model(ids, torch.arange(6)))
    # float8 keeps 3 mantissa bits (int8's channels keep about 7): further than int8's
    # 0.1, far from a wrong layout's 1.
    assert (got - want).abs().max() < 0.25 * want.abs().max()


class _SlowKernelFp8(Fp8Linear):
    """An fp8 layer whose kernel is its fallback's matmul, plus 20 ms a call."""

    def _kernel(self, flat: torch.Tensor) -> torch.Tensor:
        time.sleep(0.02)
        return F.linear(flat, self.weight(flat.dtype))


def test_a_kernel_slower_than_its_fallback_is_not_kept() -> None:
    fast = quantized_linear(_linear(), QuantMode.FP8, 32)
    assert isinstance(fast, Fp8Linear)
    slow = _SlowKernelFp8(fast.q, fast.scales, fast.bias)
    assert not _try_kernel(slow, torch.float32) and not slow.use_kernel


def test_a_quantized_layer_counts_its_stored_bytes_in_the_roofline(
        tiny_model: LlamaModel) -> None:
    plain = read_bytes_per_token(tiny_model)
    for mode, share in ((QuantMode.INT8, 0.25), (QuantMode.FP8, 0.25), (QuantMode.INT4, 0.125)):
        model = copy.deepcopy(tiny_model)
        quantize_for_device(model, mode, group_size=32, kernels=False)
        # The float32 weights shrink to a byte (int8, fp8) or half a byte (int4) each,
        # plus scales; the embedding row and the norms stay.
        assert share * plain < read_bytes_per_token(model) < plain, mode


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_hopper_the_fp8_kernel_is_kept() -> None:
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 tensor cores need sm89 (Ada) or sm90 (Hopper)")
    torch.manual_seed(0)
    linear = nn.Linear(4096, 4096, bias=False, device="cuda", dtype=torch.bfloat16)
    layer = quantized_linear(linear, QuantMode.FP8, 32)
    assert layer is not None and _try_kernel(layer, torch.bfloat16) and layer.use_kernel


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", [QuantMode.INT8, QuantMode.INT4])
def test_on_cuda_the_kernels_run_and_agree(mode: QuantMode) -> None:
    # Whether a kernel is kept also depends on its speed; here: that it runs and agrees.
    torch.manual_seed(0)
    linear = nn.Linear(1024, 1024, bias=False, device="cuda", dtype=torch.bfloat16)
    layer = quantized_linear(linear, mode, 32)
    assert layer is not None
    x = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
    want = layer(x).float()
    layer.enable_kernel()
    got = layer(x).float()
    assert (got - want).abs().max() <= layer.agreement * want.abs().max()
