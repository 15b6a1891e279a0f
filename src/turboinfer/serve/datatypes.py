"""The protocol's tensor datatypes and the BYTES wire format.

``BYTES`` tensors are numpy object arrays of ``bytes``; on the wire (binary HTTP tensors
and gRPC raw contents) each element is a 4-byte little-endian length then the bytes.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from turboinfer.errors import InvalidInputError

DATATYPES: dict[str, np.dtype] = {
    name: np.dtype(dtype)
    for name, dtype in {
        "BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32",
        "UINT64": "uint64", "INT8": "int8", "INT16": "int16", "INT32": "int32",
        "INT64": "int64", "FP16": "float16", "FP32": "float32", "FP64": "float64",
        "BYTES": "object",
    }.items()
}
_NAMES: dict[np.dtype, str] = {dtype: name for name, dtype in DATATYPES.items()}
_NAMES[np.dtype("bytes")] = "BYTES"
_NAMES[np.dtype("str")] = "BYTES"

MAX_DIMS = 64  # numpy's own limit on the dimensions of an array
# The product of a shape's non-zero dimensions may not exceed this. No tensor that fits
# in a request body comes near it, and it keeps every size computed from a shape (bytes,
# numpy's own checks) far from int64 overflow, zero-sized shapes included.
MAX_ELEMENTS = 2**40


def checked_shape(name: str, shape: Any) -> tuple[tuple[int, ...], int]:
    """A request's shape and its element count, refused with a 400 unless it is a list of
    at most ``MAX_DIMS`` integers >= 0 spanning at most ``MAX_ELEMENTS``. Python integers
    never overflow, so the count is exact whatever the client sent."""
    if not isinstance(shape, list | tuple) or len(shape) > MAX_DIMS:
        raise InvalidInputError(f"input {name!r}: shape must be a list of at most {MAX_DIMS} "
                                f"integers >= 0, got {_brief(shape)}")
    count = span = 1
    for dim in shape:
        if type(dim) is not int or dim < 0:  # type(): a JSON true is not a dimension
            raise InvalidInputError(f"input {name!r}: shape must be a list of integers "
                                    f">= 0, got {_brief(shape)}")
        count *= dim
        span *= dim or 1
        if span > MAX_ELEMENTS:
            raise InvalidInputError(f"input {name!r}: shape {_brief(shape)} exceeds "
                                    f"{MAX_ELEMENTS} elements")
    return tuple(shape), count


def to_array(name: str, values: Any, dtype: np.dtype) -> np.ndarray:
    """Typed values (a JSON list, gRPC contents) as an array of ``dtype``; a value out of
    the datatype's range or of the wrong type is a 400, not a silent wrap or inf."""
    try:
        if dtype.kind == "O":
            items = [as_bytes(v) for v in flatten(values)]
            array = np.empty(len(items), dtype=object)
            array[:] = items
            return array
        if dtype.kind != "f":  # integers raise OverflowError by themselves
            return np.array(values, dtype=dtype)
        with np.errstate(over="raise", invalid="raise"):  # else 1e300 turns inf silently
            return np.array(values, dtype=dtype)
    except (ValueError, TypeError, OverflowError, FloatingPointError, RecursionError):
        raise InvalidInputError(f"input {name!r}: data do not match datatype "
                                f"{datatype_of(dtype)} (out of range, wrong type or "
                                "ragged)") from None


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def datatype_of(dtype: np.dtype) -> str:
    """The protocol name of a numpy dtype (``float32`` -> ``FP32``)."""
    try:
        return _NAMES[dtype]
    except KeyError:
        if dtype.kind in "SU":
            return "BYTES"
        raise InvalidInputError(f"numpy dtype {dtype.name} has no protocol datatype") from None


def deserialize_bytes(name: str, raw: memoryview | bytes, count: int) -> np.ndarray:
    items: list[bytes] = []
    offset, size = 0, len(raw)
    while offset < size:
        if offset + 4 > size:
            raise InvalidInputError(f"input {name!r}: truncated BYTES length prefix")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > size:
            raise InvalidInputError(f"input {name!r}: BYTES element runs past the data")
        items.append(bytes(raw[offset:offset + length]))
        offset += length
    if len(items) != count:
        raise InvalidInputError(f"input {name!r} has {len(items)} BYTES elements, "
                                f"its shape needs {count}")
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


def serialize_bytes(array: np.ndarray) -> bytes:
    """BYTES elements as 4-byte little-endian lengths, each followed by the bytes."""
    parts: list[bytes] = []
    for value in array.reshape(-1):
        data = as_bytes(value)
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)


def raw_bytes(array: np.ndarray) -> bytes | np.ndarray:
    """What goes on the wire for a tensor: the contiguous array itself (bytes.join and
    protobuf read its buffer) or, for BYTES, the length-prefixed serialization."""
    if array.dtype.kind in "OSU":
        return serialize_bytes(array)
    return np.ascontiguousarray(array)


def flatten(data: list[Any], depth: int = 0) -> list[Any]:
    """Nested JSON lists in order; nesting deeper than a shape may have dimensions is
    refused (``ValueError``) whatever Python's recursion limit is."""
    if depth > MAX_DIMS:
        raise ValueError(f"data nested deeper than {MAX_DIMS} levels")
    flat: list[Any] = []
    for value in data:
        if isinstance(value, list):
            flat.extend(flatten(value, depth + 1))
        else:
            flat.append(value)
    return flat


def as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, np.bytes_ | np.str_):
        return bytes(value) if isinstance(value, np.bytes_) else str(value).encode()
    raise TypeError(f"not a BYTES element: {value!r}")


def as_text(value: Any) -> str:
    data = as_bytes(value)
    return data.decode("utf-8", errors="replace")
