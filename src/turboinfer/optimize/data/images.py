"""A folder of images as calibration inputs for a vision model: decoded as RGB, shorter
side resized, centre-cropped, scaled to [0, 1], normalized per channel and laid out NCHW,
the preprocessing most ImageNet-style models were trained with, by the server's own image
decoder (``serve/images.py``), so that calibration sees the tensors serving makes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from turboinfer.engines.base import TensorSpec
from turboinfer.errors import ConfigError, InvalidInputError
from turboinfer.optimize.settings import ImagePrep
from turboinfer.serve.images import ImageDecoder
from turboinfer.serve.prepost_config import ImagePreprocess

SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".webp", ".gif", ".tif", ".tiff"})


def image_input(specs: list[TensorSpec]) -> TensorSpec:
    """The model's one image input: a float tensor of rank 4 with 3 channels (NCHW)."""
    images = [s for s in specs if len(s.shape) == 4 and np.issubdtype(s.dtype, np.floating)
              and (s.shape[1] == 3 or not isinstance(s.shape[1], int))]
    if len(specs) != 1 or len(images) != 1:
        names = ", ".join(f"{s.name} {list(s.shape)}" for s in specs)
        raise InvalidInputError(f"--calib-images needs a model with one NCHW RGB float input; "
                                f"this model has {names}: pass --calib-data instead")
    return images[0]


def crop_size(spec: TensorSpec, prep: ImagePrep) -> int:
    """``--crop``, else the model's fixed square height/width, else ``--resize``."""
    if prep.crop is not None:
        return prep.crop
    height, width = spec.shape[2], spec.shape[3]
    if isinstance(height, int) and height > 0 and height == width:
        return min(height, prep.resize)
    return prep.resize


def load_images(folder: Path, specs: list[TensorSpec], prep: ImagePrep,
                limit: int) -> dict[str, np.ndarray]:
    """Up to ``limit`` images of ``folder`` (sorted by name), as the model's input."""
    spec = image_input(specs)
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in SUFFIXES)[:limit]
    if not files:
        raise ConfigError(f"--calib-images {folder}: no image files "
                          f"({', '.join(sorted(SUFFIXES))})")
    size = crop_size(spec, prep)
    decoder = ImageDecoder(ImagePreprocess(kind="image", resize=prep.resize, crop=size,
                                           mean=prep.mean, std=prep.std),
                           np.dtype(np.float32), formats=None)
    batch = np.empty((len(files), 3, size, size), np.float32)
    for file, out in zip(files, batch, strict=True):
        try:
            decoder.fill(str(file), file.read_bytes(), out)
        except (OSError, InvalidInputError) as exc:
            raise ConfigError(f"--calib-images: cannot decode {file}: {exc}") from None
    return {spec.name: batch.astype(spec.dtype)}
