"""Weight-only quantization of the linear layers, applied at load time.

int8: one scale per output channel (symmetric). int4: asymmetric groups of
``group_size`` input channels, each with a scale and a zero point. Activations are not
quantized: the matmuls run on torch's CPU weight-only kernels, which read the packed
weights directly instead of materialising a float copy. Those kernels are vectorised
for bf16 activations only (measured, 1 thread, 768->2304, batch 1: int8 0.10 ms and
int4 0.09 ms with bf16 inputs, 1.0 ms and 2.8 ms with fp32 inputs, fp32 F.linear
0.28 ms), so inputs are cast to bf16 for the matmul and the result back to fp32.

Each mode is a handler with two methods, ``quantize`` (float weight -> packed tensors)
and ``module`` (packed tensors -> a drop-in ``nn.Module``), looked up in a table. ``LLM``
itself does not fix the kernel: ``backends/cpu/kernels.py`` times these weight-only kernels (with
bf16 and fp32 activations) against fbgemm's dynamic-int8 linear at load and keeps the
fastest; the quantization functions here are what all of them share, and
``quantize_int4_native`` is the layout of the hand-written int4 kernel (``backends/cpu/native``).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch
from torch import nn

from turboinfer.errors import InvalidInputError
from turboinfer.llm.model.config import QuantMode

COMPUTE_DTYPE = torch.bfloat16


class Int8Linear(nn.Module):
    def __init__(self, weight: torch.Tensor, scales: torch.Tensor,
                 bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight: torch.Tensor
        self.scales: torch.Tensor
        self.register_buffer("weight", weight)   # [N, K] int8
        self.register_buffer("scales", scales)   # [N]
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).to(COMPUTE_DTYPE)
        out = torch._weight_int8pack_mm(flat, self.weight, self.scales).to(x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.view(*x.shape[:-1], -1)


class Int4Linear(nn.Module):
    def __init__(self, packed: torch.Tensor, scales_zeros: torch.Tensor, group_size: int,
                 out_features: int, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.packed: torch.Tensor
        self.scales_zeros: torch.Tensor
        self.register_buffer("packed", packed)              # [N, K/2] uint8
        self.register_buffer("scales_zeros", scales_zeros)  # [K/group, N, 2]
        self.group_size = group_size
        self.out_features = out_features
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).to(COMPUTE_DTYPE)
        out = torch._weight_int4pack_mm_for_cpu(flat, self.packed, self.group_size,
                                                self.scales_zeros).to(x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.view(*x.shape[:-1], self.out_features)


class QuantHandler(Protocol):
    def supports(self, linear: nn.Linear) -> bool: ...
    def module(self, linear: nn.Linear) -> nn.Module: ...


_REUSE = threading.local()
_Quantizer = TypeVar("_Quantizer", bound=Callable[..., tuple[torch.Tensor, ...]])


@contextmanager
def reused_quantization() -> Iterator[None]:
    """Within it, quantizing a weight again the same way returns copies of the first
    result instead of computing it again: the load-time kernel measurement builds each
    candidate several times (its timed copies, each row count, then the chosen one), and
    on SmolLM2's 49,152 x 576 LM head the repeated int8 quantization was 3.5 of the 6.5 s
    its GGUF file took to load. One weight's results are kept at a time (the latest
    weight's), on this thread only."""
    if getattr(_REUSE, "table", None) is not None:     # nested: the outer one holds
        yield
        return
    _REUSE.table, _REUSE.weight = {}, None
    try:
        yield
    finally:
        _REUSE.table, _REUSE.weight = None, None


def _reusable(fn: _Quantizer) -> _Quantizer:
    @functools.wraps(fn)
    def quantize(weight: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        table: dict[tuple[object, ...], tuple[torch.Tensor, ...]] | None = getattr(
            _REUSE, "table", None)
        if table is None:
            return fn(weight, *args, **kwargs)
        # The same numbers: same storage, place, layout, type and in-place version (an
        # inference tensor tracks none); the weight is held while its results are, so its
        # storage cannot be reused meanwhile.
        version = -1 if weight.is_inference() else weight._version
        where = (weight.data_ptr(), weight.device, tuple(weight.shape), weight.stride(),
                 weight.dtype, version)
        if _REUSE.weight is None or _REUSE.weight[1] != where:
            table.clear()
            _REUSE.weight = (weight, where)
        key = (fn.__name__, args, tuple(sorted(kwargs.items())))
        if key not in table:
            table[key] = fn(weight, *args, **kwargs)
        # Copies: a kernel may keep the tensors as they are, and its timed copies must
        # each read their own memory.
        return tuple(t.clone() for t in table[key])
    return quantize  # type: ignore[return-value]


@_reusable
def quantize_int8(weight: torch.Tensor, qmax: int = 127) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric int8: weight ≈ q * scale[:, None], |q| <= qmax."""
    scales = weight.abs().amax(dim=1).clamp(min=1e-8) / qmax
    q = torch.clamp(torch.round(weight / scales[:, None]), -qmax, qmax).to(torch.int8)
    return q, scales.to(weight.dtype)


@_reusable
def quantize_int4(weight: torch.Tensor, group_size: int,
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit groups along the input axis: weight ≈ q * scale + minimum.

    Returns (q [N, K] int32 in 0..15, scales [N, K/g], minimums [N, K/g]).
    """
    n, k = weight.shape
    groups = weight.float().reshape(n, k // group_size, group_size)
    low = groups.amin(dim=-1)
    scales = (groups.amax(dim=-1) - low).clamp(min=1e-8) / 15
    q = torch.clamp(torch.round((groups - low[..., None]) / scales[..., None]), 0, 15)
    return q.to(torch.int32).reshape(n, k), scales, low


NATIVE_GROUP = 32   # the native int4 kernel's group size (one 32-byte vector)


@_reusable
def quantize_int4_native(weight: torch.Tensor,
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The native int4 kernel's layout: asymmetric groups of 32 along the input, fp16
    scale and minimum (rounded to fp16 before the weights are quantized against them),
    two weights per byte: byte j of a group holds q[j] low and q[j + 16] high.

    Returns (packed [N, K/2] uint8, scales [N, K/32] fp16, minimums [N, K/32] fp16).
    """
    n, k = weight.shape
    groups = weight.float().reshape(n, k // NATIVE_GROUP, NATIVE_GROUP)
    low = groups.amin(dim=-1).half()
    # 1e-7: a constant group's scale must stay a (subnormal) fp16 number, not zero.
    scales = ((groups.amax(dim=-1) - low.float()) / 15).clamp(min=1e-7).half()
    q = torch.clamp(torch.round((groups - low.float()[..., None]) / scales.float()[..., None]),
                    0, 15).to(torch.uint8)
    packed = q[..., :16] | (q[..., 16:] << 4)
    return packed.reshape(n, k // 2).contiguous(), scales.contiguous(), low.contiguous()


def dequantize_int4_native(packed: torch.Tensor, scales: torch.Tensor,
                           mins: torch.Tensor) -> torch.Tensor:
    n, half = packed.shape
    groups = packed.reshape(n, -1, NATIVE_GROUP // 2)
    q = torch.cat([groups & 0x0F, groups >> 4], dim=-1).float()
    return (q * scales.float()[..., None] + mins.float()[..., None]).reshape(n, 2 * half)


@_reusable
def quantize_q8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """llama.cpp's Q8_0: symmetric int8 per group of 32 along the input, the scale
    ``amax / 127`` as fp16 (rounded before the weights are quantized against it).

    Returns (q ``[N, K]`` int8, scales ``[N, K/32]`` fp16).
    """
    n, k = weight.shape
    groups = weight.float().reshape(n, k // NATIVE_GROUP, NATIVE_GROUP)
    # 1e-7: an all-zero group's scale stays a (subnormal) fp16 number, not zero.
    scales = (groups.abs().amax(dim=-1) / 127).clamp(min=1e-7).half()
    q = torch.clamp(torch.round(groups / scales.float()[..., None]), -127, 127)
    return q.to(torch.int8).reshape(n, k), scales.contiguous()


def dequantize_q8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    n, k = q.shape
    groups = q.float().reshape(n, k // NATIVE_GROUP, NATIVE_GROUP)
    return (groups * scales.float()[..., None]).reshape(n, k)


def dequantize_int4(q: torch.Tensor, scales: torch.Tensor, low: torch.Tensor,
                    group_size: int) -> torch.Tensor:
    n, k = q.shape
    groups = q.float().reshape(n, k // group_size, group_size)
    return (groups * scales[..., None] + low[..., None]).reshape(n, k)


@dataclass(frozen=True)
class Int8Handler:
    def supports(self, linear: nn.Linear) -> bool:
        return True

    def module(self, linear: nn.Linear) -> nn.Module:
        q, scales = quantize_int8(linear.weight.data.float())
        bias = None if linear.bias is None else linear.bias.data.float()
        return Int8Linear(q, scales.to(COMPUTE_DTYPE), bias)


@dataclass(frozen=True)
class Int4Handler:
    group_size: int

    def supports(self, linear: nn.Linear) -> bool:
        # The packed kernel wants whole groups and a multiple of 8 output channels.
        return linear.in_features % self.group_size == 0 and linear.out_features % 8 == 0

    def module(self, linear: nn.Linear) -> nn.Module:
        q, scales, low = quantize_int4(linear.weight.data, self.group_size)
        packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
        # The kernel computes (q - 8) * scale + zero, so zero = minimum + 8 * scale.
        zeros = low + 8 * scales
        scales_zeros = torch.stack([scales.t(), zeros.t()], dim=-1).to(COMPUTE_DTYPE)
        bias = None if linear.bias is None else linear.bias.data.float()
        return Int4Linear(packed, scales_zeros, self.group_size, linear.out_features, bias)


# The LM head keeps 8-bit weights when the rest goes to 4 bits, as llama.cpp keeps its
# output tensor at Q6_K or Q8_0: it is one wide layer whose errors land on every logit. On
# SmolLM2-135M (perplexity 11.88 in fp32) an int4 head gave 12.60 (+6%) and an int8 one
# 11.93 (+0.4%), for 14 of the model's 71 MB int4 weights instead of 15.6.
HEAD_NAME = "lm_head"


def layer_mode(mode: QuantMode, name: str) -> QuantMode:
    """The format of the linear layer called ``name`` when the model is quantized to
    ``mode``."""
    if name != HEAD_NAME:
        return mode
    # int4's LM head is int8. fp8's keeps the model's dtype, as vLLM's does: on
    # SmolLM2-135M (a tied 49152-row head) an fp8 head took perplexity from +1.2% to +3.7%.
    return {QuantMode.INT4: QuantMode.INT8, QuantMode.FP8: QuantMode.NONE}.get(mode, mode)


def handler_for(mode: QuantMode, group_size: int) -> QuantHandler:
    table: dict[QuantMode, QuantHandler] = {
        QuantMode.INT8: Int8Handler(),
        QuantMode.INT4: Int4Handler(group_size),
    }
    if mode not in table:   # q8: the CPU's native kernel only (llm/backends/cpu)
        raise InvalidInputError(f"{mode.value} weights are not offered here; use int8 or int4")
    return table[mode]


def quantize_model(model: nn.Module, mode: QuantMode, *, group_size: int = 32) -> int:
    """Replace every ``nn.Linear`` in ``model`` (in place); returns how many were replaced.

    A tied LM head is quantized as its own copy (in int8 under int4, ``layer_mode``); the
    embedding table stays in float.
    """
    if mode is QuantMode.NONE:
        return 0
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            handler = handler_for(layer_mode(mode, name), group_size)
            if isinstance(child, nn.Linear) and handler.supports(child):
                setattr(parent, name, handler.module(child))
                replaced += 1
    return replaced
