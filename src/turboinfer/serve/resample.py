"""The image door's resize in C (``resample.c``): Pillow's BILINEAR resize of a box,
to the bit, written straight into the model's normalized planes.

Compiled on first use with the system C compiler into the cache folder (as the LLM
kernels are); where there is no compiler or the compile fails, ``resampler()`` is None
and the server resizes with Pillow. ctypes lets go of the GIL during the call, so the
decode pool's threads resize in parallel.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import PIL

from turboinfer.native_build import CACHE_ENV, compile_shared, native_folder

SOURCE = Path(__file__).with_name("resample.c")
# -ffp-contract=off: the normalization is a multiply then an add, as numpy does it; a
# fused multiply-add would round once and differ in the last bit.
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fPIC", "-shared")
DISABLE_ENV = "TURBOINFER_NATIVE_RESIZE"    # "0": resize with Pillow
# Pillow 13 runs the vertical pass first when the height shrinks by more than twice what
# the width does; earlier versions always run the horizontal pass first. The passes
# round in between, so the order shows in the last bit: follow the installed Pillow.
PILLOW_VERTICAL_FIRST = int(PIL.__version__.split(".")[0]) >= 13

_i32, _i64, _f32, _ptr = ctypes.c_int, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
_ARGS: list[Any] = [_ptr, _i32, _i32, _i64, _f32, _f32, _f32, _f32, _i32, _i32, _i32]


def vertical_first(width: int, height: int, out_width: int, out_height: int) -> bool:
    """Whether the installed Pillow resamples this resize vertically first."""
    shrink = height - out_height
    return PILLOW_VERTICAL_FIRST and shrink > 0 and shrink > 2 * (width - out_width)


class Resampler:
    """The loaded library."""

    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        self._pixels = lib.ti_resample_rgb_pixels
        self._pixels.argtypes, self._pixels.restype = [*_ARGS, _ptr], _i32
        self._planes = lib.ti_resample_rgb_planes
        self._planes.argtypes, self._planes.restype = [*_ARGS, _ptr, _ptr, _ptr], _i32

    def pixels(self, rgb: np.ndarray, box: tuple[float, float, float, float],
               size: tuple[int, int]) -> np.ndarray:
        """``Image.fromarray(rgb).resize(size, BILINEAR, box=box)`` as ``[h, w, 3]``."""
        src, args = self._args(rgb, box, size)
        out = np.empty((size[1], size[0], 3), np.uint8)
        self._check(self._pixels(src.ctypes.data, *args, out.ctypes.data))
        return out

    def planes(self, rgb: np.ndarray, box: tuple[float, float, float, float],
               scale: np.ndarray, bias: np.ndarray, out: np.ndarray) -> None:
        """The resize to ``out``'s ``[3, h, w]`` float32 planes, each channel c as
        ``pixel * scale[c] + bias[c]`` (numpy's multiply then add, to the bit)."""
        if (out.dtype != np.float32 or out.ndim != 3 or out.shape[0] != 3
                or not out.flags.c_contiguous):
            raise ValueError("out must be a C-contiguous float32 [3, h, w] array")
        scale = np.ascontiguousarray(scale, np.float32).reshape(3)
        bias = np.ascontiguousarray(bias, np.float32).reshape(3)
        src, args = self._args(rgb, box, (out.shape[2], out.shape[1]))
        self._check(self._planes(src.ctypes.data, *args, scale.ctypes.data, bias.ctypes.data,
                                 out.ctypes.data))

    @staticmethod
    def _args(rgb: np.ndarray, box: tuple[float, float, float, float],
              size: tuple[int, int]) -> tuple[np.ndarray, tuple]:
        if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
            raise ValueError(f"expected an [h, w, 3] uint8 image, got {rgb.dtype} "
                             f"{list(rgb.shape)}")
        src = rgb if rgb.strides[1:] == (3, 1) else np.ascontiguousarray(rgb)
        height, width = src.shape[:2]
        # As Pillow sees the box: C floats.
        x0, y0, x1, y1 = (float(np.float32(v)) for v in box)
        if not (0 <= x0 <= x1 <= width and 0 <= y0 <= y1 <= height):
            raise ValueError(f"box {box} is not within the {width}x{height} image")
        if size[0] < 1 or size[1] < 1:
            raise ValueError(f"size {size} must be positive")
        return src, (width, height, src.strides[0], x0, y0, x1, y1,
                     int(vertical_first(width, height, *size)), size[0], size[1])

    @staticmethod
    def _check(rc: int) -> None:
        if rc != 0:
            raise MemoryError("out of memory resizing an image")


_LOCK = threading.Lock()
_BUILT: dict[tuple[str, str], tuple[Resampler | None, str]] = {}


def resampler() -> Resampler | None:
    """This process's resampler (built once per compiler and cache folder); None where
    there is none (``resampler_status()`` says why)."""
    return resampler_status()[0]


def resampler_status() -> tuple[Resampler | None, str]:
    key = (os.environ.get("CC") or "cc", os.environ.get(CACHE_ENV, ""))
    if os.environ.get(DISABLE_ENV, "") == "0":
        return None, f"turned off ({DISABLE_ENV}=0)"
    with _LOCK:
        if key not in _BUILT:
            _BUILT[key] = _build(key[0])
        return _BUILT[key]


def _build(compiler: str) -> tuple[Resampler | None, str]:
    path, reason = compile_shared(compiler, (SOURCE,), FLAGS, native_folder(), "resample",
                                  what="the image resize")
    if path is None:
        return None, reason
    try:
        return Resampler(path), ""
    except (OSError, AttributeError) as exc:
        return None, f"loading {path.name} failed: {exc}"
