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
    as_text,
    checked_shape,
    datatype_of,
    deserialize_bytes,
    raw_bytes,
    serialize_bytes,
    to_array,
)
from turboinfer.serve.json_body import parse_json

__all__ = ["DATATYPES", "InferRequest", "RequestedOutput", "apply_parameters",
           "check_tensor_parameters", "classification_count", "datatype_of", "decode_request",
           "encode_response",
           "from_raw", "from_values", "raw_bytes", "serialize_bytes", "tensor_spec"]

_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
# Parameters of protocol extensions this server does not implement. Ignoring them would
# answer something other than what the client asked for, so they are refused by name.
_UNSUPPORTED_REQUEST = {"sequence_id": "sequence batching",
                        "sequence_start": "sequence batching",
                        "sequence_end": "sequence batching"}
_UNSUPPORTED_TENSOR = {"shared_memory_region": "the shared-memory extension",
                       "shared_memory_byte_size": "the shared-memory extension",
                       "shared_memory_offset": "the shared-memory extension"}


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    name: str
    binary: bool
    classification: int = 0  # the classification extension's count; 0: the raw tensor


@dataclass(slots=True)
class InferRequest:
    """One decoded request, independent of the transport (HTTP or gRPC)."""

    inputs: dict[str, np.ndarray]
    id: str | None = None
    outputs: list[RequestedOutput] | None = None  # None: every output of the model
    binary_output: bool = False  # default for outputs not listed (HTTP only)
    priority: int = 0  # higher is dequeued first
    timeout_s: float | None = None  # deadline (queue and engine); None: the model's default
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
        if name in inputs:
            raise InvalidInputError(f"input {name!r} appears twice in the request")
        dtype, shape, count = tensor_spec(name, item.get("datatype"), item.get("shape"))
        params = check_tensor_parameters(f"input {name!r}", item.get("parameters"))
        nbytes = params.get("binary_data_size")
        if nbytes is None:
            inputs[name] = _from_json(name, item.get("data"), dtype, shape, count)
        else:
            if type(nbytes) is not int or nbytes < 0:
                raise InvalidInputError(f"input {name!r}: binary_data_size must be an "
                                        f"integer >= 0, got {nbytes!r}")
            if offset + nbytes > len(view):
                raise InvalidInputError(
                    f"input {name!r}: binary_data_size {nbytes} exceeds the binary data "
                    f"left in the body ({len(view) - offset} bytes)")
            inputs[name] = from_raw(name, view[offset:offset + nbytes], dtype, shape)
            offset += nbytes
    return inputs, offset


def tensor_spec(name: str, datatype: Any, shape: Any
                ) -> tuple[np.dtype, tuple[int, ...], int]:
    """The dtype, shape and element count of one input, checked the same way for
    both transports: only integer work on the shape, never on the data."""
    dtype = DATATYPES.get(datatype) if isinstance(datatype, str) else None
    if dtype is None:
        raise InvalidInputError(
            f"input {name!r}: unknown datatype {datatype!r}; use one of {', '.join(DATATYPES)}")
    checked, count = checked_shape(name, shape)
    return dtype, checked, count


def check_tensor_parameters(what: str, params: Any) -> dict[str, Any]:
    """An input's or output's parameters (``{}`` when absent), refused when they ask
    for an extension the server does not implement."""
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise InvalidInputError(f"{what}: 'parameters' must be an object")
    for key in params:
        if key in _UNSUPPORTED_TENSOR:
            raise InvalidInputError(f"{what}: {_UNSUPPORTED_TENSOR[key]} is not supported "
                                    f"(parameter {key!r})")
    return params


def _from_json(name: str, data: Any, dtype: np.dtype, shape: tuple[int, ...],
               count: int) -> np.ndarray:
    if not isinstance(data, list):
        raise InvalidInputError(f"input {name!r} needs 'data' (a list) or binary_data_size")
    return from_values(name, data, dtype, shape, count)


def from_values(name: str, values: Any, dtype: np.dtype, shape: tuple[int, ...],
                count: int) -> np.ndarray:
    """A tensor from typed values (JSON data, gRPC contents) of ``count`` elements."""
    array = to_array(name, values, dtype)
    if array.size != count:
        raise InvalidInputError(f"input {name!r} has {array.size} elements, "
                                f"shape {list(shape)} needs {count}")
    return array.reshape(shape)


def from_raw(name: str, raw: memoryview | bytes, dtype: np.dtype,
             shape: tuple[int, ...]) -> np.ndarray:
    """A tensor from its raw bytes: a zero-copy view for fixed-size types. ``shape``
    comes from ``tensor_spec``, so its element count is bounded."""
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
    for key in params:
        if key in _UNSUPPORTED_REQUEST and params[key] not in (0, "", False):
            raise InvalidInputError(f"{_UNSUPPORTED_REQUEST[key]} is not supported "
                                    f"(parameter {key!r})")
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
    binary = params.get("binary_data_output", False)
    if not isinstance(binary, bool):
        raise InvalidInputError(f"binary_data_output must be true or false, got {binary!r}")
    request.binary_output = binary


def _decode_outputs(items: Any, default_binary: bool) -> list[RequestedOutput] | None:
    if items is None:
        return None
    if not isinstance(items, list):
        raise InvalidInputError("'outputs' must be a list")
    outputs: list[RequestedOutput] = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidInputError("every requested output needs a 'name'")
        name = item["name"]
        params = check_tensor_parameters(f"output {name!r}", item.get("parameters"))
        binary = params.get("binary_data", default_binary)
        if not isinstance(binary, bool):
            raise InvalidInputError(f"output {name!r}: binary_data must be true or false")
        outputs.append(RequestedOutput(name, binary, classification_count(name, params)))
    check_unique_outputs(outputs)
    return outputs


def classification_count(name: str, params: dict[str, Any]) -> int:
    """The ``classification`` parameter of a requested output: a count >= 1, or 0."""
    count = params.get("classification", 0)
    if type(count) is not int or count < 0:
        raise InvalidInputError(f"output {name!r}: classification must be an integer >= 1, "
                                f"got {count!r}")
    return count


def check_unique_outputs(outputs: list[RequestedOutput]) -> None:
    seen: set[str] = set()
    for output in outputs:
        if output.name in seen:
            raise InvalidInputError(f"output {output.name!r} is requested twice")
        seen.add(output.name)


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
