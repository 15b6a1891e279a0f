"""Compile ``kernels.c``, ``amx.c``, ``decode.c`` and ``threads.c`` into one library once per
source, compiler, flags and CPU, and load it.

The shared library is kept in the cache folder (``$TURBOINFER_CACHE_DIR``, else the user
cache folder) under a name that hashes everything its machine code depends on: the
source, the flags, the compiler's ``--version`` and the CPU's feature flags
(``-march=native`` compiles for this CPU). It is written under a unique temporary name
and renamed into place, so processes compiling at the same time never load half a file.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from turboinfer.native_build import CACHE_ENV, compile_shared, native_folder

SOURCES = tuple(Path(__file__).with_name(name) for name in ("kernels.c", "amx.c", "decode.c",
                                                             "threads.c"))
HEADERS = (Path(__file__).with_name("native.h"),)   # part of the sources' hash
FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-pthread")
DISABLE_ENV = "TURBOINFER_NATIVE_KERNELS"   # "0": leave the native kernels out
AMX_ENV = "TURBOINFER_AMX"                  # "0": leave the AMX kernel out (A/B timing)
# The kernel families with their own prefetch distance, in native.h's TI_PREFETCH_* order
# (f32: the fp32 kernel at several rows: below ``f32_wide_from`` its 256-bit tiles,
# fetching the next tile or not (0); from it its 512-bit passes and how far ahead their
# first fetches).
PREFETCH_KINDS = ("int8", "int4", "amx", "q8", "f32")

_i64, _ptr, _f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float


class NativeLibrary:
    """The loaded kernels, their ctypes signatures set once (calls pass plain ints)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._cdll = ctypes.CDLL(str(path))
        self.simd_level = int(self._cdll.ti_simd_level())
        # The f32 setting from which the fp32 kernel's several-row passes run on 512-bit
        # registers (AVX-512); 0: this build has none.
        self._cdll.ti_f32_wide_from.restype = _i64
        self.f32_wide_from = int(self._cdll.ti_f32_wide_from())
        self.f32_wide = self.f32_wide_from > 0
        self._threads = 1
        # The linear layers split across the worker threads (threads.c; one thread, the
        # default: kernels.c's kernel called directly). (x, rows, k, tiles, scales, bias,
        # n, kp, y)
        self.int8_linear = self._fn("ti_par_int8_linear",
                                    [_ptr, _i64, _i64, _ptr, _ptr, _ptr, _i64, _i64, _ptr])
        # amx.c, its own weight layout (layout.amx_int8_tiles); where AMX runs only.
        self.has_amx = (bool(self._cdll.ti_amx_available())
                        and os.environ.get(AMX_ENV, "") != "0")
        self.amx_int8_linear = self._fn("ti_par_amx_int8_linear",
                                        [_ptr, _i64, _i64, _ptr, _ptr, _ptr, _i64, _i64, _ptr])
        # (x, rows, k, tiles, bias, n, y)
        self.int4_linear = self._fn("ti_par_int4_linear",
                                    [_ptr, _i64, _i64, _ptr, _ptr, _i64, _ptr])
        self.q8_linear = self._fn("ti_par_q8_linear",
                                  [_ptr, _i64, _i64, _ptr, _ptr, _i64, _ptr])
        # (x, rows, k, tiles, bias, n, kp, y)
        self.f32_linear = self._fn("ti_par_f32_linear",
                                   [_ptr, _i64, _i64, _ptr, _ptr, _i64, _i64, _ptr])
        # (x, rows, k, 16-bit tiles, bias, n, kp, y): fp32 arithmetic on fp16 / bf16 weights
        self.f16_linear = self._fn("ti_par_f16_linear",
                                   [_ptr, _i64, _i64, _ptr, _ptr, _i64, _i64, _ptr])
        self.bf16_linear = self._fn("ti_par_bf16_linear",
                                    [_ptr, _i64, _i64, _ptr, _ptr, _i64, _i64, _ptr])
        self._set_threads = self._fn("ti_set_threads", [ctypes.c_int])
        self._set_solo = self._fn("ti_set_solo", [ctypes.c_int])
        self._solo = False
        self._set_prefetch = self._fn("ti_set_prefetch", [_i64], _i64)
        self._set_prefetch_for = self._fn("ti_set_prefetch_for", [ctypes.c_int, _i64], _i64)
        # decode.c. (x, rows, n, w, eps, y)
        self.rms_norm = self._fn("ti_rms_norm", [_ptr, _i64, _i64, _ptr, _f32, _ptr], None)
        # (gate_up, rows, inner, y)
        self.silu_mul = self._fn("ti_silu_mul", [_ptr, _i64, _i64, _ptr], None)
        # (qkv, rows, heads, kv_heads, head_dim, cos, sin_signed, positions, k_cache,
        #  v_cache, slots)
        self.rope_kv = self._fn("ti_rope_kv", [_ptr, _i64, _i64, _i64, _i64, _ptr, _ptr, _ptr,
                                               _ptr, _ptr, _ptr])
        # (q, batch, q_stride, heads, kv_heads, head_dim, k_cache, v_cache, tables,
        #  max_blocks, block_size, lens, scale, out)
        self.paged_decode_attention = self._fn(
            "ti_par_paged_decode_attention",
            [_ptr, _i64, _i64, _i64, _i64, _i64, _ptr, _ptr, _ptr, _i64, _i64, _ptr, _f32, _ptr])
        # (layers, num_layers, hidden, heads, kv_heads, head_dim, inner, eps, scale,
        #  final_norm, cos, sin_signed, table, block_size, start, rows, x)
        self.decode_step = self._fn(
            "ti_decode_step",
            [_ptr, _i64, _i64, _i64, _i64, _i64, _i64, _f32, _f32, _ptr, _ptr, _ptr, _ptr, _i64,
             _i64, _i64, _ptr])
        # (layers, num_layers, hidden, heads, kv_heads, head_dim, inner, eps, scale,
        #  final_norm, cos, sin_signed, table, block_size, embed, lm_head, feed, n_feed,
        #  start, steps, out)
        self.greedy_steps = self._fn(
            "ti_greedy_steps",
            [_ptr, _i64, _i64, _i64, _i64, _i64, _i64, _f32, _f32, _ptr, _ptr, _ptr, _ptr, _i64,
             _ptr, _ptr, _ptr, _i64, _i64, _i64, _ptr])
        # (layers, num_layers, hidden, heads, kv_heads, head_dim, inner, eps, scale,
        #  final_norm, cos, sin_signed, table, block_size, lm_head, embed, ids, start,
        #  rows, x, logits, out)
        self.greedy_rows = self._fn(
            "ti_greedy_rows",
            [_ptr, _i64, _i64, _i64, _i64, _i64, _i64, _f32, _f32, _ptr, _ptr, _ptr, _ptr, _i64,
             _ptr, _ptr, _ptr, _i64, _i64, _ptr, _ptr, _ptr])

        # (layers, num_layers, hidden, heads, kv_heads, head_dim, inner, eps, scale,
        #  final_norm, cos, sin_signed, positions, slots, lens, tables, max_blocks,
        #  block_size, rows, x)
        self.batch_decode_step = self._fn(
            "ti_batch_decode_step",
            [_ptr, _i64, _i64, _i64, _i64, _i64, _i64, _f32, _f32, _ptr, _ptr, _ptr, _ptr, _ptr,
             _ptr, _ptr, _i64, _i64, _i64, _ptr])

        # (logits, stride, vocab, rows, n, masks, words)
        self.apply_token_mask = self._fn(
            "ti_apply_token_mask", [_ptr, _i64, _i64, _ptr, _i64, _ptr, _i64], None)

    def set_threads(self, threads: int) -> int:
        """Threads the kernels split across (the caller's included); returns the count in
        force. Not while a kernel runs."""
        if threads != self._threads:
            self._threads = int(self._set_threads(threads))
        return self._threads

    @property
    def solo(self) -> bool:
        return self._solo

    def set_solo(self, solo: bool) -> None:
        """Solo: every kernel runs on its caller's thread alone and the workers sleep (for
        steps run by torch's operators, whose own threads want the cores); else the
        kernels split across the workers. Cheap to call every step: the library is
        called only when the setting changes."""
        if solo != self._solo:
            self._set_solo(int(solo))
            self._solo = solo

    def set_prefetch(self, distance: int, kind: str | None = None) -> int:
        """How many bytes ahead the kernels of ``kind`` (one of ``PREFETCH_KINDS``; None:
        all) prefetch their weight streams; returns the distance in force (the int8
        kernel's for all). Out of range (0 to 1 MiB): unchanged. Not while a kernel runs."""
        if kind is None:
            return int(self._set_prefetch(distance))
        return int(self._set_prefetch_for(PREFETCH_KINDS.index(kind), distance))

    def _fn(self, name: str, argtypes: list[type],
            restype: type | None = ctypes.c_int) -> Callable[..., int]:
        fn = getattr(self._cdll, name)
        fn.argtypes, fn.restype = argtypes, restype
        return fn

    @property
    def isa(self) -> str:
        base = "avx2" if self.simd_level == 2 else "plain C"
        if self.f32_wide:
            base += " + avx-512 fp32 rows"
        return f"{base} + amx-int8" if self.has_amx else base


@dataclass(frozen=True)
class NativeStatus:
    library: NativeLibrary | None
    reason: str = ""          # why there is no library; empty when there is


def build_library(compiler: str, flags: tuple[str, ...] = FLAGS, *,
                  folder: Path | None = None) -> NativeStatus:
    """Compile (or find compiled) the sources with ``compiler`` and ``flags``; load them."""
    final, reason = compile_shared(compiler, SOURCES, flags, folder or native_folder(), "kernels",
                                   headers=HEADERS, what="the native kernels")
    if final is None:
        return NativeStatus(None, reason)
    try:
        return NativeStatus(NativeLibrary(final))
    except (OSError, AttributeError) as exc:
        return NativeStatus(None, f"loading {final.name} failed: {exc}")


_STATUS: dict[tuple[str, str, str], NativeStatus] = {}


def native_status() -> NativeStatus:
    """The library for this process's ``$CC`` (``cc`` when unset), built once per
    compiler; ``$TURBOINFER_NATIVE_KERNELS=0`` leaves it out."""
    key = (os.environ.get("CC") or "cc", os.environ.get(DISABLE_ENV, ""),
           os.environ.get(CACHE_ENV, ""))
    if key not in _STATUS:
        if key[1] == "0":
            _STATUS[key] = NativeStatus(None, f"turned off ({DISABLE_ENV}=0)")
        else:
            _STATUS[key] = build_library(key[0])
    return _STATUS[key]
