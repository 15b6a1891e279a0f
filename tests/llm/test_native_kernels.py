"""The hand-written C kernels (llm/backends/cpu/native): each computes exactly what its quantization
stands for, on odd shapes and row counts, in its vectorised and its plain C build; they
join the measured candidates where a compiler is present and are absent, with the
reason reported, where it is not."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from turboinfer.llm.backends.cpu import kernel_candidates
from turboinfer.llm.backends.cpu.kernel_candidates import (
    NativeF32Kernel,
    NativeHalfKernel,
    NativeInt4Kernel,
    NativeInt8Kernel,
    NativeQ8Kernel,
    absent_candidates,
    candidates,
    half_storage,
)
from turboinfer.llm.backends.cpu.kernels import SelectedLinear, select_kernels
from turboinfer.llm.backends.cpu.native import NativeLibrary, build_library, native_status
from turboinfer.llm.model.config import QuantMode
from turboinfer.llm.model.loader import load_model
from turboinfer.llm.model.quant import (
    dequantize_int4_native,
    dequantize_q8,
    layer_mode,
    quantize_int4_native,
    quantize_int8,
    quantize_q8,
)

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")

PLAIN_FLAGS = ("-O2", "-fPIC", "-shared")     # no -march=native: the plain C path


@pytest.fixture(scope="module", params=["native", "plain"])
def library(request: pytest.FixtureRequest) -> NativeLibrary:
    if request.param == "plain":
        return request.getfixturevalue("plain_library")  # type: ignore[no-any-return]
    status = native_status()
    assert status.library is not None, status.reason
    return status.library


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


def _int8_levels(in_features: int) -> int:
    """The int8 kernel's largest block multiplier (``i8_levels`` in kernels.c)."""
    blocks = -(-in_features // 32)
    return min(255, (2**31 - 1) // (4 * 127 * 127 * blocks))


def _int8_blocks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The int8 kernel's activations, rounded as it rounds them (float32, the same
    operations): q [rows, K], the block multipliers m [rows, K] (repeated over each block)
    and the row scales [rows, 1], x ~ q * m * scale."""
    rows, k = x.shape
    levels = _int8_levels(k)
    padded = F.pad(x, (0, -k % 32)).view(rows, -1, 32)
    amax = x.abs().amax(dim=1, keepdim=True)
    bmax = padded.abs().amax(dim=2)
    scale = amax / (127.0 * levels)
    rel = torch.where(amax > 0, levels / torch.where(amax > 0, amax, 1.0), 0.0)
    m = torch.where(bmax > 0, torch.ceil(bmax * rel).clamp(1, levels), 0.0)
    inv = torch.where(m > 0, 1.0 / (scale * torch.where(m > 0, m, 1.0)), 0.0)
    q = torch.round(padded * inv[:, :, None]).view(rows, -1)[:, :k]
    return q, m.repeat_interleave(32, dim=1)[:, :k], scale


def _int8_activations(x: torch.Tensor) -> torch.Tensor:
    """What the int8 kernel multiplies: x rounded to 255 levels per block of 32, each
    block's scale a multiple (1-255) of one per row."""
    q, m, scale = _int8_blocks(x)
    return q * m * scale


def _int4_activations(x: torch.Tensor) -> torch.Tensor:
    """What the int4 kernel multiplies: x rounded to 255 levels per group of 32."""
    g = x.view(x.shape[0], -1, 32)
    amax = g.abs().amax(dim=2, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / torch.where(amax > 0, amax, 1.0), 0.0)
    return (torch.round(g * inv) * (amax / 127)).view(x.shape)


SHAPES = [(37, 100), (8, 32), (96, 256), (5, 7)]


@pytest.mark.parametrize("out_features,in_features", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_fp32_kernel_equals_linear(library: NativeLibrary, out_features: int,
                                   in_features: int, bias: bool) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(in_features, out_features, bias=bias).requires_grad_(False)
    kernel = NativeF32Kernel(library, linear.weight, linear.bias)
    # Rows padded to tiles of 4, columns to blocks of 16.
    padded = -(-out_features // 4) * 4 * -(-in_features // 16) * 16
    assert kernel.read_bytes == 4 * (padded + (out_features if bias else 0))
    for rows in (1, 2, 4, 5, 7, 16, 3):      # every split into three-, two- and one-row tiles
        x = torch.randn(rows, in_features)
        torch.testing.assert_close(kernel(x), linear(x), atol=1e-5, rtol=1e-5)


def test_fp32_kernel_at_every_row_count_of_a_verification(library: NativeLibrary) -> None:
    """1-16 rows: each split into three-, two- and one-row tiles, whole tiles stored
    straight into the output and a partial last tile (41 outputs), over an odd number of
    16-column blocks (K 528) and a K below one block."""
    torch.manual_seed(1)
    for out_features, in_features in ((41, 528), (12, 9)):
        weight = torch.randn(out_features, in_features) * in_features ** -0.5
        kernel = NativeF32Kernel(library, weight, None)
        for rows in range(1, 17):
            x = torch.randn(rows, in_features)
            torch.testing.assert_close(kernel(x), F.linear(x, weight), atol=1e-5, rtol=1e-5)


def test_fp32_rows_of_a_many_row_call_equal_one_row_calls(library: NativeLibrary) -> None:
    """The several-row passes add the same products in the same order as the one-row
    tile (the 512-bit passes where the build has them, else the 256-bit tiles, whose
    one-row tile then sums as they do; the plain C build alike), so each row of a call
    is its one-row call bit for bit, at every split into passes and every setting the
    build's measurement chooses from (prefetch.f32_settings): a speculative
    verification's rows give what plain decoding gives."""
    settings = (1024, 4096, 1 << 20) if library.f32_wide else (0, 256, 4096)
    torch.manual_seed(11)
    before = library.set_prefetch(-1, "f32")
    try:
        for out_features, in_features in ((41, 528), (64, 256), (7, 9)):
            weight = torch.randn(out_features, in_features) * in_features ** -0.5
            kernel = NativeF32Kernel(library, weight, None)
            for rows in (*range(2, 14), 17):      # passes of 2-6, 7 = 4 + 3, 13 = 5 + 4 + 4
                x = torch.randn(rows, in_features)
                single = torch.cat([kernel(x[r:r + 1]) for r in range(rows)])
                for setting in settings:
                    library.set_prefetch(setting, "f32")
                    assert torch.equal(kernel(x), single), (out_features, rows, setting)
    finally:
        library.set_prefetch(before, "f32")


@pytest.mark.parametrize("out_features,in_features", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_int8_kernel_is_exact_integer_arithmetic(library: NativeLibrary, out_features: int,
                                                 in_features: int, bias: bool) -> None:
    torch.manual_seed(1)
    linear = nn.Linear(in_features, out_features, bias=bias).requires_grad_(False)
    kernel = NativeInt8Kernel(library, linear.weight, linear.bias)
    q, scales = quantize_int8(linear.weight)
    assert q.abs().max() == 127     # full 8 bits: a saturating int16 sum would show below
    padded = -(-out_features // 4) * 4 * -(-in_features // 32) * 32
    assert kernel.read_bytes == padded + 4 * out_features * (2 if bias else 1)
    for rows in (1, 5, 16, 3):
        x = torch.randn(rows, in_features)
        # The same rounded activations and weights in float: only summation order differs.
        want = F.linear(_int8_activations(x), q.float() * scales[:, None], linear.bias)
        got = kernel(x)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert _rel(got, linear(x)) < 2e-2


def test_int8_kernel_on_large_activations_does_not_saturate(library: NativeLibrary) -> None:
    # Every product at the extremes: 127 * 127 pairs sum to 32258 per int16 lane.
    weight = torch.full((4, 64), 1.0)
    weight[1] = -1.0
    kernel = NativeInt8Kernel(library, weight, None)
    for rows in (2, 17):        # the pair kernel and its lone last row
        x = torch.full((rows, 64), 3.0)
        x[1::2, ::2] = -3.0
        torch.testing.assert_close(kernel(x), x @ weight.t())


@pytest.mark.parametrize("out_features,in_features", [(37, 100), (5, 7), (24, 2048), (64, 96)])
def test_int8_rows_of_a_many_row_call_equal_one_row_calls(
        library: NativeLibrary, out_features: int, in_features: int) -> None:
    # Several rows go through other code than one row (pairs of rows, blocks of 16, a
    # lone last row); the integer sums and the float scaling after them are the same, so
    # a row's outputs do not depend on what came with it, bit for bit.
    torch.manual_seed(4)
    linear = nn.Linear(in_features, out_features).requires_grad_(False)
    kernel = NativeInt8Kernel(library, linear.weight, linear.bias)
    q, scales = quantize_int8(linear.weight)
    for rows in (2, 3, 5, 16, 17, 33, 64):
        x = torch.randn(rows, in_features)
        x[rows // 2] = 0.0          # a zero row: scale 0 and no NaN
        x[0, :32] *= 50.0           # an outlier block: the others get finer scales than it
        if in_features > 64:
            x[-1, 32:64] = 0.0      # a zero block in a row that is not
        # The kernel's rounding (per block, x times its inverse scale, to nearest even),
        # its integer sums in float64 (exact), then the scales: what is left is the float
        # scaling's rounding.
        xq, m, scale = _int8_blocks(x)
        want = ((xq * m).double() @ q.double().t()) * scales.double() * scale.double() \
            + linear.bias
        got = kernel(x)
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
        single = torch.cat([kernel(x[r:r + 1]) for r in range(rows)])
        assert torch.equal(got, single), rows


@pytest.mark.parametrize("out_features,in_features", [(37, 96), (8, 32), (96, 256)])
@pytest.mark.parametrize("bias", [False, True])
def test_int4_kernel_equals_its_dequantized_weights(library: NativeLibrary, out_features: int,
                                                    in_features: int, bias: bool) -> None:
    torch.manual_seed(2)
    linear = nn.Linear(in_features, out_features, bias=bias).requires_grad_(False)
    linear.weight[0] = 0.25             # a constant group: scale at its floor, no NaN
    kernel = NativeInt4Kernel(library, linear.weight, linear.bias)
    deq = dequantize_int4_native(*quantize_int4_native(linear.weight))
    # 4 bits per weight and an fp16 scale and minimum per 32, rows padded to tiles of 4.
    padded = -(-out_features // 4) * 4 * in_features
    assert kernel.read_bytes == padded // 2 + 4 * padded // 32 + (4 * out_features if bias else 0)
    assert _rel(deq, linear.weight) < 0.1
    for rows in (1, 5, 16, 3):
        x = torch.randn(rows, in_features)
        want = F.linear(_int4_activations(x), deq, linear.bias)
        got = kernel(x)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert _rel(got, linear(x)) < 0.15


def test_int4_rows_of_a_many_row_call_equal_one_row_calls(library: NativeLibrary) -> None:
    """A verification's rows (1-16, any mix of the 4-, 2- and 1-row passes) give each row
    what a one-row decode step gives it, bit for bit."""
    torch.manual_seed(4)
    kernel = NativeInt4Kernel(library, torch.randn(52, 160), None)
    for rows in (2, 3, 4, 7, 16):
        x = torch.randn(rows, 160)
        single = torch.cat([kernel(x[r:r + 1]) for r in range(rows)])
        assert torch.equal(kernel(x), single), rows


@pytest.mark.parametrize("out_features,in_features", [(37, 96), (8, 32), (96, 256), (6, 576)])
@pytest.mark.parametrize("bias", [False, True])
def test_q8_kernel_equals_its_dequantized_weights(library: NativeLibrary, out_features: int,
                                                  in_features: int, bias: bool) -> None:
    # Q8_0's blocks: int8 per group of 32 with an fp16 scale; the activations rounded
    # per group of 32 as for int4. What is left is float rounding.
    torch.manual_seed(3)
    linear = nn.Linear(in_features, out_features, bias=bias).requires_grad_(False)
    linear.weight[0] = 0.0              # an all-zero group: scale at its floor, no NaN
    linear.weight[1, :32] *= 50.0       # a group far larger than the rest of its row
    kernel = NativeQ8Kernel(library, linear.weight, linear.bias)
    deq = dequantize_q8(*quantize_q8(linear.weight))
    # 8 bits per weight and an fp16 scale per 32 (34 bytes, as Q8_0), rows padded to 4.
    padded = -(-out_features // 4) * 4 * in_features
    assert kernel.read_bytes == padded + padded // 16 + (4 * out_features if bias else 0)
    assert _rel(deq, linear.weight) < 0.01
    for rows in (1, 2, 3, 16):
        x = torch.randn(rows, in_features)
        want = F.linear(_int4_activations(x), deq, linear.bias)
        got = kernel(x)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert _rel(got, linear(x)) < 0.05        # the activations' 8 bits, mostly
        single = torch.cat([kernel(x[r:r + 1]) for r in range(rows)])
        assert torch.equal(got, single), rows     # a row's outputs: not its neighbours'


def test_q8_kernel_agrees_with_the_avx2_build(haswell: NativeLibrary) -> None:
    # Where the compiler targets AVX-512 VNNI the weights go unsigned (q + 128) into
    # vpdpbusd and the offset comes off through the activations' sums; the AVX2 path
    # multiplies signed bytes. Both are exact integer sums, then the same float scaling
    # in another order.
    native = native_status().library
    assert native is not None
    torch.manual_seed(8)
    for out_features, in_features in ((37, 96), (64, 576), (13, 1536)):
        weight = torch.randn(out_features, in_features) * in_features ** -0.5
        for rows in (1, 2, 5):
            x = torch.randn(rows, in_features)
            torch.testing.assert_close(NativeQ8Kernel(native, weight, None)(x),
                                       NativeQ8Kernel(haswell, weight, None)(x),
                                       atol=1e-5, rtol=1e-5)


def test_the_prefetch_distance_changes_no_result(library: NativeLibrary) -> None:
    torch.manual_seed(5)
    int4 = NativeInt4Kernel(library, torch.randn(40, 256), None)
    int8 = NativeInt8Kernel(library, torch.randn(40, 256), None)
    x = torch.randn(3, 256)
    default = library.set_prefetch(256)
    want = int4(x), int8(x)
    try:
        for distance in (0, 64, 4096, 1 << 20):
            assert library.set_prefetch(distance) == distance
            assert torch.equal(int4(x), want[0]) and torch.equal(int8(x), want[1])
        assert library.set_prefetch(-1) == 1 << 20          # out of range: unchanged
        assert library.set_prefetch((1 << 20) + 1) == 1 << 20
        # Each family on its own.
        assert library.set_prefetch(4096, "int4") == 4096
        assert library.set_prefetch(-1, "int8") == 1 << 20
        assert torch.equal(int4(x), want[0]) and torch.equal(int8(x), want[1])
        with pytest.raises(ValueError):
            library.set_prefetch(256, "int2")
    finally:
        library.set_prefetch(default)


def test_an_outlier_channel_costs_only_its_own_block(library: NativeLibrary) -> None:
    # Real models have a few activation channels hundreds of times the others. One scale
    # per row rounded every other channel to a few levels; the int8 and int4 kernels scale
    # each block of 32 on its own. The outlier's block meets zero weights here, so what is
    # left is the other blocks' rounding.
    torch.manual_seed(5)
    weight = torch.randn(24, 256) / 16
    weight[:, :32] = 0.0
    x = torch.randn(3, 256)
    x[:, 3] = 1000.0
    int8 = NativeInt8Kernel(library, weight, None)
    q, scales = quantize_int8(weight)
    assert _rel(int8(x), F.linear(x, q.float() * scales[:, None])) < 0.02
    int4 = NativeInt4Kernel(library, weight, None)
    assert _rel(int4(x), F.linear(x, dequantize_int4_native(*quantize_int4_native(weight)))) < 0.02


@pytest.fixture(scope="module")
def haswell(tmp_path_factory: pytest.TempPathFactory) -> NativeLibrary:
    """The library built for AVX2 (Haswell), beside a vectorised native one."""
    native = native_status().library
    if native is None or native.simd_level < 2:
        pytest.skip("no vectorised native library")
    status = build_library("cc", ("-O3", "-march=haswell", "-fPIC", "-shared", "-pthread"),
                           folder=tmp_path_factory.mktemp("haswell"))
    assert status.library is not None and status.library.simd_level == 2, status.reason
    return status.library


def test_fp32_kernel_of_the_avx2_build_at_every_row_count(haswell: NativeLibrary) -> None:
    """The 256-bit tiles (3 + 2 + ... rows, the next tile fetched or not) that an AVX2
    machine runs: the product at 1-16 rows, each row bit for bit its one-row call (the
    AVX2 build's one-row tile sums in the tiles' order), and one row bit for bit the
    native build's where that is an AVX2 build too (an AVX-512 build's one-row tile sums
    as its 512-bit passes do: close, not equal)."""
    native = native_status().library
    assert native is not None
    torch.manual_seed(12)
    before = haswell.set_prefetch(-1, "f32")
    try:
        for out_features, in_features in ((41, 528), (12, 9)):
            weight = torch.randn(out_features, in_features) * in_features ** -0.5
            avx2 = NativeF32Kernel(haswell, weight, None)
            wide = NativeF32Kernel(native, weight, None)
            for rows in range(1, 17):
                x = torch.randn(rows, in_features)
                for setting in (0, 256):
                    haswell.set_prefetch(setting, "f32")
                    got = avx2(x)
                    torch.testing.assert_close(got, F.linear(x, weight), atol=1e-5, rtol=1e-5)
                    single = torch.cat([avx2(x[r:r + 1]) for r in range(rows)])
                    assert torch.equal(got, single), (out_features, rows, setting)
                    if rows == 1 and not native.f32_wide:
                        assert torch.equal(got, wide(x))
    finally:
        haswell.set_prefetch(before, "f32")


def test_int8_kernel_gives_the_same_numbers_with_and_without_vnni(
        haswell: NativeLibrary) -> None:
    # Where the compiler targets AVX-512 VNNI, vpdpwssd does vpmaddwd + vpaddd's work:
    # the same integers, so the AVX2 build (Haswell) must agree bit for bit.
    native = native_status().library
    assert native is not None
    torch.manual_seed(6)
    for out_features, in_features in ((37, 100), (64, 576), (24, 2048)):
        weight = torch.randn(out_features, in_features) * in_features ** -0.5
        for rows in (1, 2, 3, 17):
            x = torch.randn(rows, in_features)
            x[0, :5] *= 40.0
            assert torch.equal(NativeInt8Kernel(native, weight, None)(x),
                               NativeInt8Kernel(haswell, weight, None)(x))


def test_int8_kernel_at_2_to_17_rows_equals_one_row_calls_and_the_avx2_build(
        haswell: NativeLibrary) -> None:
    # Where the compiler targets AVX-512 VNNI + BW, several rows go through another kernel
    # (int16 activations times the block multipliers, vpdpwssd on 512-bit registers, rows
    # in groups of up to 4; in_features from 384): every group size, partial tiles of
    # output rows, a row block of 16 and one past it, a partial block of 32 columns, bit
    # for bit as one-row calls and as the AVX2 build.
    native = native_status().library
    assert native is not None
    torch.manual_seed(7)
    for out_features, in_features in ((37, 100), (37, 400), (6, 576), (13, 1536)):
        weight = torch.randn(out_features, in_features) * in_features ** -0.5
        kernel = NativeInt8Kernel(native, weight, None)
        avx2 = NativeInt8Kernel(haswell, weight, None)
        x = torch.randn(17, in_features)
        x[3, :32] *= 60.0
        x[5] = 0.0
        single = torch.cat([kernel(x[r:r + 1]) for r in range(17)])
        for rows in range(2, 18):
            got = kernel(x[:rows])
            assert torch.equal(got, single[:rows]), (out_features, in_features, rows)
            assert torch.equal(got, avx2(x[:rows])), (out_features, in_features, rows)


def test_int8_kernel_refuses_inputs_past_its_limit(library: NativeLibrary) -> None:
    with pytest.raises(ValueError, match="in_features 1048608 is above"):
        NativeInt8Kernel(library, torch.zeros(1, 2**20 + 32), None)


def test_kernels_take_strided_and_zero_inputs(library: NativeLibrary) -> None:
    torch.manual_seed(3)
    linear = nn.Linear(64, 24).requires_grad_(False)
    x = torch.randn(64, 6).t()          # not contiguous
    zeros = torch.zeros(2, 64)
    for kernel in (NativeF32Kernel(library, linear.weight, linear.bias),
                   NativeInt8Kernel(library, linear.weight, linear.bias),
                   NativeInt4Kernel(library, linear.weight, linear.bias)):
        assert _rel(kernel(x), linear(x)) < 0.15, kernel.name
        torch.testing.assert_close(kernel(zeros), linear.bias.expand(2, -1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_weight_kernel_gives_the_fp32_kernels_bits(library: NativeLibrary,
                                                        dtype: torch.dtype) -> None:
    """Weights that are exactly fp16 / bf16 numbers, kept in 16 bits: every row count's
    result is the fp32 kernel's on the same weights bit for bit (its 512-bit setting on
    an AVX-512 build, which is what that build measures), each row of a several-row call
    its one-row call, at half the bytes read."""
    torch.manual_seed(21)
    before = library.set_prefetch(-1, "f32")
    try:
        if library.f32_wide:
            library.set_prefetch(library.f32_wide_from, "f32")
        for out_features, in_features in ((41, 528), (64, 256), (7, 9)):
            weight = (torch.randn(out_features, in_features) * in_features ** -0.5).to(dtype)
            bias = torch.randn(out_features)
            wide = NativeF32Kernel(library, weight.float(), bias)
            half = NativeHalfKernel(library, weight.float(), bias, dtype)
            assert half.name == NativeHalfKernel.NAMES[dtype]
            assert half.read_bytes == wide.read_bytes - half.tiles.numel() * 2
            for rows in (*range(1, 14), 17):
                x = torch.randn(rows, in_features)
                got = half(x)
                assert torch.equal(got, wide(x)), (out_features, rows)
                single = torch.cat([half(x[r:r + 1]) for r in range(rows)])
                assert torch.equal(got, single), (out_features, rows)
                torch.testing.assert_close(got, F.linear(x, weight.float(), bias),
                                           atol=1e-5, rtol=1e-5)
    finally:
        library.set_prefetch(before, "f32")


def test_half_weight_kernel_of_the_avx2_build(haswell: NativeLibrary) -> None:
    """The AVX2 build's 256-bit tiles on 16-bit weights: the AVX2 fp32 kernel's bits."""
    torch.manual_seed(22)
    for dtype in (torch.float16, torch.bfloat16):
        weight = (torch.randn(41, 528) * 528 ** -0.5).to(dtype).float()
        f32, half = NativeF32Kernel(haswell, weight, None), NativeHalfKernel(haswell, weight,
                                                                            None, dtype)
        for rows in range(1, 10):
            x = torch.randn(rows, 528)
            assert torch.equal(half(x), f32(x)), (dtype, rows)


def test_only_weights_exact_in_16_bits_are_kept_in_them(library: NativeLibrary) -> None:
    torch.manual_seed(23)
    weight = torch.randn(8, 32)
    assert half_storage(weight) is None
    assert half_storage(weight.half().float()) is torch.float16
    # bf16 numbers past fp16's range (or below its precision) are not fp16 numbers
    assert half_storage((weight * 1e6).bfloat16().float()) is torch.bfloat16
    with pytest.raises(ValueError, match=r"not exactly torch\.float16"):
        NativeHalfKernel(library, weight, None, torch.float16)
    names = {c.name for c in candidates(QuantMode.NONE, half=torch.bfloat16)}
    assert "fp32_native_bf16_weights" in names and "fp32_native" in names
    assert not {n for n in {c.name for c in candidates(QuantMode.NONE)} if "weights" in n}
    assert not {n for n in {c.name for c in candidates(QuantMode.INT8, half=torch.float16)}
                if "weights" in n}


def test_llm_bench_says_which_layers_keep_16_bit_weights() -> None:
    from turboinfer.commands.llm import _sixteen_bit
    from turboinfer.llm.backends.cpu.kernels import KernelChoice

    def choice(rows: int, chosen: str, layers: int) -> KernelChoice:
        return KernelChoice("none", 8, 8, rows, chosen, {}, layers=layers)

    assert _sixteen_bit([choice(1, "fp32_native", 6), choice(16, "fp32_native", 6)]) == ""
    line = _sixteen_bit([choice(1, "fp32_native_bf16_weights", 12),
                         choice(1, "fp32_native", 6),
                         choice(16, "fp32_native_bf16_weights", 18)])
    assert line == "; 12 of 18 layers kept in 16 bits (bfloat16), fp32 arithmetic"


def test_native_kernels_are_measured_candidates() -> None:
    for mode, name in [(QuantMode.NONE, "fp32_native"), (QuantMode.INT8, "int8_native"),
                       (QuantMode.INT4, "int4_native")]:
        assert name in {c.name for c in candidates(mode)}
        # where AMX does not run, its int8 kernel is reported absent (test_native_amx.py)
        assert set(absent_candidates(mode)) <= {"int8_amx_native"}
    # The int4 kernel holds groups of 32 only.
    assert "int4_native" not in {c.name for c in candidates(QuantMode.INT4, group_size=64)}
    assert "groups of 32" in absent_candidates(QuantMode.INT4, group_size=64)["int4_native"]


@pytest.fixture
def native_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the native kernels are offered, so the measurement has to pick them."""
    monkeypatch.setattr(kernel_candidates, "_torch_candidates", lambda mode, group: [])


def test_llm_on_native_fp32_kernels_matches_transformers(tiny_llm_dir: Path,
                                                         native_only: None) -> None:
    from llm_helpers import hf_greedy

    from turboinfer.llm import LLM, EngineConfig, SamplingParams

    prompt = [5, 17, 99, 3, 42, 7, 64, 1, 2, 88, 31]
    llm = LLM(tiny_llm_dir, config=EngineConfig(kv_cache_tokens=512, block_size=4))
    assert {c.chosen for c in llm.kernel_choices} == {"fp32_native"}
    layer = llm.model.layers[0].self_attn.qkv_proj
    assert isinstance(layer, SelectedLinear) and layer.small.name == "fp32_native"
    out = llm.generate(prompt, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    assert list(out[0].token_ids) == hf_greedy(tiny_llm_dir, prompt, 24)


def _dequantized(model: nn.Module, mode: QuantMode) -> nn.Module:
    """``model`` with each linear weight replaced by what its native quantized form holds
    (the LM head in int8 under int4: ``layer_mode``)."""
    for path, module in model.named_modules():
        if isinstance(module, nn.Linear):
            w = module.weight.data
            fmt = layer_mode(mode, path.rpartition(".")[2])
            if fmt is QuantMode.INT8:
                q, scales = quantize_int8(w)
                deq = q.float() * scales[:, None]
            elif fmt is QuantMode.Q8:
                deq = dequantize_q8(*quantize_q8(w))
            else:
                deq = dequantize_int4_native(*quantize_int4_native(w))
            module.weight = nn.Parameter(deq, requires_grad=False)
    return model


@pytest.mark.parametrize("mode", [QuantMode.INT8, QuantMode.INT4, QuantMode.Q8])
def test_model_on_native_quantized_kernels_matches_its_float_weights(
        tiny_llama_dir: Path, native_only: None, mode: QuantMode) -> None:
    # The reference holds the same quantized weights in fp32: what remains is the
    # rounding of the activations to 8 bits (the same bound as torch's dynamic int8 in
    # test_llm_kernels.py).
    plain = _dequantized(load_model(tiny_llama_dir), mode)
    model = load_model(tiny_llama_dir)
    choices = select_kernels(model, mode)
    chosen = {c.chosen for c in choices}
    int8 = {"int8_native", "int8_amx_native"}     # the second where AMX runs
    assert chosen <= {f"{mode.value}_native"} | int8 and chosen & {f"{mode.value}_native",
                                                                  *int8}, chosen
    ids = torch.arange(1, 40) % plain.config.vocab_size
    pos = torch.arange(ids.numel())
    with torch.inference_mode():
        for n in (ids.numel(), 1):      # prefill rows, then one decode row
            want = plain.logits(plain(ids[:n], pos[:n]))
            got = model.logits(model(ids[:n], pos[:n]))
            assert _rel(got, want) < 4e-2, (n, _rel(got, want))


def test_without_a_compiler_the_engine_runs_on_torch_kernels(
        tiny_llm_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from turboinfer.llm import LLM, EngineConfig, SamplingParams

    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("TURBOINFER_CACHE_DIR", str(tmp_path / "cache"))
    status = native_status()
    assert status.library is None and "no C compiler" in status.reason
    assert not [c for c in candidates(QuantMode.INT8) if c.name.endswith("native")]
    llm = LLM(tiny_llm_dir, quant="int8",
              config=EngineConfig(kv_cache_tokens=512, block_size=4))
    assert llm.kernel_choices
    native_names = {"none": "fp32_native", "int8": "int8_native", "int4": "int4_native"}
    for choice in llm.kernel_choices:
        assert not choice.chosen.endswith("native")
        assert "no C compiler" in choice.absent[native_names[choice.mode]]
    out = llm.generate([5, 17, 99], SamplingParams(max_tokens=6, temperature=0,
                                                   ignore_eos=True))
    assert len(out[0].token_ids) == 6


def test_a_failing_compile_is_reported(tmp_path: Path) -> None:
    status = build_library("cc", ("-fno-such-flag-anywhere",), folder=tmp_path)
    assert status.library is None
    assert status.reason.startswith("compiling the native kernels failed")
    assert not list(tmp_path.iterdir())     # no half-written library left behind


def test_the_library_is_compiled_once_per_key(tmp_path: Path) -> None:
    first = build_library("cc", PLAIN_FLAGS, folder=tmp_path)
    assert first.library is not None
    built = sorted(tmp_path.iterdir())
    assert len(built) == 1 and built[0].suffix == ".so"
    mtime = built[0].stat().st_mtime_ns
    second = build_library("cc", PLAIN_FLAGS, folder=tmp_path)
    assert second.library is not None and built[0].stat().st_mtime_ns == mtime
    build_library("cc", ("-O1", "-fPIC", "-shared"), folder=tmp_path)
    assert len(list(tmp_path.iterdir())) == 2     # other flags, another file


def test_an_unusable_cache_folder_is_reported(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    status = build_library("cc", PLAIN_FLAGS, folder=blocker / "native")
    assert status.library is None
    assert status.reason.startswith("compiling the native kernels failed")
