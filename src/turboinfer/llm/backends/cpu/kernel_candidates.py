"""The linear-layer kernels a CPU may run, one class per kernel, all with one interface.

Each kernel is built from a float weight ``[N, K]`` (and bias) in the storage its
operation wants, and maps float32 activations ``[rows, K]`` to float32 ``[rows, N]``.
``read_bytes`` is what one call reads of the weight (and its scales), the figure the
bandwidth roofline divides by. Which one runs is decided per machine by timing them on
the model's own shapes (``llm/backends/cpu/kernels.py``); this module only says what each computes.

Formats: ``none`` (fp32 weights, results equal ``F.linear``'s up to float rounding),
``int8`` (per-output-channel symmetric weights; the native kernel also quantizes the
activations to 8 bits per block of 32; the dynamic kernels, per call and per tensor, are
not offered) and ``int4`` (asymmetric groups along the input; the native kernel also
quantizes the activations to 8 bits per group of 32). The
native kernels (``llm/backends/cpu/native``) are offered only where their library compiled.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from turboinfer.llm.backends.cpu.native import NativeLibrary, native_status
from turboinfer.llm.backends.cpu.native.hugepages import on_huge_pages
from turboinfer.llm.backends.cpu.native.layout import (
    amx_int8_tiles,
    f32_tiles,
    int4_tiles,
    int8_tiles,
    q8_tiles,
)
from turboinfer.llm.model.config import QuantMode
from turboinfer.llm.model.quant import (
    NATIVE_GROUP,
    dequantize_q8,
    quantize_int4,
    quantize_int4_native,
    quantize_int8,
    quantize_q8,
)


class Kernel:
    """``y = x @ W.T + b`` for float32 ``x`` of shape ``[rows, K]``."""

    name = ""

    def __init__(self, read_bytes: int) -> None:
        self.read_bytes = read_bytes

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


def _nbytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _own_copy(weight: torch.Tensor) -> torch.Tensor:
    """A contiguous copy that shares no memory with ``weight``. The timing calls several
    copies of a kernel in turn so that they read from memory, as the model's layers do;
    ``weight.contiguous()`` would hand every copy the same cached tensor (measured:
    ``F.linear`` at 34 GB/s on a 6 MB weight, against 15-18 for a real stream)."""
    return weight.detach().clone(memory_format=torch.contiguous_format)


class LinearKernel(Kernel):
    """``F.linear`` on the usual ``[N, K]`` weight."""

    name = "fp32_linear"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__(_nbytes(weight, bias))
        self.weight, self.bias = _own_copy(weight), bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class TransposedKernel(Kernel):
    """``x @ W_t`` with the weight stored ``[K, N]``: MKL's GEMM on its preferred layout,
    the faster one for a few rows on the machines measured so far."""

    name = "fp32_transposed"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__(_nbytes(weight, bias))
        self.weight_t, self.bias = weight.t().contiguous(), bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is not None:
            return torch.addmm(self.bias, x, self.weight_t)
        return x @ self.weight_t


class MklPackedKernel(Kernel):
    """MKL's GEMM on a weight pre-arranged for ``rows`` rows (packing once, not per call).
    At any other row count ``_mkl_linear`` falls back to the transposed weight's view."""

    name = "fp32_mkl_packed"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, rows: int) -> None:
        self.packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)
        # The roofline counts the format's weight bytes, not MKL's padded buffer (23.7 MB
        # for a 12.6 MB weight at one row): a layout that reads more must not loosen it.
        super().__init__(_nbytes(weight, bias))
        self.weight_t, self.bias, self.rows = weight.t().contiguous(), bias, rows

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkl._mkl_linear(x, self.packed, self.weight_t.t(), self.bias,
                                         self.rows)


class OneDnnKernel(Kernel):
    """oneDNN's inner product (the kernel torch's inductor emits for CPU linears)."""

    name = "fp32_onednn"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__(_nbytes(weight, bias))
        self.weight, self.bias = _own_copy(weight), bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


class Int8WeightOnlyKernel(Kernel):
    """torch's int8 weight-only matmul; activations in ``act_dtype`` (its CPU kernel is
    vectorised for some activation types and not others, so both are candidates)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None,
                 act_dtype: torch.dtype) -> None:
        q, scales = quantize_int8(weight.float())
        self.q, self.scales = q, scales.to(act_dtype)
        super().__init__(_nbytes(self.q, self.scales, bias))
        self.bias, self.act_dtype = bias, act_dtype
        self.name = f"int8_weight_only_{_short(act_dtype)}"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = torch._weight_int8pack_mm(x.to(self.act_dtype), self.q, self.scales).float()
        return out if self.bias is None else out + self.bias


class DynamicInt8Kernel(Kernel):
    """Int8 arithmetic: the activations are quantized per call (per tensor, 8 bits) and
    multiplied with int8 weights packed by the ``backend`` (``fbgemm`` or ``onednn``).

    Without VNNI, x86 multiplies u8 activations by s8 weights in pairs summed into int16
    (``vpmaddubsw``), which saturates past 32767. torch's answer, 7-bit activations
    (``reduce_range``), cost +1.6% perplexity over fp32 on the demo model's held-out
    text; 8-bit activations with 8-bit weights saturate (10-17% relative error on random
    layers). Weights in 7 bits (|q| <= 63, per output channel: 2 * 255 * 63 < 32768)
    with 8-bit activations cannot saturate and measured +0.5%, with a smaller error per
    layer than 7-bit activations."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, backend: str) -> None:
        q, scales = quantize_int8(weight.float(), qmax=63)
        previous = torch.backends.quantized.engine
        try:
            torch.backends.quantized.engine = backend
            with warnings.catch_warnings():
                # Quantized tensors are deprecated in favour of torchao; this packed
                # linear is still the fastest int8 GEMM torch ships for x86 CPUs.
                warnings.simplefilter("ignore", UserWarning)
                qweight = torch._make_per_channel_quantized_tensor(
                    q, scales.double(), torch.zeros_like(scales, dtype=torch.long), 0)
                self.packed = torch.ops.quantized.linear_prepack(qweight, bias)
        finally:
            torch.backends.quantized.engine = previous
        super().__init__(_nbytes(q, scales, bias))
        self.name = f"int8_dynamic_{backend}"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self.packed, False)


class Int4WeightOnlyKernel(Kernel):
    """torch's int4 weight-only matmul (groups of ``group_size`` input channels)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group_size: int,
                 act_dtype: torch.dtype) -> None:
        q, scales, low = quantize_int4(weight, group_size)
        self.packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
        # The kernel computes (q - 8) * scale + zero, so zero = minimum + 8 * scale.
        zeros = low + 8 * scales
        self.scales_zeros = torch.stack([scales.t(), zeros.t()], dim=-1).to(act_dtype)
        super().__init__(_nbytes(self.packed, self.scales_zeros, bias))
        self.bias, self.group_size, self.act_dtype = bias, group_size, act_dtype
        self.name = f"int4_weight_only_{_short(act_dtype)}"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = torch._weight_int4pack_mm_for_cpu(x.to(self.act_dtype), self.packed,
                                                self.group_size, self.scales_zeros).float()
        return out if self.bias is None else out + self.bias


class NativeKernel(Kernel):
    """One of the hand-written kernels of ``llm/backends/cpu/native/kernels.c``: the C function gets
    the tensors' addresses, the arguments that do not change prepared once
    (``_fixed_args``, again whenever the tiles move)."""

    tiles: torch.Tensor
    # Which prefetch distance its weight stream uses (native/loader.py PREFETCH_KINDS);
    # None: the kernel does not prefetch.
    prefetch_kind: str | None = None

    def __init__(self, fn: Callable[..., int], out_features: int, in_features: int,
                 read_bytes: int) -> None:
        super().__init__(read_bytes)
        self._fn = fn
        self.out_features, self.in_features = out_features, in_features
        self._fixed = self._fixed_args()

    def _fixed_args(self) -> tuple[object, ...]:
        raise NotImplementedError

    def move_to_huge_pages(self) -> None:
        """Put the tiles on 2 MiB pages (``native/hugepages.py``), for a kernel that is
        kept: the measured candidates are built and dropped, and the pages are shared."""
        self.tiles = on_huge_pages(self.tiles)
        self._fixed = self._fixed_args()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or not x.is_contiguous():
            x = x.float().contiguous()
        y = torch.empty(x.shape[0], self.out_features)
        if self._fn(x.data_ptr(), x.shape[0], self.in_features, *self._fixed, y.data_ptr()):
            raise MemoryError("native kernel: no memory for the quantized activations")
        return y


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class NativeInt8Kernel(NativeKernel):
    """Int8 weights (per output channel, full 8 bits) times activations quantized per
    call to int8 per block of 32 (each block's scale an integer multiple, 1-255, of one
    per row), in integer arithmetic without saturation (``kernels.c``)."""

    name = "int8_native"
    label = "native int8 kernel"
    prefetch_kind: str | None = "int8"
    MAX_IN_FEATURES = 2**20     # past it a block multiplier of 1 could overflow an int32 lane

    def __init__(self, lib: NativeLibrary, weight: torch.Tensor,
                 bias: torch.Tensor | None) -> None:
        if weight.shape[1] > self.MAX_IN_FEATURES:
            raise ValueError(f"{self.label}: in_features {weight.shape[1]} is above "
                             f"its limit of {self.MAX_IN_FEATURES}")
        q, scales = quantize_int8(weight.float())
        n, k = q.shape
        self.tiles, self.padded = self._layout(q)
        self.scales = scales.float().contiguous()
        self.bias = None if bias is None else bias.float().contiguous()
        super().__init__(self._entry(lib), n, k, _nbytes(self.tiles, self.scales, self.bias))

    @staticmethod
    def _layout(q: torch.Tensor) -> tuple[torch.Tensor, int]:
        return int8_tiles(q)

    @staticmethod
    def _entry(lib: NativeLibrary) -> Callable[..., int]:
        return lib.int8_linear

    def _fixed_args(self) -> tuple[object, ...]:
        return (self.tiles.data_ptr(), self.scales.data_ptr(), _ptr(self.bias),
                self.out_features, self.padded)


class NativeAmxInt8Kernel(NativeInt8Kernel):
    """``NativeInt8Kernel``'s quantization (the same weights, the same activation blocks)
    on Intel AMX tiles (``amx.c``): its own weight layout, and each output's exact integer
    sum rounded once, so its results differ from that kernel's by float rounding only.
    Offered where AMX runs; many rows (a verification, a batch, a prompt) cost little
    more than one."""

    name = "int8_amx_native"
    label = "native AMX int8 kernel"
    prefetch_kind = "amx"
    MAX_IN_FEATURES = 2**16     # past it a sum of the low bytes could overflow int32

    @staticmethod
    def _layout(q: torch.Tensor) -> tuple[torch.Tensor, int]:
        return amx_int8_tiles(q)

    @staticmethod
    def _entry(lib: NativeLibrary) -> Callable[..., int]:
        return lib.amx_int8_linear


class NativeInt4Kernel(NativeKernel):
    """4-bit weights in groups of 32 with fp16 scale and minimum, activations quantized
    to int8 per group of 32 and call (``kernels.c``)."""

    name = "int4_native"
    prefetch_kind = "int4"

    def __init__(self, lib: NativeLibrary, weight: torch.Tensor,
                 bias: torch.Tensor | None,
                 groups: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                 ) -> None:
        """``groups``: the weight already in this layout (``quantize_int4_native``'s
        packed, scales, minimums; a GGUF file's Q4_0/Q4_1 blocks), taken as they are
        instead of quantizing ``weight``."""
        self.tiles = int4_tiles(*(groups if groups is not None
                                  else quantize_int4_native(weight)))
        self.bias = None if bias is None else bias.float().contiguous()
        n, k = weight.shape
        super().__init__(lib.int4_linear, n, k, _nbytes(self.tiles, self.bias))

    def _fixed_args(self) -> tuple[object, ...]:
        return (self.tiles.data_ptr(), _ptr(self.bias), self.out_features)


class NativeQ8Kernel(NativeKernel):
    """int8 weights in groups of 32 with an fp16 scale each (llama.cpp's Q8_0 blocks),
    activations quantized to int8 per group of 32 and call (``kernels.c``)."""

    name = "q8_native"
    prefetch_kind = "q8"

    def __init__(self, lib: NativeLibrary, weight: torch.Tensor,
                 bias: torch.Tensor | None,
                 groups: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """``groups``: the weight already quantized (``quantize_q8``'s int8 values and
        fp16 scales; a GGUF file's Q8_0 blocks), taken as they are."""
        self.tiles = q8_tiles(*(groups if groups is not None else quantize_q8(weight)))
        self.bias = None if bias is None else bias.float().contiguous()
        n, k = weight.shape
        super().__init__(lib.q8_linear, n, k, _nbytes(self.tiles, self.bias))

    def _fixed_args(self) -> tuple[object, ...]:
        return (self.tiles.data_ptr(), _ptr(self.bias), self.out_features)


class Q8DequantizedKernel(Kernel):
    """The q8 format's weights (``quantize_q8``) dequantized to fp32 for ``F.linear``:
    where the native library is absent, the same weights at fp32's speed."""

    name = "q8_dequantized_fp32"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = dequantize_q8(*quantize_q8(weight))
        self.bias = bias
        super().__init__(_nbytes(self.weight, bias))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class NativeF32Kernel(NativeKernel):
    """fp32 dot products with FMA, several output rows per pass (``kernels.c``)."""

    name = "fp32_native"

    def __init__(self, lib: NativeLibrary, weight: torch.Tensor,
                 bias: torch.Tensor | None) -> None:
        self.tiles, self.padded = f32_tiles(weight.float())
        self.bias = None if bias is None else bias.float().contiguous()
        n, k = weight.shape
        super().__init__(lib.f32_linear, n, k, _nbytes(self.tiles, self.bias))

    def _fixed_args(self) -> tuple[object, ...]:
        return (self.tiles.data_ptr(), _ptr(self.bias), self.out_features, self.padded)


def _exactly(weight: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether every value of the float ``weight`` is exactly a ``dtype`` number. Compared
    a block of rows at a time: a large LM head's round trip whole would take 1.5x its
    bytes again."""
    return all(torch.equal(part.to(dtype).to(part.dtype), part) for part in weight.split(1024))


def half_storage(weight: torch.Tensor) -> torch.dtype | None:
    """``torch.float16`` or ``torch.bfloat16`` where every value of the float ``weight``
    is exactly a number of that type (a checkpoint stored in half precision and widened
    at load), fp16 first; None otherwise."""
    return next((d for d in (torch.float16, torch.bfloat16) if _exactly(weight, d)), None)


class NativeHalfKernel(NativeKernel):
    """``NativeF32Kernel``'s arithmetic on weights kept in 16 bits: each is widened to
    the fp32 number it is as it is loaded, so the results equal that kernel's bit for bit
    (its 512-bit passes on an AVX-512 build) while one call reads half the bytes. Built
    only for weights that are exactly fp16 or bf16 numbers (``half_storage``)."""

    NAMES: ClassVar[dict[torch.dtype, str]] = {torch.float16: "fp32_native_fp16_weights",
                                                torch.bfloat16: "fp32_native_bf16_weights"}

    def __init__(self, lib: NativeLibrary, weight: torch.Tensor, bias: torch.Tensor | None,
                 dtype: torch.dtype) -> None:
        weight = weight.float()
        if not _exactly(weight, dtype):
            raise ValueError(f"the weight is not exactly {dtype}: it cannot be kept in 16 bits")
        # Narrowed first, then laid out (the fp32 layout of the same numbers): half the
        # bytes through the interleave.
        self.tiles, self.padded = f32_tiles(weight.to(dtype))
        self.dtype, self.name = dtype, self.NAMES[dtype]
        self.bias = None if bias is None else bias.float().contiguous()
        n, k = weight.shape
        fn = lib.f16_linear if dtype is torch.float16 else lib.bf16_linear
        super().__init__(fn, n, k, _nbytes(self.tiles, self.bias))

    def _fixed_args(self) -> tuple[object, ...]:
        return (self.tiles.data_ptr(), _ptr(self.bias), self.out_features, self.padded)


def _short(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]


Builder = Callable[[torch.Tensor, "torch.Tensor | None", int], Kernel]


@dataclass(frozen=True)
class Candidate:
    name: str
    build: Builder          # (weight, bias, rows) -> kernel
    rows_specific: bool = False   # built for one row count (MKL packing)


def mkl_packing_available() -> bool:
    return bool(torch.backends.mkl.is_available()) and hasattr(torch.ops.mkl,
                                                                "_mkl_reorder_linear_weight")


def candidates(mode: QuantMode, *, group_size: int = 32,
               half: torch.dtype | None = None) -> list[Candidate]:
    """The kernels this torch build (and the native library, where it compiled) offers
    for ``mode``, likeliest-fastest first. ``half``: the weight is exactly of that 16-bit
    type (``half_storage``), so an fp32 weight may also be kept in it."""
    return _torch_candidates(mode, group_size) + _native_candidates(mode, group_size, half)


def _torch_candidates(mode: QuantMode, group_size: int) -> list[Candidate]:
    if mode is QuantMode.INT8:
        # Not the dynamic kernels (``DynamicInt8Kernel``, kept for the benchmarks): one
        # activation scale per call is ruined by the few huge activation channels real
        # models have. On SmolLM2-135M, perplexity 11.88 in fp32: dynamic fbgemm 18.59
        # (+56%), weight-only 11.94-11.96 (benchmarks/llm/gguf_perplexity.json), the native
        # kernel 11.99 with its scales per block of 32 (12.45 with one per row,
        # benchmarks/llm/kernel_perplexity.json); the dynamic kernel won the timing for some
        # shapes, so a model's quality hung on which kernel was fastest that day.
        return [Candidate(f"int8_weight_only_{_short(d)}",
                          lambda w, b, r, d=d: Int8WeightOnlyKernel(w, b, d))  # type: ignore[misc]
                for d in (torch.bfloat16, torch.float32)]
    if mode is QuantMode.Q8:
        return [Candidate(Q8DequantizedKernel.name,
                          lambda w, b, r: Q8DequantizedKernel(w, b))]
    if mode is QuantMode.INT4:
        return [Candidate(f"int4_weight_only_{_short(d)}",
                          lambda w, b, r, d=d: Int4WeightOnlyKernel(w, b, group_size, d))  # type: ignore[misc]
                for d in (torch.bfloat16, torch.float32)]
    out = [Candidate("fp32_transposed", lambda w, b, r: TransposedKernel(w, b)),
           Candidate("fp32_linear", lambda w, b, r: LinearKernel(w, b))]
    if mkl_packing_available():
        out.append(Candidate("fp32_mkl_packed", MklPackedKernel, rows_specific=True))
    if torch.backends.mkldnn.is_available():
        out.append(Candidate("fp32_onednn", lambda w, b, r: OneDnnKernel(w, b)))
    return out


_NATIVE: dict[QuantMode, tuple[str, Callable[..., Kernel]]] = {
    QuantMode.INT8: (NativeInt8Kernel.name, NativeInt8Kernel),
    QuantMode.INT4: (NativeInt4Kernel.name, NativeInt4Kernel),
    QuantMode.Q8: (NativeQ8Kernel.name, NativeQ8Kernel),
    QuantMode.NONE: (NativeF32Kernel.name, NativeF32Kernel),
}
NATIVE_KERNELS = (NativeInt8Kernel.name, NativeAmxInt8Kernel.name, NativeInt4Kernel.name,
                  NativeQ8Kernel.name, NativeF32Kernel.name, *NativeHalfKernel.NAMES.values())


def _native_candidates(mode: QuantMode, group_size: int,
                       half: torch.dtype | None = None) -> list[Candidate]:
    lib = native_status().library
    if lib is None or (mode is QuantMode.INT4 and group_size != NATIVE_GROUP):
        return []
    name, kernel = _NATIVE[mode]
    out = [Candidate(name, lambda w, b, r: kernel(lib, w, b))]
    if mode is QuantMode.NONE and half is not None:
        out.append(Candidate(NativeHalfKernel.NAMES[half],
                             lambda w, b, r: NativeHalfKernel(lib, w, b, half)))
    if mode is QuantMode.INT8 and lib.has_amx:
        out.append(Candidate(NativeAmxInt8Kernel.name,
                             lambda w, b, r: NativeAmxInt8Kernel(lib, w, b)))
    return out


def absent_candidates(mode: QuantMode, *, group_size: int = 32) -> dict[str, str]:
    """The candidates of ``mode`` left out on this machine, and why."""
    name = _NATIVE[mode][0]
    status = native_status()
    if status.library is None:
        return {name: status.reason}
    if mode is QuantMode.INT4 and group_size != NATIVE_GROUP:
        return {name: f"groups of {NATIVE_GROUP} only (asked for {group_size})"}
    if mode is QuantMode.INT8 and not status.library.has_amx:
        return {NativeAmxInt8Kernel.name: "no AMX tiles on this CPU (or in this build)"}
    return {}


def supports(mode: QuantMode, out_features: int, in_features: int, group_size: int) -> bool:
    """int4's packed kernel wants whole groups and a multiple of 8 output channels, q8
    whole groups of 32."""
    if mode is QuantMode.Q8:
        return in_features % NATIVE_GROUP == 0
    if mode is QuantMode.INT4:
        return in_features % group_size == 0 and out_features % 8 == 0
    return True
