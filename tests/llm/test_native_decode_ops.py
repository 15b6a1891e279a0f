"""decode.c's operations (llm/backends/cpu/native) against the torch operations the model runs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from turboinfer.llm.backends.cpu.native import NativeLibrary, native_status
from turboinfer.llm.model.llama import RotaryEmbedding, rotate


@pytest.fixture(scope="module")
def lib() -> NativeLibrary:
    library = native_status().library
    if library is None:
        pytest.skip(f"native kernels absent: {native_status().reason}")
    return library


@pytest.mark.parametrize("rows,n", [(1, 768), (5, 100), (16, 8)])
def test_rms_norm_matches_torch(lib: NativeLibrary, rows: int, n: int) -> None:
    x, w = torch.randn(rows, n) * 3, torch.randn(n)
    y = torch.empty_like(x)
    lib.rms_norm(x.data_ptr(), rows, n, w.data_ptr(), 1e-5, y.data_ptr())
    torch.testing.assert_close(y, F.rms_norm(x, (n,), w, 1e-5), rtol=1e-5, atol=1e-5)
    lib.rms_norm(x.data_ptr(), rows, n, w.data_ptr(), 1e-5, x.data_ptr())   # in place
    torch.testing.assert_close(x, y)


@pytest.mark.parametrize("inner", [2048, 13])
def test_silu_mul_matches_torch(lib: NativeLibrary, inner: int) -> None:
    gate_up = torch.randn(3, 2 * inner) * 6
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -90.0])
    y = torch.empty(3, inner)
    lib.silu_mul(gate_up.data_ptr(), 3, inner, y.data_ptr())
    want = F.silu(gate_up[:, :inner]) * gate_up[:, inner:]
    torch.testing.assert_close(y, want, rtol=2e-6, atol=1e-6)


def test_rope_kv_rotates_and_writes_the_cache(lib: NativeLibrary) -> None:
    heads, kv_heads, dim, rows = 6, 2, 16, 3
    rope = RotaryEmbedding(dim, 64, 10000.0)
    qkv = torch.randn(rows, heads + 2 * kv_heads, dim)
    positions = torch.tensor([0, 7, 63])
    slots = torch.tensor([5, 0, 9])
    k_cache, v_cache = torch.zeros(10, kv_heads, dim), torch.zeros(10, kv_heads, dim)
    cos, sin = rope.tables(positions, torch.float32)
    want = rotate(qkv[:, :heads + kv_heads], cos, sin)
    values = qkv[:, heads + kv_heads:].clone()
    rc = lib.rope_kv(qkv.data_ptr(), rows, heads, kv_heads, dim, rope.cos.data_ptr(),
                     rope.sin_signed.data_ptr(), positions.data_ptr(), k_cache.data_ptr(),
                     v_cache.data_ptr(), slots.data_ptr())
    assert rc == 0
    torch.testing.assert_close(qkv[:, :heads + kv_heads], want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k_cache[slots], want[:, heads:])
    assert torch.equal(v_cache[slots], values)
    assert not k_cache[[1, 2, 3, 4, 6, 7, 8]].any()


# Groups of 3, 1 and 5 query heads (the vector path takes up to 4 at a time); a head
# size that is no multiple of 8 takes the plain loops.
@pytest.mark.parametrize("heads,kv_heads,dim", [(12, 4, 16), (4, 4, 16), (10, 2, 64),
                                                (6, 2, 12)])
def test_paged_decode_attention_matches_sdpa(lib: NativeLibrary, heads: int,
                                             kv_heads: int, dim: int) -> None:
    """Sequences of different lengths on scattered blocks, each one query."""
    block_size, blocks = 4, 12
    k_cache = torch.randn(blocks * block_size, kv_heads, dim)
    v_cache = torch.randn(blocks * block_size, kv_heads, dim)
    tables = torch.tensor([[3, 0, 7, 1], [5, 2, 0, 0], [11, 0, 0, 0]])
    _attention_matches_sdpa(lib, torch.randn(3, heads, dim), k_cache, v_cache, tables,
                            block_size, [14, 5, 1], 0.25)


def _attention_matches_sdpa(lib: NativeLibrary, q: torch.Tensor, k_cache: torch.Tensor,
                            v_cache: torch.Tensor, tables: torch.Tensor, block_size: int,
                            lens: list[int], scale: float) -> None:
    """One query per sequence (q: [batch, heads, dim]) over its ``lens[b]`` positions of
    the paged cache, against SDPA over the same keys and values gathered."""
    batch, heads, dim = q.shape
    kv_heads = k_cache.shape[1]
    out = torch.empty(batch, heads, dim)
    lengths = torch.tensor(lens)
    rc = lib.paged_decode_attention(q.data_ptr(), batch, heads * dim, heads, kv_heads, dim,
                                    k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
                                    tables.shape[1], block_size, lengths.data_ptr(), scale,
                                    out.data_ptr())
    assert rc == 0
    for b, n in enumerate(lens):
        slots = torch.tensor([int(tables[b, p // block_size]) * block_size + p % block_size
                              for p in range(n)])
        want = F.scaled_dot_product_attention(
            q[b][None, :, None], k_cache[slots].transpose(0, 1)[None],
            v_cache[slots].transpose(0, 1)[None], scale=scale,
            enable_gqa=kv_heads != heads)[0, :, 0]
        torch.testing.assert_close(out[b], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (12, 4, 16), (6, 2, 12)])
def test_long_sequences_attend_in_chunks_as_sdpa_does(lib: NativeLibrary, heads: int,
                                                      kv_heads: int, dim: int) -> None:
    """Past 128 positions a query takes its keys in chunks of 128 merged by their
    maxima (decode.c, ATTEND_CHUNK): 700 positions (six chunks), 129 (a chunk of
    one), 128 (one walk) and 3, on scattered blocks."""
    block_size = 16
    lens = [700, 129, 128, 3]
    blocks_per = [(n + block_size - 1) // block_size for n in lens]
    order = torch.randperm(sum(blocks_per), generator=torch.Generator().manual_seed(0))
    width = max(blocks_per)
    tables = torch.zeros(len(lens), width, dtype=torch.long)
    taken = 0
    for b, n in enumerate(blocks_per):
        tables[b, :n] = order[taken:taken + n]
        taken += n
    k_cache = torch.randn(sum(blocks_per) * block_size, kv_heads, dim)
    v_cache = torch.randn(sum(blocks_per) * block_size, kv_heads, dim)
    _attention_matches_sdpa(lib, torch.randn(len(lens), heads, dim), k_cache, v_cache, tables,
                            block_size, lens, 0.2)
