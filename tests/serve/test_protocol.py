from __future__ import annotations

import numpy as np
import orjson
import pytest

from turboinfer.errors import InvalidInputError
from turboinfer.serve.protocol import (
    InferRequest,
    RequestedOutput,
    decode_request,
    encode_response,
    serialize_bytes,
)


def _binary_body(header: dict, *tensors: bytes) -> tuple[bytes, int]:
    head = orjson.dumps(header)
    return head + b"".join(tensors), len(head)


def test_json_flat_and_nested() -> None:
    for data in ([1, 2, 3, 4, 5, 6], [[1, 2, 3], [4, 5, 6]]):
        body = orjson.dumps({"id": "r1", "inputs": [
            {"name": "x", "datatype": "INT32", "shape": [2, 3], "data": data}]})
        request = decode_request(body, None)
        assert request.id == "r1"
        np.testing.assert_array_equal(request.inputs["x"],
                                      np.arange(1, 7, dtype=np.int32).reshape(2, 3))


def test_binary_inputs_are_views_of_the_body() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([7, 8], dtype=np.int64)
    body, size = _binary_body({"inputs": [
        {"name": "a", "datatype": "FP32", "shape": [2, 3],
         "parameters": {"binary_data_size": a.nbytes}},
        {"name": "b", "datatype": "INT64", "shape": [2],
         "parameters": {"binary_data_size": b.nbytes}}],
        "parameters": {"priority": 3, "timeout": 5000, "binary_data_output": True}},
        a.tobytes(), b.tobytes())
    request = decode_request(body, size)
    np.testing.assert_array_equal(request.inputs["a"], a)
    np.testing.assert_array_equal(request.inputs["b"], b)
    assert not request.inputs["a"].flags.owndata  # frombuffer: no copy
    assert request.priority == 3 and request.timeout_s == pytest.approx(0.005)
    assert request.binary_output


def test_bytes_round_trip() -> None:
    values = np.array([b"hello", b"", "wörld".encode()], dtype=object)
    raw = serialize_bytes(values)
    body, size = _binary_body({"inputs": [
        {"name": "s", "datatype": "BYTES", "shape": [3],
         "parameters": {"binary_data_size": len(raw)}}]}, raw)
    decoded = decode_request(body, size).inputs["s"]
    assert list(decoded) == list(values)
    json_body = orjson.dumps({"inputs": [
        {"name": "s", "datatype": "BYTES", "shape": [1, 2], "data": [["a", "b"]]}]})
    assert decode_request(json_body, None).inputs["s"].tolist() == [[b"a", b"b"]]


@pytest.mark.parametrize("body, header, message", [
    (b"{not json", None, "malformed JSON"),
    (b"[1, 2]", None, "JSON object"),
    (b'{"inputs": []}', None, "non-empty 'inputs'"),
    (b'{"inputs": [{"name": "x", "datatype": "FP99", "shape": [1], "data": [1]}]}', None,
     "unknown datatype 'FP99'"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3]}]}',
     None, "input 'x' has 3 elements, shape [2, 2] needs 4"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1], "data": [1]}]}', None,
     "shape must be a list of integers"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": ["a"]}]}', None,
     "do not match datatype FP32"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}],'
     b' "parameters": {"priority": -1}}', None, "priority must be an integer >= 0"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]}', 500,
     "outside the body"),
])
def test_bad_requests_name_the_problem(body: bytes, header: int | None, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        decode_request(body, header)


def test_binary_size_mismatch() -> None:
    header = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [4],
                          "parameters": {"binary_data_size": 12}}]}
    body, size = _binary_body(header, b"\0" * 12)
    with pytest.raises(InvalidInputError, match="binary size mismatch"):
        decode_request(body, size)
    header["inputs"][0]["parameters"]["binary_data_size"] = 16
    body, size = _binary_body(header, b"\0" * 20)
    with pytest.raises(InvalidInputError, match="binary data size mismatch"):
        decode_request(body, size)


def test_encode_json_and_binary() -> None:
    outputs = {"y": np.arange(4, dtype=np.float32).reshape(2, 2),
               "z": np.array([1, 2], dtype=np.int64)}
    plain, header = encode_response("m", "1", InferRequest(inputs={}, id="q"), outputs)
    assert header is None
    doc = orjson.loads(plain)
    assert doc["id"] == "q" and doc["model_version"] == "1"
    assert doc["outputs"][0] == {"name": "y", "datatype": "FP32", "shape": [2, 2],
                                 "data": [0.0, 1.0, 2.0, 3.0]}
    request = InferRequest(inputs={}, outputs=[RequestedOutput("z", True)])
    body, header = encode_response("m", "1", request, outputs)
    assert header is not None
    doc = orjson.loads(body[:header])
    assert [o["name"] for o in doc["outputs"]] == ["z"]
    assert doc["outputs"][0]["parameters"]["binary_data_size"] == 16
    np.testing.assert_array_equal(np.frombuffer(body[header:], np.int64), [1, 2])
