"""The int8 kernel on Intel AMX tiles (llm/backends/cpu/native/amx.c): the int8 kernel's
quantization, each output's exact integer sum rounded once, a row's outputs the same
whatever rows came with it and on any thread count, and the whole engine on it. The
layout is checked on every machine; the kernel only where AMX runs."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from turboinfer.llm.backends.cpu import kernel_candidates
from turboinfer.llm.backends.cpu.kernel_candidates import (
    NativeAmxInt8Kernel,
    NativeInt8Kernel,
    absent_candidates,
    candidates,
)
from turboinfer.llm.backends.cpu.native import NativeLibrary, native_status
from turboinfer.llm.backends.cpu.native.layout import amx_int8_tiles
from turboinfer.llm.model.config import QuantMode
from turboinfer.llm.model.quant import quantize_int8

_STATUS = native_status() if shutil.which("cc") else None
_LIB = _STATUS.library if _STATUS else None
needs_amx = pytest.mark.skipif(
    _LIB is None or not _LIB.has_amx,
    reason="no AMX tiles here: " + ("no C compiler" if _STATUS is None else
                                    _STATUS.reason or "this CPU has no AMX-INT8"))


def test_the_layout_puts_each_weight_where_a_b_tile_reads_it() -> None:
    q = torch.randint(-127, 128, (37, 100), dtype=torch.int8)
    tiles, kp = amx_int8_tiles(q)
    assert kp == 128
    blocks = tiles.view(3, 16 * 128 + 64)     # per block of 16 outputs: tiles, then sums
    t = blocks[:, :16 * 128].reshape(3, 2, 16, 16, 4)   # [block, chunk of 64, r, j, i]
    padded = F.pad(q, (0, 28, 0, 11))
    for block, chunk, r, j, i in [(0, 0, 0, 0, 0), (2, 1, 15, 4, 3), (1, 0, 7, 9, 2),
                                  (2, 1, 8, 5, 1)]:
        assert t[block, chunk, r, j, i] == padded[16 * block + j, 64 * chunk + 4 * r + i]
    assert t[2, 1, :, 5:].abs().sum() == 0 and t[2, 1, 9:, :].abs().sum() == 0  # padding
    sums = blocks[:, 16 * 128:].contiguous().view(torch.int32).reshape(-1)
    assert torch.equal(sums, padded.sum(dim=1, dtype=torch.int32))


def test_the_amx_kernel_is_offered_exactly_where_amx_runs() -> None:
    names = {c.name for c in candidates(QuantMode.INT8)}
    if _LIB is not None and _LIB.has_amx:
        assert NativeAmxInt8Kernel.name in names
        assert absent_candidates(QuantMode.INT8) == {}
    else:
        assert NativeAmxInt8Kernel.name not in names
        if _LIB is not None:
            assert "no AMX" in absent_candidates(QuantMode.INT8)[NativeAmxInt8Kernel.name]


def _exact(x: torch.Tensor, linear: nn.Linear) -> torch.Tensor:
    """The int8 kernel's rounded activations (test_native_kernels' _int8_blocks) times the
    int8 weights, summed exactly (float64), then scaled."""
    from test_native_kernels import _int8_blocks

    q, scales = quantize_int8(linear.weight)
    xq, m, scale = _int8_blocks(x)
    out = ((xq * m).double() @ q.double().t()) * scales.double() * scale.double()
    return out + linear.bias if linear.bias is not None else out


@pytest.fixture
def lib() -> Iterator[NativeLibrary]:
    assert _LIB is not None
    yield _LIB
    _LIB.set_threads(1)


@needs_amx
@pytest.mark.parametrize("out_features,in_features", [(37, 100), (5, 7), (64, 576),
                                                      (48, 2048), (33, 64)])
def test_amx_outputs_are_the_exact_sums_and_do_not_depend_on_the_other_rows(
        lib: NativeLibrary, out_features: int, in_features: int) -> None:
    torch.manual_seed(11)
    linear = nn.Linear(in_features, out_features).requires_grad_(False)
    amx = NativeAmxInt8Kernel(lib, linear.weight, linear.bias)
    int8 = NativeInt8Kernel(lib, linear.weight, linear.bias)
    x = torch.randn(40, in_features)
    x[3] = 0.0                     # a zero row
    x[0, :32] *= 50.0              # an outlier block
    single = torch.cat([amx(x[r:r + 1]) for r in range(40)])
    for rows in (1, 2, 7, 8, 16, 17, 40):     # one pass of rows, a partial one, several
        got = amx(x[:rows])
        assert torch.equal(got, single[:rows]), rows
        torch.testing.assert_close(got.double(), _exact(x[:rows], linear), atol=1e-5,
                                   rtol=1e-5)
        # the same quantized model as the int8 kernel: float rounding apart
        torch.testing.assert_close(got, int8(x[:rows]), atol=1e-4, rtol=1e-4)


@needs_amx
def test_amx_sums_at_the_extremes_are_exact(lib: NativeLibrary) -> None:
    # Every activation at its block's full scale (x * m = +-127 * 255), every weight +-127.
    weight = torch.ones(16, 4096)
    weight[1::2] = -1.0
    x = torch.full((3, 4096), 2.0)
    x[1, ::2] = -2.0
    torch.testing.assert_close(NativeAmxInt8Kernel(lib, weight, None)(x), x @ weight.t())


@needs_amx
def test_amx_kernel_refuses_inputs_past_its_limit(lib: NativeLibrary) -> None:
    with pytest.raises(ValueError, match="in_features 65600 is above"):
        NativeAmxInt8Kernel(lib, torch.zeros(1, 65600), None)


@needs_amx
@pytest.mark.parametrize("out_features", [16, 37, 200])   # one block, a partial one, many
@pytest.mark.parametrize("rows", [1, 5, 20])
def test_amx_on_any_thread_count_equals_one_thread(lib: NativeLibrary, out_features: int,
                                                   rows: int) -> None:
    gen = torch.Generator().manual_seed(out_features + rows)
    layer = NativeAmxInt8Kernel(lib, torch.randn(out_features, 192, generator=gen),
                                torch.randn(out_features, generator=gen))
    x = torch.randn(rows, 192, generator=gen)
    assert lib.set_threads(1) == 1
    one = layer(x)
    for threads in (2, 3):
        assert lib.set_threads(threads) == threads
        assert torch.equal(layer(x), one), threads


@needs_amx
def test_the_engine_on_amx_kernels_verifies_what_it_decodes(
        tiny_llm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the AMX kernel offered: every layer (the LM head too) runs on it, decode steps
    # and prompt chunks through the native step, and speculative verification of several
    # rows gives the tokens one-row decoding gives.
    from turboinfer.llm import LLM, EngineConfig, SamplingParams

    monkeypatch.setattr(kernel_candidates, "_torch_candidates", lambda mode, group: [])
    amx_only = [c for c in kernel_candidates._native_candidates(QuantMode.INT8, 32)
                if c.name == NativeAmxInt8Kernel.name]
    monkeypatch.setattr(kernel_candidates, "_native_candidates",
                        lambda mode, group: amx_only if mode is QuantMode.INT8 else [])
    config: dict[str, object] = dict(kv_cache_tokens=512, block_size=4, quant="int8")
    plain = LLM(tiny_llm_dir, config=EngineConfig(**config))
    assert {c.chosen for c in plain.kernel_choices} == {NativeAmxInt8Kernel.name}
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    prompt = [5, 17, 99, 3, 42, 7, 64, 1, 2, 88, 31, 5, 17, 99, 3]
    want = list(plain.generate(prompt, params)[0].token_ids)
    lookup = LLM(tiny_llm_dir, ngram=3,
                 config=EngineConfig(**config, num_speculative_tokens=4))
    assert list(lookup.generate(prompt, params)[0].token_ids) == want
