"""Weight-only int8 and int4 for the general path on any device (a GPU above all).

The CPU's quantized layers are chosen among its kernels by ``backends/cpu/kernels.py``.
Here, for a model stepped by torch modules on its device: int8 with one scale per
output channel, int4 in asymmetric groups (``quant.py``'s quantizers), each layer on
torch's weight-only kernel where it runs on this device (``torch._weight_int8pack_mm``;
``torch._weight_int4pack_mm`` over the tile layout ``torch._convert_weight_to_int4pack``
makes, CUDA sm80+), else on a dequantize-then-matmul fallback that runs anywhere. A
kernel is kept only if its output on a random input matches the fallback's at load: a
kernel missing on this build, or a packing it reads differently, costs speed, never
correctness.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from turboinfer.llm.model.config import QuantMode
from turboinfer.llm.model.quant import layer_mode, quantize_int4, quantize_int8

KERNEL_DTYPE = torch.bfloat16
# Kernel vs fallback at load: a wrong layout is off by the weights' own size, rounding
# (bf16 activations) by well under this share of the output's largest value.
AGREEMENT = 0.03


class DequantInt8Linear(nn.Module):
    """int8 weights [N, K] and per-channel scales [N]; the kernel or dequantize + matmul."""

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

    def weight(self, dtype: torch.dtype) -> torch.Tensor:
        return self.q.to(dtype) * self.scales.to(dtype)[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.use_kernel:
            return F.linear(x, self.weight(x.dtype), None if self.bias is None
                            else self.bias.to(x.dtype))
        flat = x.reshape(-1, x.shape[-1]).to(KERNEL_DTYPE)
        out = torch._weight_int8pack_mm(flat, self.q, self.scales.to(KERNEL_DTYPE)).to(x.dtype)
        if self.bias is not None:
            out = out + self.bias.to(x.dtype)
        return out.view(*x.shape[:-1], self.out_features)


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

    @property
    def use_kernel(self) -> bool:
        return self.tiles is not None

    def weight(self, dtype: torch.dtype) -> torch.Tensor:
        n, k, g = self.out_features, self.in_features, self.group_size
        codes = torch.stack([self.packed >> 4, self.packed & 0x0F], dim=-1).view(n, k)
        groups = codes.to(dtype).view(n, k // g, g)
        return (groups * self.scales.to(dtype)[..., None]
                + self.low.to(dtype)[..., None]).view(n, k)

    def build_kernel(self) -> None:
        """The tile layout of torch's int4 kernel (raises where it has none)."""
        inner = next(t for t in (8, 4, 2) if self.in_features % (16 * t) == 0)
        self.tiles = torch._convert_weight_to_int4pack(self.packed, inner)
        # The kernel computes (q - 8) * scale + zero, so zero = minimum + 8 * scale.
        zeros = self.low + 8 * self.scales
        self.scales_zeros = torch.stack([self.scales.t(), zeros.t()],
                                        dim=-1).to(KERNEL_DTYPE).contiguous()

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


QuantLinear = DequantInt8Linear | DequantInt4Linear


def quantized_linear(linear: nn.Linear, mode: QuantMode, group_size: int) -> QuantLinear | None:
    """The layer in ``mode`` on the linear's device, fallback form; None where the format
    cannot hold it (int4 needs whole groups and an even width)."""
    weight = linear.weight.detach().float()
    bias = None if linear.bias is None else linear.bias.detach().clone()
    if mode is QuantMode.INT8:
        q, scales = quantize_int8(weight)
        return DequantInt8Linear(q, scales, bias)
    if linear.in_features % group_size or linear.out_features % 8:
        return None
    q4, scales, low = quantize_int4(weight, group_size)
    return DequantInt4Linear(q4, scales, low, group_size, bias)


def _try_kernel(layer: QuantLinear, dtype: torch.dtype) -> bool:
    """Switch ``layer`` to torch's kernel if it runs here and agrees with the fallback."""
    probe = torch.randn(4, layer.in_features, generator=torch.Generator().manual_seed(0))
    probe = probe.to(layer.scales.device, dtype)
    want = layer(probe).float()
    try:
        if isinstance(layer, DequantInt8Linear):
            layer.use_kernel = True
        else:
            layer.build_kernel()
        got = layer(probe).float()
    except (RuntimeError, NotImplementedError, StopIteration):
        got = None
    ok = got is not None and bool(
        (got - want).abs().max() <= AGREEMENT * want.abs().max().clamp(min=1e-6))
    if not ok:
        if isinstance(layer, DequantInt8Linear):
            layer.use_kernel = False
        else:
            layer.tiles = layer.scales_zeros = None
    return ok


def quantize_for_device(model: nn.Module, mode: QuantMode, *, group_size: int = 32,
                        kernels: bool = True) -> dict[str, int]:
    """Replace the linear layers of ``model`` (on its device, in its dtype) in place; a
    tied LM head is quantized as its own copy (int8 under int4), the embedding stays as
    it is. Returns
    how many layers run on torch's kernel and how many on the fallback."""
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
