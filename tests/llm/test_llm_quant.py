"""Weight-only int8/int4: the kernels compute what the quantized weights say, and the
quantized model stays close to the float one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from turboinfer.llm.model.config import QuantMode
from turboinfer.llm.model.loader import load_model
from turboinfer.llm.model.quant import (
    Int4Handler,
    Int8Handler,
    dequantize_int4,
    quantize_int4,
    quantize_int4_native,
    quantize_int8,
    quantize_model,
    reused_quantization,
)
from turboinfer.llm.perplexity import perplexity


@pytest.fixture
def linear() -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(128, 64, bias=True).requires_grad_(False)


def test_int8_kernel_matches_dequantized_weights(linear: nn.Linear) -> None:
    x = torch.randn(5, 128)
    q, scales = quantize_int8(linear.weight)
    want = x @ (q.float() * scales[:, None]).T + linear.bias
    # bf16 activations inside the kernel: agreement to bf16 precision.
    torch.testing.assert_close(Int8Handler().module(linear)(x), want, atol=2e-2, rtol=2e-2)
    assert (q.float() * scales[:, None] - linear.weight).abs().max() <= scales.max() / 2 + 1e-6


@pytest.mark.parametrize("group", [32, 64])
def test_int4_kernel_matches_dequantized_weights(linear: nn.Linear, group: int) -> None:
    x = torch.randn(3, 128)
    q, scales, low = quantize_int4(linear.weight, group)
    assert int(q.min()) >= 0 and int(q.max()) <= 15
    deq = dequantize_int4(q, scales, low, group)
    out = Int4Handler(group).module(linear)(x)
    torch.testing.assert_close(out, x @ deq.T + linear.bias, atol=2e-2, rtol=2e-2)
    assert float((deq - linear.weight).abs().max()) <= float(scales.max()) / 2 + 1e-6


@pytest.mark.parametrize("mode", [QuantMode.INT8, QuantMode.INT4])
def test_quantized_model_perplexity_close_to_float(tiny_llama_dir: Path,
                                                   mode: QuantMode) -> None:
    tokens = [(i * 37 + i // 7) % 128 for i in range(300)]
    model = load_model(tiny_llama_dir)
    base = perplexity(model, tokens, window=128)
    replaced = quantize_model(model, mode, group_size=32)
    assert replaced == 2 * 4 + 1  # qkv, o, gate_up, down per layer, and the LM head
    quant = perplexity(model, tokens, window=128)
    assert quant != base
    assert abs(quant / base - 1) < (0.02 if mode is QuantMode.INT8 else 0.15)


def test_reused_quantization_gives_fresh_copies_of_the_same_numbers() -> None:
    """Within ``reused_quantization`` a weight quantized again the same way gets the first
    result's numbers in new memory (each timed kernel copy reads its own); another
    weight, other arguments, or the same weight changed in place are quantized anew."""
    weight = torch.randn(64, 128, generator=torch.Generator().manual_seed(1))
    other = torch.randn(64, 128, generator=torch.Generator().manual_seed(2))
    with reused_quantization():
        first = quantize_int8(weight)
        again = quantize_int8(weight.detach())    # another view of the same numbers
        assert all(torch.equal(a, b) and a.data_ptr() != b.data_ptr()
                   for a, b in zip(first, again, strict=True))
        assert torch.equal(quantize_int8(weight, qmax=63)[0], quantize_int8(weight, 63)[0])
        assert not torch.equal(quantize_int8(weight, qmax=63)[0], first[0])
        assert torch.equal(quantize_int8(other)[0], quantize_int8.__wrapped__(other)[0])
        assert all(torch.equal(a, b) for a, b in zip(
            quantize_int4_native(weight), quantize_int4_native.__wrapped__(weight),
            strict=True))
        weight.mul_(2)                              # in place: a new version
        assert torch.equal(quantize_int8(weight)[1], 2 * first[1])


def test_reused_quantization_takes_inference_tensors() -> None:
    """A weight made in inference mode has no version counter: still quantized, reused."""
    with torch.inference_mode():
        weight = torch.randn(8, 32)
        with reused_quantization():
            first, again = quantize_int8(weight), quantize_int8(weight)
    assert torch.equal(first[0], again[0]) and first[0].data_ptr() != again[0].data_ptr()
