"""Model metadata as the Open Inference Protocol states it, and the tensors to send.

Inputs come from the server's own description of the model (random data of the right
shape and datatype) or from the user's ``.npz`` file, checked against that description
before the first request so a wrong file fails with a message instead of a stream of 400s.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from turboinfer.errors import InvalidInputError
from turboinfer.shapes import DeclaredInput, concrete_shape, resolve_shapes

# OIP datatype name -> numpy dtype. BYTES travels as object arrays of bytes.
DATATYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}

# The length of a random BYTES element; long enough to look like a short sentence.
RANDOM_BYTES_LENGTH = 16


@dataclass(frozen=True)
class TensorInfo:
    """One input or output as metadata states it; ``-1`` marks a dynamic axis."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    # A raw input the server pre-processes ("image", "text"), filling tensor inputs;
    # "" for the model's own tensors.
    preprocess: str = ""

    @property
    def dtype(self) -> np.dtype[Any]:
        return DATATYPES[self.datatype]


@dataclass(frozen=True)
class ModelInfo:
    """What the server says about a model (``GET /v2/models/{m}`` and its config)."""

    name: str
    version: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    # Triton's config ``max_batch_size``; 0 when batching is off or the server won't say.
    max_batch_size: int = 0

    @property
    def tensor_inputs(self) -> tuple[TensorInfo, ...]:
        """The model's own inputs, without the raw ones the server pre-processes."""
        return tuple(spec for spec in self.inputs if not spec.preprocess)

    def raw_input(self, kind: str) -> TensorInfo | None:
        """The raw input that takes ``kind`` ("image", "text"), if the server has one."""
        return next((spec for spec in self.inputs if spec.preprocess == kind), None)


def parse_metadata(doc: Mapping[str, Any], *, version: str = "") -> ModelInfo:
    """A :class:`ModelInfo` from the OIP metadata JSON; unknown datatypes are rejected."""
    try:
        inputs = tuple(_tensor_info(t) for t in doc.get("inputs", ()))
        outputs = tuple(_tensor_info(t) for t in doc.get("outputs", ()))
        versions = doc.get("versions") or [""]
        return ModelInfo(
            name=str(doc["name"]),
            version=version or str(versions[-1]),
            inputs=inputs,
            outputs=outputs,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInputError(f"the server's model metadata is not OIP v2: {exc}") from None


def _tensor_info(doc: Mapping[str, Any]) -> TensorInfo:
    datatype = str(doc["datatype"]).upper()
    if datatype not in DATATYPES:
        raise ValueError(f"input {doc['name']!r} has unknown datatype {datatype!r}")
    params = doc.get("parameters") or {}
    kind = params.get("preprocess", "") if isinstance(params, Mapping) else ""
    return TensorInfo(str(doc["name"]), datatype, tuple(int(d) for d in doc["shape"]),
                      str(kind))


def random_inputs(
    info: ModelInfo,
    *,
    batch_size: int = 1,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Seeded random tensors for every input; a leading ``-1`` takes ``batch_size``.

    ``shapes`` gives an input's shape without its batch axis (:mod:`turboinfer.shapes`);
    other dynamic axes need one, because no guess is safe for, say, a sequence length.
    Names, axis counts and sizes are checked against the metadata first.
    """
    specs = info.tensor_inputs
    declared = [declared_input(spec) for spec in specs]
    given = resolve_shapes((shapes or {}).items(), declared, model=info.name)
    rng = np.random.default_rng(seed)
    return {spec.name: _random_tensor(rng, spec, concrete_shape(d, batch_size, given))
            for spec, d in zip(specs, declared, strict=True)}


def declared_input(spec: TensorInfo) -> DeclaredInput:
    """The metadata's ``-1`` is a dynamic axis; a leading one is the batch axis."""
    return DeclaredInput(spec.name, tuple(d if d >= 0 else None for d in spec.shape))


def _random_tensor(rng: np.random.Generator, spec: TensorInfo,
                   shape: tuple[int, ...]) -> np.ndarray:
    dtype = spec.dtype
    if spec.datatype == "BYTES":
        letters = rng.integers(97, 123, size=(*shape, RANDOM_BYTES_LENGTH), dtype=np.uint8)
        flat = [row.tobytes() for row in letters.reshape(-1, RANDOM_BYTES_LENGTH)]
        return np.array(flat, dtype=object).reshape(shape)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        # 0/1 are valid as token ids, indices, masks and segment ids alike.
        return rng.integers(0, 2, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def load_inputs(path: Path, info: ModelInfo) -> dict[str, np.ndarray]:
    """Tensors from an ``.npz`` file keyed by input name, checked against the metadata."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise InvalidInputError(f"cannot read input file {path}: {exc}") from None
    check_inputs(arrays, info, source=str(path))
    return {spec.name: arrays[spec.name].astype(spec.dtype, copy=False)
            for spec in info.tensor_inputs}


def check_inputs(arrays: Mapping[str, np.ndarray], info: ModelInfo, *, source: str) -> None:
    """Raise :class:`InvalidInputError` naming the first input that does not fit."""
    expected = {spec.name: spec for spec in info.tensor_inputs}
    for name in arrays:
        if name not in expected:
            raise InvalidInputError(
                f"{source}: {name!r} is not an input of model {info.name!r} "
                f"(inputs: {', '.join(expected)})"
            )
    for spec in info.tensor_inputs:
        if spec.name not in arrays:
            raise InvalidInputError(f"{source}: missing input {spec.name!r}")
        _check_shape(arrays[spec.name], spec, source)
        _check_dtype(arrays[spec.name], spec, source)


def _check_shape(array: np.ndarray, spec: TensorInfo, source: str) -> None:
    fits = array.ndim == len(spec.shape) and all(
        want < 0 or want == got for want, got in zip(spec.shape, array.shape, strict=True)
    )
    if not fits:
        raise InvalidInputError(
            f"{source}: input {spec.name!r} has shape {list(array.shape)}, "
            f"model {spec.name!r} expects {list(spec.shape)} (-1: any size)"
        )


def _check_dtype(array: np.ndarray, spec: TensorInfo, source: str) -> None:
    if spec.datatype == "BYTES":
        ok = array.dtype.kind in "OSU"
    else:
        ok = np.can_cast(array.dtype, spec.dtype, casting="same_kind")
    if not ok:
        raise InvalidInputError(
            f"{source}: input {spec.name!r} is {array.dtype}, model expects {spec.datatype}"
        )
