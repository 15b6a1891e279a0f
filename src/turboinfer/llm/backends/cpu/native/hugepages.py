"""Weight tiles on 2 MiB pages (Linux transparent huge pages, asked for with madvise).

A decode step streams every weight once. With 4 KiB pages a tile of a few KiB is a new
page: a TLB miss (a two-level page walk inside a virtual machine), and the hardware
prefetcher, which does not cross a page, starts over. On the 2-core AMD EPYC guest the
demo target's 25 fp32 products, laid out the same way, ran 1.08-1.09x faster at one row
from 2 MiB pages than from 4 KiB ones with one copy of the model (partly kept in L3),
1.25-1.30x with three copies (from memory), 1.05-1.35x at 4-8 rows
(benchmarks/llm/native_f32_pages.json); a whole native step, other work included, ran
1.03x on the demo target and 1.02x (fp32) and 1.09x (int8) on the 110M model. Where the
system gives huge pages only on request (``madvise`` in
/sys/kernel/mm/transparent_hugepage/enabled, the usual default), nothing else gets them.

The tiles are carved out of anonymous mappings of at least ``CHUNK_BYTES``, each
advised MADV_HUGEPAGE from its first 2 MiB boundary; a slice is a tensor over the
mapping, which lives while any of its slices does. Where madvise or huge pages are not
available (another OS, THP "never"), the tensor stays where it is: huge pages change
speed only.
"""

from __future__ import annotations

import ctypes
import mmap
import threading

import torch

HUGE_PAGE = 2 << 20
CHUNK_BYTES = 32 << 20        # a mapping per this much; the last one's rest is unused
MIN_BYTES = 64 << 10          # smaller tensors are left alone: they gain no pages
ALIGN = 64                    # each slice starts on a cache line


def _supported() -> bool:
    return hasattr(mmap, "MADV_HUGEPAGE") and hasattr(mmap.mmap, "madvise")


class _Arena:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._map: mmap.mmap | None = None
        self._next = self._end = 0

    def take(self, nbytes: int) -> torch.Tensor:
        """``nbytes`` of huge-page-advised memory as a uint8 tensor."""
        with self._lock:
            if self._map is None or self._next + nbytes > self._end:
                self._new_map(nbytes)
            assert self._map is not None
            at = self._next
            self._next = -(-(at + nbytes) // ALIGN) * ALIGN
            return torch.frombuffer(self._map, dtype=torch.uint8, count=nbytes, offset=at)

    def _new_map(self, nbytes: int) -> None:
        size = -(-max(nbytes, CHUNK_BYTES) // HUGE_PAGE) * HUGE_PAGE + HUGE_PAGE
        # Private: a shared anonymous mapping is shmem, which THP leaves alone by default.
        mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        address = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
        start = -address % HUGE_PAGE       # the first 2 MiB boundary inside the mapping
        mapping.madvise(mmap.MADV_HUGEPAGE, start, size - start)
        self._map, self._next, self._end = mapping, start, size


_ARENA = _Arena()


def on_huge_pages(t: torch.Tensor) -> torch.Tensor:
    """``t`` (contiguous) copied onto memory advised for huge pages, or ``t`` itself where
    that is not possible or not worth it (small, not on the CPU)."""
    nbytes = t.numel() * t.element_size()
    if not _supported() or nbytes < MIN_BYTES or t.device.type != "cpu" or not t.is_contiguous():
        return t
    try:
        raw = _ARENA.take(nbytes)
    except (OSError, ValueError):
        return t
    out = raw.view(t.dtype).view(t.shape)
    out.copy_(t)
    return out
