"""The native kernels split across worker threads (native/threads.c): every thread count
gives the one-thread result bit for bit, on partial tiles, one and several activation
rows and sequences of different lengths, in the vectorised and the plain C build; a
decode through the engine at two threads gives the tokens one thread gives."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from turboinfer.llm.backends.cpu import kernel_candidates
from turboinfer.llm.backends.cpu.kernel_candidates import (
    NativeF32Kernel,
    NativeInt4Kernel,
    NativeInt8Kernel,
    NativeQ8Kernel,
)
from turboinfer.llm.backends.cpu.native import NativeLibrary, native_status

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")


@pytest.fixture(scope="module", params=["native", "plain"])
def library(request: pytest.FixtureRequest) -> Iterator[NativeLibrary]:
    found: NativeLibrary | None = (request.getfixturevalue("plain_library")
                                   if request.param == "plain" else native_status().library)
    assert found is not None, native_status().reason
    yield found
    found.set_threads(1)


def _at(library: NativeLibrary, threads: int, run: Callable[[], torch.Tensor]) -> torch.Tensor:
    assert library.set_threads(threads) == threads
    return run()


@pytest.mark.parametrize("kernel", [NativeF32Kernel, NativeInt8Kernel, NativeInt4Kernel,
                                    NativeQ8Kernel])
@pytest.mark.parametrize("out_features", [8, 37, 200])   # under two tiles a part; partial
@pytest.mark.parametrize("rows", [1, 2, 5])
def test_a_linear_layer_on_any_thread_count_equals_one_thread(
        library: NativeLibrary, kernel: type, out_features: int, rows: int) -> None:
    gen = torch.Generator().manual_seed(out_features * 10 + rows)
    weight = torch.randn(out_features, 96, generator=gen)
    bias = torch.randn(out_features, generator=gen)
    layer = kernel(library, weight, bias)
    x = torch.randn(rows, 96, generator=gen)
    one = _at(library, 1, lambda: layer(x))
    for threads in (2, 3):
        assert torch.equal(_at(library, threads, lambda: layer(x)), one), threads
    library.set_solo(True)          # the caller alone, the workers asleep: the same
    try:
        assert torch.equal(layer(x), one)
    finally:
        library.set_solo(False)


def test_paged_attention_on_any_thread_count_equals_one_thread(library: NativeLibrary) -> None:
    heads, kv_heads, dim, block_size = 6, 2, 16, 4
    gen = torch.Generator().manual_seed(0)
    k_cache = torch.randn(12 * block_size, kv_heads, dim, generator=gen)
    v_cache = torch.randn(12 * block_size, kv_heads, dim, generator=gen)
    tables = torch.tensor([[3, 0, 7, 1], [5, 2, 0, 0], [11, 0, 0, 0], [4, 6, 8, 9],
                           [10, 0, 0, 0]])
    lens = torch.tensor([14, 5, 1, 16, 3])
    q = torch.randn(5, heads, dim, generator=gen)

    def run() -> torch.Tensor:
        out = torch.empty(5, heads, dim)
        assert library.paged_decode_attention(
            q.data_ptr(), 5, heads * dim, heads, kv_heads, dim, k_cache.data_ptr(),
            v_cache.data_ptr(), tables.data_ptr(), 4, block_size, lens.data_ptr(), 0.25,
            out.data_ptr()) == 0
        return out

    one = _at(library, 1, run)
    for threads in (2, 4):
        assert torch.equal(_at(library, threads, run), one), threads


def test_the_engine_decodes_the_same_tokens_on_two_threads(
        tiny_llm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from turboinfer.llm import LLM, EngineConfig, SamplingParams

    # Native kernels only: torch's int8 kernels round otherwise, and which kernel wins
    # the timing may change with the thread count.
    monkeypatch.setattr(kernel_candidates, "_torch_candidates", lambda mode, group: [])
    library = native_status().library
    assert library is not None
    prompts = [[5, 17, 99, 3, 42], [7, 64, 1], [2, 88, 31, 9, 9, 4]]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    tokens = {}
    previous = torch.get_num_threads()
    try:
        for threads in (1, 2):
            llm = LLM(tiny_llm_dir, quant="int8",
                      config=EngineConfig(kv_cache_tokens=512, block_size=4,
                                          num_threads=threads))
            assert library.set_threads(threads) == threads   # what the engine set
            tokens[threads] = [list(o.token_ids) for o in llm.generate(prompts, params)]
    finally:
        torch.set_num_threads(previous)
        library.set_threads(1)
    assert tokens[1] == tokens[2]


@pytest.mark.parametrize("rows", [1, 5])
def test_a_long_decode_step_on_any_thread_count_equals_one_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    """Past 128 positions a step's attention is split by key-value head (4 here, so 3
    threads take uneven shares); the step's output is one thread's to the bit."""
    from llm_helpers import save_random_hf_model

    from turboinfer.llm.backends.cpu.kernels import select_kernels
    from turboinfer.llm.backends.cpu.native_decode import NativeDecoder
    from turboinfer.llm.model.config import QuantMode
    from turboinfer.llm.model.loader import load_model

    library = native_status().library
    assert library is not None
    monkeypatch.setattr(kernel_candidates, "_torch_candidates", lambda mode, group: [])
    folder = save_random_hf_model(tmp_path / "m", hidden_size=128, num_attention_heads=8,
                                  num_key_value_heads=4, max_position_embeddings=512)
    model = load_model(folder)
    select_kernels(model, QuantMode.INT8, measure=True)
    cache = model.allocate_kv_cache(64, 8)
    decoder = NativeDecoder.build(model, cache)
    assert decoder is not None
    table = list(range(63, -1, -1))
    prompt = [(11 * j + 5) % 128 for j in range(300)]
    step = [(3 * j + 1) % 128 for j in range(rows)]
    try:
        library.set_threads(1)
        decoder.forward(prompt, 0, table, 0)
        out = {threads: _at(library, threads, lambda: decoder.forward(step, 300, table, rows))
               for threads in (1, 2, 3)}
    finally:
        library.set_threads(1)
    assert torch.equal(out[1], out[2]) and torch.equal(out[1], out[3])
