"""Quantized linear layers for the general path on any device (a GPU above all).

The CPU's quantized layers are chosen among its kernels by ``backends/cpu/kernels.py``.
Here, for a model stepped by torch modules on its device:

- int8, weight-only, one scale per output channel, and int4, weight-only, in asymmetric
  groups (``quant.py``'s quantizers), on torch's weight-only kernels
  (``torch._weight_int8pack_mm``; ``torch._weight_int4pack_mm`` over the tile layout
  ``torch._convert_weight_to_int4pack`` makes, CUDA sm80+);
- fp8: float8 (e4m3) weights with one scale per output channel, on ``torch._scaled_mm``
  (the float8 tensor cores of Hopper and Ada), which also casts each row of activations
  to float8 with a scale of its own, computed at every call (vLLM's dynamic fp8).

Each layer also has a dequantize-then-matmul fallback that runs anywhere. A kernel is
kept only if, at load, its output on a random input matches the fallback's and a
one-row call (a decode step) is not slower than the fallback's: a kernel missing on
this build, a packing it reads differently, or a reference implementation (torch's
float8 matmul on a CPU is twice the fallback's time) costs nothing.
"""

from __future__ import annotations

import abc
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from turboinfer.llm.model.config import QuantMode
from turboinfer.llm.model.quant import layer_mode, quantize_int4, quantize_int8

KERNEL_DTYPE = torch.bfloat16
# Kernel vs fallback at load: a wrong layout is off by the weights' own size, rounding
# (bf16 activations) by well under this share of the output's largest value.
AGREEMENT = 0.03
FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)    # 448
# float8 activations keep 3 mantissa bits: a product is off by up to 1/16 of itself.
FP8_AGREEMENT = 0.1
# A kernel within this share of the fallback's time is kept: the two are one noise apart.
TIE = 1.1


class ChannelScaledLinear(nn.Module, abc.ABC):
    """Weights [N, K] of a narrow type with one scale per output channel [N]; a kernel
    of the subclass's (``_kernel``, on the rows flattened) or dequantize + matmul."""

    agreement = AGREEMENT

    def __init__(self, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None,
                 ) -> None:
        super().__init__()
        self.q: torch.Tensor
        self.scales: torch.Tensor
        self.register_buffer("q", q)
        self.register_buffer("scales", scales)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.out_features, self.in_features = q.shape
        self.use_kernel = False

    def enable_kernel(self) -> None:
        self.use_kernel = True

    def disable_kernel(self) -> None:
        self.use_kernel = False

    def weight(self, dtype: torch.dtype) -> torch.Tensor:
        return self.q.to(dtype) * self.scales.to(dtype)[:, None]

    @abc.abstractmethod
    def _kernel(self, flat: torch.Tensor) -> torch.Tensor:
        """The layer's output for ``flat`` ([rows, K]) on its kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.use_kernel:
            return F.linear(x, self.weight(x.dtype), None if self.bias is None
                            else self.bias.to(x.dtype))
        out = self._kernel(x.reshape(-1, x.shape[-1])).to(x.dtype)
        if self.bias is not None:
            out = out + self.bias.to(x.dtype)
        return out.view(*x.shape[:-1], self.out_features)


class DequantInt8Linear(ChannelScaledLinear):
    """int8 weights; torch's weight-only int8 kernel on bf16 activations."""

    def _kernel(self, flat: torch.Tensor) -> torch.Tensor:
        return torch._weight_int8pack_mm(flat.to(KERNEL_DTYPE), self.q,
                                         self.scales.to(KERNEL_DTYPE))


class DequantInt4Linear(nn.Module):
    """4-bit codes two per byte (column 2j in the high nibble, 2j + 1 in the low one),
    group scales and minimums [N, K/g]; torch's tile kernel where it works, else
    dequantize + matmul."""

    def __init__(self, q: torch.Tensor, scales: torch.Tensor, low: torch.Tensor,
                 group_size: int, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.packed: torch.Tensor
        self.scales: torch.Tensor
        self.low: torch.Tensor
        self.register_buffer("packed", (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8))
        self.register_buffer("scales", scales)
        self.register_buffer("low", low)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.group_size = group_size
        self.out_features, self.in_features = q.shape
        self.tiles: torch.Tensor | None = None          # the kernel's layout
        self.scales_zeros: torch.Tensor | None = None

    agreement = AGREEMENT

    @property
    def use_kernel(self) -> bool:
        return self.tiles is not None

    def weight(self, dtype: torch.dtype) -> torch.Tensor:
        n, k, g = self.out_features, self.in_features, self.group_size
        codes = torch.stack([self.packed >> 4, self.packed & 0x0F], dim=-1).view(n, k)
        groups = codes.to(dtype).view(n, k // g, g)
        return (groups * self.scales.to(dtype)[..., None]
                + self.low.to(dtype)[..., None]).view(n, k)

    def enable_kernel(self) -> None:
        """The tile layout of torch's int4 kernel (raises where it has none)."""
        inner = next(t for t in (8, 4, 2) if self.in_features % (16 * t) == 0)
        self.tiles = torch._convert_weight_to_int4pack(self.packed, inner)
        # The kernel computes (q - 8) * scale + zero, so zero = minimum + 8 * scale.
        zeros = self.low + 8 * self.scales
        self.scales_zeros = torch.stack([self.scales.t(), zeros.t()],
                                        dim=-1).to(KERNEL_DTYPE).contiguous()

    def disable_kernel(self) -> None:
        self.tiles = self.scales_zeros = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tiles is None:
            return F.linear(x, self.weight(x.dtype), None if self.bias is None
                            else self.bias.to(x.dtype))
        assert self.scales_zeros is not None
        flat = x.reshape(-1, x.shape[-1]).to(KERNEL_DTYPE)
        out = torch._weight_int4pack_mm(flat, self.tiles, self.group_size,
                                        self.scales_zeros).to(x.dtype)
        if self.bias is not None:
            out = out + self.bias.to(x.dtype)
        return out.view(*x.shape[:-1], self.out_features)


def quantize_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float8 e4m3 with one float32 scale per output channel: weight ≈ q * scale[:, None],
    the channel's largest weight at float8's largest value."""
    scales = weight.float().abs().amax(dim=1).clamp(min=1e-12) / FP8_MAX
    q = (weight.float() / scales[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scales


class Fp8Linear(ChannelScaledLinear):
    """float8 weights and float32 scales; ``torch._scaled_mm`` on float8 activations
    scaled per row."""

    agreement = FP8_AGREEMENT

    def _kernel(self, flat: torch.Tensor) -> torch.Tensor:
        rows = flat.float()
        row_scales = rows.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / FP8_MAX
        # Clamped: a value past float8's range would become NaN, not its largest value.
        xq = (rows / row_scales).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        # The kernel wants the weight column-major: q.t() of the row-major q is.
        return torch._scaled_mm(xq, self.q.t(), scale_a=row_scales,
                                scale_b=self.scales.view(1, -1), out_dtype=KERNEL_DTYPE)


QuantLinear = DequantInt8Linear | DequantInt4Linear | Fp8Linear


def read_bytes(layer: QuantLinear) -> int:
    """Bytes of weights (and scales) a call reads: the layer's stored tensors."""
    return sum(t.numel() * t.element_size() for t in layer.buffers(recurse=False)) + (
        0 if layer.bias is None else layer.bias.numel() * layer.bias.element_size())


def quantized_linear(linear: nn.Linear, mode: QuantMode, group_size: int) -> QuantLinear | None:
    """The layer in ``mode`` on the linear's device, fallback form; None where it stays
    as it is (mode none) or the format cannot hold it (int4 needs whole groups and an
    even width)."""
    if mode is QuantMode.NONE:
        return None
    weight = linear.weight.detach().float()
    bias = None if linear.bias is None else linear.bias.detach().clone()
    if mode is QuantMode.INT8:
        q, scales = quantize_int8(weight)
        return DequantInt8Linear(q, scales, bias)
    if mode is QuantMode.FP8:
        q8, scales8 = quantize_fp8(weight)
        return Fp8Linear(q8, scales8, bias)
    if linear.in_features % group_size or linear.out_features % 8:
        return None
    q4, scales, low = quantize_int4(weight, group_size)
    return DequantInt4Linear(q4, scales, low, group_size, bias)


def _seconds(call: Callable[[], object], device: torch.device, reps: int = 5) -> float:
    """Median wall time of ``call``, waiting for the device's queue around each run."""
    wait: Callable[[], None] = (torch.cuda.synchronize if device.type == "cuda"
                                else lambda: None)
    call()
    times = []
    for _ in range(reps):
        wait()
        start = time.perf_counter()
        call()
        wait()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.inference_mode()
def _try_kernel(layer: QuantLinear, dtype: torch.dtype) -> bool:
    """Switch ``layer`` to torch's kernel if it runs here, agrees with the fallback and is
    not slower than it on one row."""
    device = layer.scales.device
    probe = torch.randn(4, layer.in_features, generator=torch.Generator().manual_seed(0))
    probe = probe.to(device, dtype)
    want = layer(probe).float()
    row = probe[:1]
    fallback_s = _seconds(lambda: layer(row), device)
    try:
        layer.enable_kernel()
        got = layer(probe).float()
    except (RuntimeError, NotImplementedError, StopIteration):
        got = None
    ok = got is not None and bool(
        (got - want).abs().max() <= layer.agreement * want.abs().max().clamp(min=1e-6))
    ok = ok and _seconds(lambda: layer(row), device) <= TIE * fallback_s
    if not ok:
        layer.disable_kernel()
    return ok


def quantize_for_device(model: nn.Module, mode: QuantMode, *, group_size: int = 32,
                        kernels: bool = True) -> dict[str, int]:
    """Replace the linear layers of ``model`` (on its device, in its dtype) in place; a
    tied LM head is quantized as its own copy (int8 under int4; under fp8 it stays as
    it is), the embedding stays as it is. Returns how many layers run on torch's kernel
    and how many on the fallback."""
    counts = {"kernel": 0, "dequant": 0}
    if mode is QuantMode.NONE:
        return counts
    kernel_ok: dict[tuple[int, int], bool] = {}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            layer = quantized_linear(child, layer_mode(mode, name), group_size)
            if layer is None:
                continue
            shape = (child.out_features, child.in_features)
            # A shape whose kernel failed once stays on the fallback without a retry.
            if kernels and kernel_ok.get(shape, True):
                kernel_ok[shape] = _try_kernel(layer, child.weight.dtype)
            setattr(parent, name, layer)
            counts["kernel" if layer.use_kernel else "dequant"] += 1
    return counts
