"""Malformed shapes, values, names and parameters: both doors refuse them with a 400 /
INVALID_ARGUMENT from the one codec, never an unhandled numpy or Python error."""

from __future__ import annotations

import sys
from typing import Any

import orjson
import pytest
from tritonclient.grpc import service_pb2

from turboinfer.errors import InvalidInputError
from turboinfer.serve.grpc_service import decode_infer
from turboinfer.serve.protocol import decode_request


def _http(inputs: list[dict[str, Any]], **extra: Any) -> bytes:
    return orjson.dumps({"inputs": inputs, **extra})


def _x(shape: Any, data: Any = (), datatype: str = "FP32", **extra: Any) -> dict[str, Any]:
    return {"name": "x", "datatype": datatype, "shape": shape, "data": list(data), **extra}


@pytest.mark.parametrize("body, message", [
    (_http([_x([0, 2**62])]), "exceeds"),
    (_http([_x([0] * 65)]), "at most 64"),
    (_http([_x([2**32, 2**32, 0])]), "exceeds"),
    (_http([_x([-3], [1])]), "integers >= 0"),
    (_http([_x([True], [1])]), "integers >= 0"),
    (_http([_x("16", [1])]), "at most 64"),
    (_http([_x([1], [300], "INT8")]), "do not match datatype INT8"),
    (_http([_x([1], [-1], "UINT8")]), "do not match datatype UINT8"),
    (_http([_x([1], [1e300], "FP32")]), "do not match datatype FP32"),
    (_http([_x([1], [1e300], "FP16")]), "do not match datatype FP16"),
    (_http([_x([1], [1]), _x([1], [2])]), "'x' appears twice"),
    (_http([_x([0, 2**62], datatype="FP32", parameters={"binary_data_size": 0})]),
     "exceeds"),
    (_http([_x([1], [1], parameters={"binary_data_size": True})]), "binary_data_size"),
    (_http([_x([1], [1], parameters=[1])]), "'parameters' must be an object"),
    (_http([_x([1], [1], parameters={"shared_memory_region": "r"})]), "shared-memory"),
    (_http([_x([1], [1])], parameters={"sequence_id": 7}), "sequence batching"),
    (_http([_x([1], [1])], parameters={"binary_data_output": "yes"}), "true or false"),
    (_http([_x([1], [1])], outputs=[{"name": "y"}, {"name": "y"}]), "requested twice"),
    (_http([_x([1], [1])], outputs=[{"name": "y", "parameters": {"binary_data": 2}}]),
     "true or false"),
])
def test_http_codec_refuses(body: bytes, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        decode_request(body, None)


@pytest.mark.parametrize("recursion_limit", [None, 20_000])
def test_deeply_nested_bytes_are_refused(recursion_limit: int | None) -> None:
    # Within orjson's nesting limit, deeper than any shape: refused whatever Python's
    # recursion limit (a library in the same process may have raised it).
    data = b"[" * 1010 + b'"a"' + b"]" * 1010
    body = b'{"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": ' + data
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(recursion_limit or previous)
    try:
        with pytest.raises(InvalidInputError, match="do not match datatype BYTES"):
            decode_request(body + b"}]}", None)
    finally:
        sys.setrecursionlimit(previous)


def _grpc(shape: list[int], datatype: str = "FP32", raw: bytes | None = None,
          **contents: list[Any]) -> Any:
    request = service_pb2.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="x", datatype=datatype, shape=shape)
    for field, values in contents.items():
        getattr(tensor.contents, field).extend(values)
    if raw is not None:
        request.raw_input_contents.append(raw)
    return request


def _negative_priority() -> Any:
    request = _grpc([1], fp32_contents=[1.0])
    request.parameters["priority"].int64_param = -1
    return request


def _duplicate_inputs() -> Any:
    request = _grpc([1], fp32_contents=[1.0])
    request.inputs.add(name="x", datatype="FP32", shape=[1]).contents.fp32_contents.append(2)
    return request


def _shared_memory() -> Any:
    request = _grpc([1], fp32_contents=[1.0])
    request.inputs[0].parameters["shared_memory_region"].string_param = "r"
    return request


@pytest.mark.parametrize("request_, message", [
    (_grpc([0, 2**62], raw=b""), "exceeds"),
    (_grpc([2**32, 2**32, 2**8], raw=b""), "exceeds"),  # np.prod wraps this to 0
    (_grpc([1] * 65, raw=b"\0\0\0\0"), "at most 64"),
    (_grpc([-1], raw=b""), "integers >= 0"),
    (_grpc([1], "INT8", int_contents=[300]), "do not match datatype INT8"),
    (_grpc([1], "UINT8", uint_contents=[1000]), "do not match datatype UINT8"),
    (_grpc([1], "FP32", fp64_contents=[1.0]), "has 0 elements"),
    (_negative_priority(), "priority must be an integer >= 0"),
    (_duplicate_inputs(), "'x' appears twice"),
    (_shared_memory(), "shared-memory"),
])
def test_grpc_codec_refuses(request_: Any, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        decode_infer(request_)
