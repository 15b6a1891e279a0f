"""Raw request data for a server that pre-processes: image files from a folder or text
lines from a file, sent as the BYTES input the server decodes (its metadata names it).

Requests are built once, ``batch_size`` items each, and sent in turn, so the server
decodes different images rather than one cached file.

A server that does not say which input it pre-processes (Triton's Python backend,
PyTriton) is sent the data in its one input when that input is BYTES, shaped as its
metadata states: ``[N]``, or ``[N, 1]`` for a batching Triton model's ``[-1, 1]``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from turboinfer.errors import InvalidInputError
from turboinfer.load.inputs import ModelInfo, TensorInfo

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".webp"})
# Distinct requests held at most: enough variety, bounded memory for a large folder.
MAX_REQUESTS = 256

Tensors = dict[str, np.ndarray]


def is_raw(path: Path) -> bool:
    """A folder (of images) or a text file, rather than an ``.npz`` of tensors."""
    return path.is_dir() or path.suffix.lower() != ".npz"


def raw_requests(path: Path, info: ModelInfo, batch_size: int) -> list[Tensors]:
    if path.is_dir():
        kind, items = "image", _images(path, batch_size)
    else:
        kind, items = "text", _lines(path, batch_size)
    spec = _raw_input(info, kind, path)
    # [N] by default; [N, 1] when the metadata gives the input a second axis of one.
    shape = (batch_size, 1) if spec.shape[1:] in ((1,), (-1,)) else (batch_size,)
    requests = []
    for start in range(0, len(items) - batch_size + 1, batch_size):
        batch = np.empty(batch_size, dtype=object)
        batch[:] = items[start:start + batch_size]
        requests.append({spec.name: batch.reshape(shape)})
    return requests


def _raw_input(info: ModelInfo, kind: str, path: Path) -> TensorInfo:
    spec = info.raw_input(kind) or info.raw_input("raw")  # gRPC cannot tell the kind
    if spec is None and len(info.inputs) == 1 and info.inputs[0].datatype == "BYTES":
        spec = info.inputs[0]  # a server that declares no pre-processing: its one input
    if spec is None:
        raise InvalidInputError(f"--input-data {path}: model {info.name!r} takes no raw "
                                f"{kind} input (the server declares no {kind} "
                                "pre-processing for it); pass an .npz of tensors")
    return spec


def _images(folder: Path, batch_size: int) -> list[bytes]:
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise InvalidInputError(f"--input-data {folder}: no image files "
                                f"({', '.join(sorted(IMAGE_SUFFIXES))})")
    files = files[: MAX_REQUESTS * batch_size]
    return _repeat([p.read_bytes() for p in files], batch_size)


def _lines(path: Path, batch_size: int) -> list[bytes]:
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"--input-data {path}: cannot read text lines: {exc}") from None
    lines = [line.strip().encode() for line in text.splitlines() if line.strip()]
    if not lines:
        raise InvalidInputError(f"--input-data {path}: no text lines")
    return _repeat(lines[: MAX_REQUESTS * batch_size], batch_size)


def _repeat(items: list[bytes], batch_size: int) -> list[bytes]:
    """At least one whole request's worth, repeating the items when there are fewer."""
    while len(items) < batch_size:
        items = items + items
    return items
