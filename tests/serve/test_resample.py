"""The image door's C resize against Pillow: the same pixels, to the bit, and the same
normalized floats as Pillow's resize followed by numpy's multiply and add."""

from __future__ import annotations

import asyncio
import io
import os
import platform
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from serve.prepost_models import photo
from turboinfer.native_build import compile_shared
from turboinfer.serve.images import ImageDecoder
from turboinfer.serve.prepost_config import ImagePreprocess
from turboinfer.serve.resample import (
    DISABLE_ENV,
    SOURCE,
    Resampler,
    resampler,
    resampler_status,
)

BILINEAR = Image.Resampling.BILINEAR


@pytest.fixture(scope="module")
def native() -> Resampler:
    found, reason = resampler_status()
    if found is None:
        pytest.skip(f"no native resize here: {reason}")
    return found


def pillow(rgb: np.ndarray, box: tuple[float, ...], size: tuple[int, int]) -> np.ndarray:
    return np.asarray(Image.fromarray(rgb).resize(size, BILINEAR, box=box))


def cases(seed: int, count: int) -> list[tuple[np.ndarray, tuple[float, ...], tuple[int, int]]]:
    """Random images, boxes and sizes: shrinking, enlarging, one axis kept, whole images,
    boxes touching the edges, tiny outputs, smooth and noisy pixels."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        w, h = (int(v) for v in rng.integers(1, 320, 2))
        rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        if i % 3 == 0:      # smooth: sums near the rounding edges of every pass
            rgb = np.ascontiguousarray(np.cumsum(rgb, axis=1, dtype=np.uint8))
        x0 = float(rng.uniform(0, w / 2)) if i % 4 else 0.0
        y0 = float(rng.uniform(0, h / 2)) if i % 4 else 0.0
        x1 = float(rng.uniform(x0 + 0.5, w)) if i % 5 else float(w)
        y1 = float(rng.uniform(y0 + 0.5, h)) if i % 5 else float(h)
        ow, oh = (int(v) for v in rng.integers(1, 260, 2))
        if i % 7 == 0:
            ow = w
        if i % 11 == 0:
            oh = h
        out.append((rgb, (min(x0, w), min(y0, h), min(x1, w), min(y1, h)), (ow, oh)))
    return out


def test_pixels_equal_pillows_bit_for_bit(native: Resampler) -> None:
    for rgb, box, size in cases(0, 400):
        assert np.array_equal(native.pixels(rgb, box, size), pillow(rgb, box, size)), \
            (rgb.shape, box, size)


def test_both_pass_orders_and_a_photo_crop(native: Resampler) -> None:
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
    # The door's own case: the centre crop of a 640x480 photo to 224x224; then a wide
    # strip shrunk in height far more than in width (Pillow 13 runs it vertical first).
    side = 224 / (256 / 480)
    box = ((640 - side) / 2, (480 - side) / 2, (640 + side) / 2, (480 + side) / 2)
    assert np.array_equal(native.pixels(rgb, box, (224, 224)), pillow(rgb, box, (224, 224)))
    box = (3.5, 0.0, 636.25, 480.0)
    assert np.array_equal(native.pixels(rgb, box, (600, 40)), pillow(rgb, box, (600, 40)))


def test_a_view_with_padded_rows(native: Resampler) -> None:
    rng = np.random.default_rng(2)
    wide = rng.integers(0, 256, (90, 200, 3), dtype=np.uint8)
    view = wide[5:80, 7:150]    # rows 600 bytes apart, 429 bytes each
    box = (2.25, 1.5, 140.0, 70.75)
    want = pillow(np.ascontiguousarray(view), box, (50, 33))
    assert np.array_equal(native.pixels(view, box, (50, 33)), want)


def test_planes_equal_pillow_then_numpy(native: Resampler) -> None:
    scale = np.array([1 / (255 * 0.229), 1 / (255 * 0.224), 1 / (255 * 0.225)], np.float32)
    bias = np.array([-0.485 / 0.229, -0.456 / 0.224, -0.406 / 0.225], np.float32)
    for rgb, box, size in cases(3, 60):
        want = np.empty((3, size[1], size[0]), np.float32)
        np.multiply(pillow(rgb, box, size).transpose(2, 0, 1), scale.reshape(3, 1, 1), out=want)
        np.add(want, bias.reshape(3, 1, 1), out=want)
        got = np.empty_like(want)
        native.planes(rgb, box, scale, bias, got)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_bad_arguments_are_refused(native: Resampler) -> None:
    rgb = np.zeros((10, 12, 3), np.uint8)
    with pytest.raises(ValueError, match="not within"):
        native.pixels(rgb, (0.0, 0.0, 12.5, 10.0), (4, 4))
    with pytest.raises(ValueError, match="must be positive"):
        native.pixels(rgb, (0.0, 0.0, 12.0, 10.0), (0, 4))
    with pytest.raises(ValueError, match="uint8 image"):
        native.pixels(rgb[..., :2], (0.0, 0.0, 12.0, 10.0), (4, 4))
    with pytest.raises(ValueError, match="float32"):
        native.planes(rgb, (0.0, 0.0, 12.0, 10.0), np.ones(3, np.float32),
                      np.zeros(3, np.float32), np.empty((3, 4, 4), np.float64))


def jpeg(image: Image.Image, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", **options)
    return buffer.getvalue()


def test_the_door_gives_the_same_tensor_with_and_without_it(
        native: Resampler, monkeypatch: pytest.MonkeyPatch) -> None:
    """The C resize (and the JPEGs simplejpeg decodes) against Pillow's decode and
    resize and numpy's normalization: grey, CMYK, progressive and 4:4:4 JPEGs, ones
    decoded at 1/2, 1/4 and 1/8 scale, PNG and WebP."""
    settings = ImagePreprocess(kind="image", resize=64, crop=56)
    rgb = Image.open(io.BytesIO(photo(1200, 900, seed=6)))
    files = np.empty(10, dtype=object)
    files[:] = [photo(200, 150, seed=1), photo(150, 200, seed=2, fmt="PNG"),
                photo(96, 64, seed=3, fmt="WEBP"), photo(640, 480, seed=4),
                jpeg(rgb), jpeg(rgb.resize((300, 260))), jpeg(rgb.convert("L")),
                jpeg(rgb.convert("CMYK")), jpeg(rgb, progressive=True),
                jpeg(rgb.resize((170, 130)), subsampling=0)]

    def run() -> np.ndarray:
        with ThreadPoolExecutor(2) as pool:
            decoder = ImageDecoder(settings, np.dtype(np.float32), pool)
            return asyncio.run(decoder.decode("image", files))

    with_native = run()
    monkeypatch.setenv(DISABLE_ENV, "0")
    assert resampler() is None
    without = run()
    assert np.array_equal(with_native.view(np.uint32), without.view(np.uint32))


def test_without_a_compiler_the_door_resizes_with_pillow(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "no-such-compiler-anywhere")
    found, reason = resampler_status()
    assert found is None and "no C compiler" in reason
    files = np.empty(1, dtype=object)
    files[:] = [photo(120, 90, seed=5)]
    with ThreadPoolExecutor(1) as pool:
        decoder = ImageDecoder(ImagePreprocess(kind="image", resize=64, crop=56),
                               np.dtype(np.float32), pool)
        tensor = asyncio.run(decoder.decode("image", files))
    assert tensor.shape == (1, 3, 56, 56) and np.isfinite(tensor).all()


def test_jpegs_decode_to_pillows_pixels_or_are_left_to_pillow() -> None:
    """RGB and grey JPEGs at every DCT scale; a file simplejpeg refuses is Pillow's.
    (CMYK JPEGs, which simplejpeg converts its own way, never reach it: the door's
    tensor test covers one.)"""
    pytest.importorskip("simplejpeg")
    from turboinfer.serve.images import _decode_jpeg

    rgb = Image.open(io.BytesIO(photo(1200, 900, seed=7)))
    for image, scale in ((rgb, 1), (rgb, 4), (rgb.convert("L"), 2), (rgb, 8)):
        raw = jpeg(image)
        want = Image.open(io.BytesIO(raw))
        width, height = -(-1200 // scale), -(-900 // scale)     # libjpeg rounds up
        want.draft("RGB", (1200 // scale, 900 // scale))
        pixels = np.asarray(want.convert("RGB"))
        assert pixels.shape == (height, width, 3)
        got = _decode_jpeg(raw, width, height, scale)
        assert got is not None and np.array_equal(got, pixels)
    assert _decode_jpeg(jpeg(rgb)[:5000], 1200, 900, 1) is None     # cut short


@pytest.mark.parametrize("march", ["x86-64", "x86-64-v2", "haswell"])
def test_every_build_gives_pillows_pixels(march: str, tmp_path: Path) -> None:
    """The plain C loop (x86-64), the SSE4.1 pixel (x86-64-v2, haswell: AVX2 without
    AVX-512) and, on this machine's own build above, the AVX-512 VBMI groups: each
    build's pixels are Pillow's. Only where the compiler and the CPU take the flags."""
    if platform.machine() != "x86_64":
        pytest.skip("x86-64 builds")
    flags = ("-O3", f"-march={march}", "-ffp-contract=off", "-fPIC", "-shared")
    path, reason = compile_shared(os.environ.get("CC") or "cc", (SOURCE,), flags, tmp_path,
                                  "resample")
    if path is None:
        pytest.skip(reason)
    try:
        build = Resampler(path)
        for rgb, box, size in cases(4, 120):
            assert np.array_equal(build.pixels(rgb, box, size), pillow(rgb, box, size)), \
                (march, rgb.shape, box, size)
    except OSError as exc:      # a build for an ISA this CPU lacks
        pytest.skip(f"{march} build does not load here: {exc}")
