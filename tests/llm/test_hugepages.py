"""Weight tiles on huge pages (llm/backends/cpu/native/hugepages.py): the same numbers in memory
advised for 2 MiB pages, kernels that compute the same after their tiles move, and small
or unsuitable tensors left where they are."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn

from turboinfer.llm.backends.cpu.kernel_candidates import (
    NativeF32Kernel,
    NativeInt4Kernel,
    NativeInt8Kernel,
)
from turboinfer.llm.backends.cpu.native import native_status
from turboinfer.llm.backends.cpu.native.hugepages import (
    HUGE_PAGE,
    MIN_BYTES,
    _supported,
    on_huge_pages,
)

needs_madvise = pytest.mark.skipif(not _supported(), reason="no madvise(MADV_HUGEPAGE) here")


@needs_madvise
def test_a_large_tensor_is_copied_into_its_own_huge_page_memory() -> None:
    t = torch.randn(3, HUGE_PAGE // 8)          # 3 MiB of float32
    moved = on_huge_pages(t)
    assert moved is not t and moved.data_ptr() != t.data_ptr()
    assert torch.equal(moved, t) and moved.shape == t.shape and moved.dtype == t.dtype
    nxt = on_huge_pages(torch.ones(MIN_BYTES, dtype=torch.uint8))
    assert nxt.data_ptr() % 64 == 0             # each slice on a cache line
    del t
    moved.add_(1)                               # the slices do not overlap
    assert bool((nxt == 1).all())


def test_small_or_strided_tensors_stay() -> None:
    small = torch.randn(16)
    strided = torch.randn(512, 512).t()
    assert on_huge_pages(small) is small
    assert on_huge_pages(strided) is strided


@needs_madvise
@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_kernels_compute_the_same_after_their_tiles_move() -> None:
    lib = native_status().library
    if lib is None:
        pytest.skip(native_status().reason)
    torch.manual_seed(0)
    linear = nn.Linear(512, 300).requires_grad_(False)
    x = torch.randn(5, 512)
    for cls in (NativeF32Kernel, NativeInt8Kernel, NativeInt4Kernel):
        kernel = cls(lib, linear.weight, linear.bias)
        before, old = kernel(x), kernel.tiles.data_ptr()
        kernel.move_to_huge_pages()
        assert kernel.tiles.data_ptr() != old, cls.__name__
        assert torch.equal(kernel(x), before), cls.__name__
