"""Open Inference Protocol (KServe v2) codec: JSON tensors and the binary tensor extension.

This is the hot path. Tensor payloads are never validated against a schema library:
binary tensors become ``numpy.frombuffer`` views of the request body (no copy), JSON goes
through orjson, and only the few checks that protect a batch from one bad request
(datatype, element count, byte size) are made, each with a message naming the input.

Binary layout (Triton's binary tensor data extension): the body is a JSON header of
``Inference-Header-Content-Length`` bytes followed by the raw tensors, in the order of the
inputs that carry ``parameters.binary_data_size``. BYTES elements are each prefixed by a
4-byte little-endian length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from turboinfer.errors import InvalidInputError
from turboinfer.serve.datatypes import (
    DATATYPES,
    as_bytes,
    as_text,
    datatype_of,
    deserialize_bytes,
    flatten,
    raw_bytes,
    serialize_bytes,
)
from turboinfer.serve.json_body import parse_json

__all__ = ["DATATYPES", "InferRequest", "RequestedOutput", "datatype_of", "decode_request",
           "encode_response", "from_raw", "raw_bytes", "serialize_bytes"]

_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    name: str
    binary: bool


@dataclass(slots=True)
class InferRequest:
    """One decoded request, independent of the transport (HTTP or gRPC)."""

    inputs: dict[str, np.ndarray]
    id: str | None = None
    outputs: list[RequestedOutput] | None = None  # None: every output of the model
    binary_output: bool = False  # default for outputs not listed (HTTP only)
    priority: int = 0  # higher is dequeued first
    timeout_s: float | None = None  # queue timeout; None: the model's default
    parameters: dict[str, Any] = field(default_factory=dict)


def decode_request(body: bytes, header_length: int | None) -> InferRequest:
    """Decode an HTTP infer body. ``header_length`` comes from the
    ``Inference-Header-Content-Length`` header (None: the body is all JSON)."""
    size = len(body)
    if header_length is None:
        header_length = size
    elif not 0 < header_length <= size:
        raise InvalidInputError(
            f"Inference-Header-Content-Length {header_length} is outside the body "
            f"of {size} bytes")
    view = memoryview(body)
    doc = parse_json(view[:header_length])
    if not isinstance(doc, dict):
        raise InvalidInputError("request body must be a JSON object with an 'inputs' list")
    inputs, offset = _decode_inputs(doc.get("inputs"), view, header_length)
    if offset != size:
        raise InvalidInputError(
            f"binary data size mismatch: the body holds {size - header_length} bytes after "
            f"the JSON header, the inputs' binary_data_size add up to {offset - header_length}")
    request = InferRequest(inputs=inputs, id=_optional_str(doc.get("id"), "id"))
    apply_parameters(request, doc.get("parameters"))
    request.outputs = _decode_outputs(doc.get("outputs"), request.binary_output)
    return request


def _decode_inputs(items: Any, view: memoryview, offset: int
                   ) -> tuple[dict[str, np.ndarray], int]:
    if not isinstance(items, list) or not items:
        raise InvalidInputError("request needs a non-empty 'inputs' list")
    inputs: dict[str, np.ndarray] = {}
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidInputError("every input needs a 'name', 'datatype' and 'shape'")
        name = item["name"]
        dtype, shape = _dtype_and_shape(name, item)
        params = item.get("parameters")
        nbytes = params.get("binary_data_size") if isinstance(params, dict) else None
        if nbytes is None:
            inputs[name] = _from_json(name, item.get("data"), dtype, shape)
        else:
            if not isinstance(nbytes, int) or nbytes < 0 or offset + nbytes > len(view):
                raise InvalidInputError(
                    f"input {name!r}: binary_data_size {nbytes} exceeds the binary data "
                    f"left in the body ({len(view) - offset} bytes)")
            inputs[name] = from_raw(name, view[offset:offset + nbytes], dtype, shape)
            offset += nbytes
    return inputs, offset


def _dtype_and_shape(name: str, item: dict[str, Any]) -> tuple[np.dtype, tuple[int, ...]]:
    datatype = item.get("datatype")
    dtype = DATATYPES.get(datatype) if isinstance(datatype, str) else None
    if dtype is None:
        raise InvalidInputError(
            f"input {name!r}: unknown datatype {datatype!r}; use one of {', '.join(DATATYPES)}")
    shape = item.get("shape")
    if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise InvalidInputError(f"input {name!r}: shape must be a list of integers >= 0, "
                                f"got {shape!r}")
    return dtype, tuple(shape)


def _from_json(name: str, data: Any, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    if not isinstance(data, list):
        raise InvalidInputError(f"input {name!r} needs 'data' (a list) or binary_data_size")
    try:
        if dtype.kind == "O":
            array = np.array([as_bytes(v) for v in flatten(data)], dtype=object)
        else:
            array = np.array(data, dtype=dtype)
    except (ValueError, TypeError, OverflowError):
        raise InvalidInputError(f"input {name!r}: data do not match datatype "
                                f"{datatype_of(dtype)} (or are ragged)") from None
    expected = _count(shape)
    if array.size != expected:
        raise InvalidInputError(f"input {name!r} has {array.size} elements, "
                                f"shape {list(shape)} needs {expected}")
    return array.reshape(shape)


def from_raw(name: str, raw: memoryview | bytes, dtype: np.dtype,
             shape: tuple[int, ...]) -> np.ndarray:
    """A tensor from its raw bytes: a zero-copy view for fixed-size types."""
    expected = _count(shape)
    if dtype.kind == "O":
        return deserialize_bytes(name, raw, expected).reshape(shape)
    if len(raw) != expected * dtype.itemsize:
        raise InvalidInputError(
            f"input {name!r}: binary size mismatch, got {len(raw)} bytes, shape {list(shape)} "
            f"of {datatype_of(dtype)} needs {expected * dtype.itemsize}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def apply_parameters(request: InferRequest, params: Any) -> None:
    """Read the request-level parameters the server acts on; keep the rest."""
    if params is None:
        return
    if not isinstance(params, dict):
        raise InvalidInputError("'parameters' must be a JSON object")
    request.parameters = params
    priority = params.get("priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool) or priority < 0:
        raise InvalidInputError(f"priority must be an integer >= 0, got {priority!r}")
    request.priority = priority
    timeout = params.get("timeout")  # microseconds, as Triton's clients send it
    if timeout is not None:
        if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
            raise InvalidInputError(f"timeout must be a positive number of microseconds, "
                                    f"got {timeout!r}")
        request.timeout_s = timeout / 1e6
    request.binary_output = bool(params.get("binary_data_output", False))


def _decode_outputs(items: Any, default_binary: bool) -> list[RequestedOutput] | None:
    if items is None:
        return None
    if not isinstance(items, list):
        raise InvalidInputError("'outputs' must be a list")
    outputs = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidInputError("every requested output needs a 'name'")
        params = item.get("parameters") or {}
        if isinstance(params, dict) and "classification" in params:
            raise InvalidInputError(f"output {item['name']!r}: the classification extension "
                                    "is not supported; request the raw tensor")
        binary = params.get("binary_data", default_binary) if isinstance(params, dict) else False
        outputs.append(RequestedOutput(item["name"], bool(binary)))
    return outputs


def encode_response(model: str, version: str, request: InferRequest,
                    outputs: dict[str, np.ndarray]) -> tuple[bytes, int | None]:
    """The HTTP response body and, when binary tensors follow, the JSON header length."""
    chunks: list[Any] = []  # bytes or contiguous arrays: bytes.join reads their buffers
    entries = []
    for name, binary in _selected(request, outputs):
        array = outputs[name]
        entry: dict[str, Any] = {"name": name, "datatype": datatype_of(array.dtype),
                                 "shape": list(array.shape)}
        if binary:
            raw = raw_bytes(array)
            chunks.append(raw)
            entry["parameters"] = {"binary_data_size": raw.nbytes if isinstance(
                raw, np.ndarray) else len(raw)}
        elif array.dtype.kind in "OSU":
            entry["data"] = [as_text(v) for v in array.reshape(-1)]
        else:
            entry["data"] = np.ascontiguousarray(array).reshape(-1)
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": entries}
    if request.id is not None:
        doc["id"] = request.id
    header = orjson.dumps(doc, option=_JSON_OPTIONS)
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


def _selected(request: InferRequest, outputs: dict[str, np.ndarray]
              ) -> list[tuple[str, bool]]:
    if request.outputs is None:
        return [(name, request.binary_output) for name in outputs]
    return [(o.name, o.binary) for o in request.outputs]


def check_requested_outputs(request: InferRequest, available: list[str]) -> None:
    """Reject an unknown requested output before the request joins a batch."""
    for output in request.outputs or ():
        if output.name not in available:
            raise InvalidInputError(f"unknown output {output.name!r}; the model has "
                                    f"{', '.join(available)}")


def _count(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _optional_str(value: Any, key: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise InvalidInputError(f"{key!r} must be a string")
