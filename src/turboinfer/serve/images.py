"""Image pre-processing in the server: encoded files (JPEG, PNG, WebP) in, the model's
normalized NCHW tensor out.

Decoding runs on a thread pool: Pillow's and simplejpeg's decoders and the C resize
release the GIL, and so do numpy's ufuncs, so the pool uses every core while the event
loop keeps answering. An image's size is read from its header and checked before a
pixel is decoded, so a 20,000 x 20,000 file costs a header read, not 1.2 GB. A JPEG is
decoded straight at a reduced scale when it is much larger than needed (``Image.draft``:
libjpeg's DCT scaling), and only the centre crop is resampled (``resize(box=...)``). Where
a C compiler is at hand the crop is resampled in C (``serve/resample.py``: Pillow's pixels
to the bit, written straight into the normalized planes) and JPEGs are decoded by
simplejpeg into numpy (Pillow's pixels again): 1.3 ms a 640x480 photo where Pillow's
decode, resize and numpy's normalization took 2.3 on an AMD Zen 4
(benchmarks/serving_server/resize.py).
"""

from __future__ import annotations

import asyncio
import io
import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from PIL import Image

try:  # libjpeg-turbo straight into numpy; Pillow decodes where it is absent
    import simplejpeg
except ImportError:  # pragma: no cover - a declared dependency; platforms without wheels
    simplejpeg = None

from turboinfer.errors import InvalidInputError
from turboinfer.serve.datatypes import as_bytes
from turboinfer.serve.prepost_config import ImagePreprocess
from turboinfer.serve.resample import Resampler, resampler

FORMATS = ("JPEG", "PNG", "WEBP")


class ImageDecoder:
    """One image input of a model: ``decode`` turns a BYTES array of files into the
    float tensor ``[N, 3, crop, crop]`` on ``pool`` (None: the event loop's default
    executor); ``fill`` does one file in the calling thread. ``formats``: the Pillow
    formats accepted (None: every one Pillow reads, as for calibration folders)."""

    def __init__(self, settings: ImagePreprocess, dtype: np.dtype,
                 pool: ThreadPoolExecutor | None = None, *,
                 formats: tuple[str, ...] | None = FORMATS) -> None:
        self.settings = settings
        self.dtype = dtype
        self.pool = pool
        self.formats = formats
        mean = np.asarray(settings.mean, np.float32).reshape(3, 1, 1)
        std = np.asarray(settings.std, np.float32).reshape(3, 1, 1)
        # (pixel / 255 - mean) / std as one multiply and one add, written in place.
        self._scale = (1.0 / (255.0 * std)).astype(np.float32)
        self._bias = (-mean / std).astype(np.float32)
        self._resampler: Resampler | None = resampler()

    async def decode(self, name: str, files: np.ndarray) -> np.ndarray:
        """``files``: BYTES ``[N]`` or ``[N, 1]``, one encoded image each."""
        if files.ndim == 2 and files.shape[1] == 1:
            files = files[:, 0]
        if files.ndim != 1 or files.shape[0] < 1:
            raise InvalidInputError(f"input {name!r}: expected shape [N] or [N, 1] of "
                                    f"encoded images, got {list(files.shape)}")
        crop = self.settings.crop
        out = np.empty((files.shape[0], 3, crop, crop), np.float32)
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(self.pool, self._decode_one, name, i,
                                                    files[i], out[i])
                               for i in range(files.shape[0])))
        return out if self.dtype == np.float32 else out.astype(self.dtype)

    def _decode_one(self, name: str, index: int, data: object, out: np.ndarray) -> None:
        where = f"input {name!r}" + (f" element {index}" if index else "")
        try:
            raw = as_bytes(data)
        except TypeError:
            raise InvalidInputError(f"{where}: not a BYTES element") from None
        if not raw:
            raise InvalidInputError(f"{where}: the image is empty (0 bytes)")
        self.fill(where, raw, out)

    def fill(self, where: str, raw: bytes, out: np.ndarray) -> None:
        """Decode, resize and normalize one image into ``out`` ([3, crop, crop] float32);
        InvalidInputError naming ``where`` for anything that is not a usable image."""
        settings = self.settings
        try:
            image = Image.open(io.BytesIO(raw), formats=self.formats)
        except Image.DecompressionBombError:
            raise InvalidInputError(f"{where}: the image is larger than the "
                                    f"{settings.max_pixels} pixels allowed") from None
        except Exception as exc:  # any plugin's error: the bytes are not a usable image
            kinds = ("a JPEG, PNG or WebP image" if self.formats == FORMATS
                     else "an image Pillow reads")
            raise InvalidInputError(f"{where}: not {kinds} ({_brief(exc)})") from None
        with image:
            width, height = image.size
            if width * height > settings.max_pixels:
                raise InvalidInputError(f"{where}: the image is {width}x{height}, over the "
                                        f"{settings.max_pixels} pixels allowed")
            try:
                self._resized(image, raw, width, height, out)
            except Exception as exc:
                raise InvalidInputError(f"{where}: cannot decode the {image.format} image "
                                        f"({_brief(exc)})") from None

    def _resized(self, image: Image.Image, raw: bytes, width: int, height: int,
                 out: np.ndarray) -> None:
        settings = self.settings
        scale = settings.resize / min(width, height)
        jpeg_scale = 0      # the JPEG's DCT scaling (1, 2, 4, 8); 0: not a JPEG
        if image.format == "JPEG":
            # Decode at 1/2, 1/4 or 1/8 scale when the result stays at least the size
            # the resize needs: far fewer pixels to decode for large photos. Only sets
            # the scale and size: nothing is decoded yet.
            drafted = image.draft("RGB", (math.ceil(width * scale), math.ceil(height * scale)))
            jpeg_scale = round(width / drafted[1][2]) if drafted else 1
        # The crop in source pixels (draft may have shrunk the source): resample only it.
        decoded_w, decoded_h = image.size
        side = settings.crop / scale * (decoded_w / width)
        left = (decoded_w - side) / 2
        top = (decoded_h - side) / 2
        if side > min(decoded_w, decoded_h):  # crop larger than the resized image
            side = min(decoded_w, decoded_h)
            left, top = (decoded_w - side) / 2, (decoded_h - side) / 2
        box = (left, top, left + side, top + side)
        if self._resampler is not None:
            rgb = None
            if jpeg_scale and image.mode in ("RGB", "L"):
                rgb = _decode_jpeg(raw, decoded_w, decoded_h, jpeg_scale)
            if rgb is None:
                rgb = np.asarray(image if image.mode == "RGB" else image.convert("RGB"))
            self._resampler.planes(rgb, box, self._scale, self._bias, out)
            return
        # Already RGB (most JPEGs): no copy through convert.
        rgb_image = image if image.mode == "RGB" else image.convert("RGB")
        crop = settings.crop
        pixels = np.asarray(rgb_image.resize((crop, crop), Image.Resampling.BILINEAR, box=box))
        np.multiply(pixels.transpose(2, 0, 1), self._scale, out=out)
        np.add(out, self._bias, out=out)


def _decode_jpeg(raw: bytes, width: int, height: int, scale: int) -> np.ndarray | None:
    """The JPEG's RGB pixels at 1/``scale`` (``width`` x ``height``) by simplejpeg:
    libjpeg-turbo straight into a numpy array, the same library and settings Pillow
    decodes with (the same pixels, a grey image's channel repeated as Pillow's convert
    does), without Pillow's copy out of its own image memory: 0.94 against 1.4-1.5 ms
    for a 640x480 photo on an AMD Zen 4. None where simplejpeg is not installed or does
    not take the file (Pillow then decodes it, and words any error)."""
    if simplejpeg is None:
        return None
    try:
        rgb = simplejpeg.decode_jpeg(raw, colorspace="RGB", min_width=width,
                                     min_height=height, min_factor=scale)
    except Exception:  # any refusal: Pillow's decoder has the last word
        return None
    return rgb if rgb.shape == (height, width, 3) else None


def _brief(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if len(text) <= 120 else text[:117] + "..."
