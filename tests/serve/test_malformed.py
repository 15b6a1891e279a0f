"""A corpus of malformed Open Inference Protocol requests against a real server.

Every request is answered 4xx with ``{"error": ...}`` over HTTP (and logged in one line:
status, method, path, error), or INVALID_ARGUMENT over gRPC; none reaches a traceback in
the server's log; afterwards the server still serves, and its resident memory has grown
by no more than a bound.
"""

from __future__ import annotations

import gzip
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import grpc
import numpy as np
import orjson
import psutil
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from turboinfer.serve.request_log import one_line

if TYPE_CHECKING:
    from conftest import Server

INFER = "/v2/models/affine/infer"  # input [batch <= 8, 16] FP32, output "output"
RSS_GROWTH_LIMIT = 200 * 1024 * 1024


@dataclass(frozen=True)
class Case:
    name: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    path: str = INFER


def _doc(**fields: Any) -> bytes:
    return orjson.dumps(fields)


def _tensor(name: str = "input", datatype: str = "FP32", shape: Any = (1, 16),
            data: Any = None, **extra: Any) -> dict[str, Any]:
    item = {"name": name, "datatype": datatype, "shape": list(shape) if isinstance(
        shape, tuple) else shape, **extra}
    if data is not None:
        item["data"] = data
    elif "parameters" not in extra:
        item["data"] = [0.5] * 16
    return item


def _one(**extra: Any) -> bytes:
    """A valid single-row request with ``extra`` request-level fields."""
    return _doc(inputs=[_tensor()], **extra)


def _input(**fields: Any) -> bytes:
    return _doc(inputs=[_tensor(**fields)])


def _binary(inputs: list[dict[str, Any]], raw: bytes, header_length: Any = None
            ) -> tuple[bytes, dict[str, str]]:
    header = orjson.dumps({"inputs": inputs})
    length = len(header) if header_length is None else header_length
    return header + raw, {"Inference-Header-Content-Length": str(length)}


def _binary_case(name: str, inputs: list[dict[str, Any]], raw: bytes,
                 header_length: Any = None) -> Case:
    body, headers = _binary(inputs, raw, header_length)
    return Case(name, body, headers)


def _sized(size: Any, datatype: str = "FP32", shape: Any = (1, 16)) -> list[dict[str, Any]]:
    return [_tensor(datatype=datatype, shape=shape, parameters={"binary_data_size": size})]


ROW = np.ones((1, 16), np.float32).tobytes()  # 64 bytes

BAD_JSON = [
    Case("not-json", b"{not json"),
    Case("empty-body", b""),
    Case("json-array", b"[1, 2]"),
    Case("json-string", b'"inputs"'),
    Case("json-null", b"null"),
    Case("truncated", b'{"inputs": [{"name": "input", "datatype": "FP32"'),
    Case("invalid-utf8", b'{"inputs": "\xff\xfe"}'),
    Case("nan-literal", b'{"inputs": NaN}'),
    Case("nested-too-deep", b"[" * 5000 + b"]" * 5000),
    # Past the size where the parser that builds objects as it reads takes over.
    Case("nested-100k-deep", b"[" * 100_000 + b"]" * 100_000),
    Case("nested-100k-objects", b'{"a":' * 100_000 + b"1" + b"}" * 100_000),
    Case("repository-load-nested", b"[" * 100_000 + b"]" * 100_000,
         path="/v2/repository/models/affine/load"),
    Case("repository-unload-not-json", b"{not json", path="/v2/repository/models/affine/unload"),
    Case("repository-index-nested", b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
         path="/v2/repository/index"),
    Case("repository-load-config-override", _doc(parameters={"config": "{}"}),
         path="/v2/repository/models/affine/load"),
    Case("repository-index-ready-string", _doc(ready="yes"), path="/v2/repository/index"),
]
WRONG_TYPES = [
    Case("no-inputs", _doc(id="a")),
    Case("empty-inputs", _doc(inputs=[])),
    Case("inputs-object", _doc(inputs={"name": "input"})),
    Case("input-is-string", _doc(inputs=["input"])),
    Case("name-is-number", _doc(inputs=[_tensor(name=7)])),
    Case("datatype-missing", _doc(inputs=[{"name": "input", "shape": [1, 16],
                                           "data": [0.5] * 16}])),
    Case("datatype-unknown", _input(datatype="FP99")),
    Case("datatype-lowercase", _input(datatype="fp32")),
    Case("data-is-string", _input(data="0.5")),
    Case("data-words", _input(data=["a"] * 16)),
    Case("data-objects", _input(data=[{"v": 1}] * 16)),
    Case("data-missing", _doc(inputs=[{"name": "input", "datatype": "FP32",
                                       "shape": [1, 16]}])),
    Case("data-ragged", _input(shape=(2, 16), data=[[0.5] * 16, [0.5] * 15])),
    Case("id-number", _one(id=5)),
    Case("parameters-list", _one(parameters=[1])),
    Case("outputs-object", _one(outputs={"name": "output"})),
    Case("output-without-name", _one(outputs=[{"binary_data": True}])),
    Case("priority-negative", _one(parameters={"priority": -1})),
    Case("priority-string", _one(parameters={"priority": "high"})),
    Case("timeout-zero", _one(parameters={"timeout": 0})),
    Case("timeout-string", _one(parameters={"timeout": "1s"})),
    Case("binary-output-string", _one(parameters={"binary_data_output": "yes"})),
]
SHAPES = [
    Case("shape-missing", _doc(inputs=[{"name": "input", "datatype": "FP32",
                                        "data": [0.5] * 16}])),
    Case("shape-string", _input(shape="1x16")),
    Case("shape-negative", _input(shape=[-1, 16])),
    Case("shape-floats", _input(shape=[1.0, 16])),
    Case("shape-bools", _input(shape=[True, 16])),
    Case("shape-huge-dim", _input(shape=[0, 2**62], data=[])),
    Case("shape-65-dims", _input(shape=[1] * 65, data=[0.5])),
    Case("shape-count-overflows", _input(shape=[2**32, 2**32, 2**32], data=[])),
    Case("shape-count-mismatch", _input(shape=(2, 16))),
    Case("shape-against-model", _input(shape=(1, 17), data=[0.5] * 17)),
    Case("batch-empty", _input(shape=(0, 16), data=[])),
    Case("batch-over-max", _input(shape=(9, 16), data=[0.5] * 144)),
]
DATATYPES = [
    Case("int8-out-of-range", _input(datatype="INT8", data=[300] * 16)),
    Case("uint8-negative", _input(datatype="UINT8", data=[-1] * 16)),
    Case("int64-too-big", _input(datatype="INT64", data=[2**63] * 16)),
    Case("fp16-overflows", _input(datatype="FP16", data=[1e300] * 16)),
    Case("fp64-for-fp32-model", _input(datatype="FP64")),
    Case("bytes-for-fp32-model", _input(datatype="BYTES", data=["a"] * 16)),
]
BINARY = [
    _binary_case("binary-size-beyond-body", _sized(1024), ROW),
    _binary_case("binary-size-short", _sized(60), ROW[:60]),
    _binary_case("binary-size-negative", _sized(-64), ROW),
    _binary_case("binary-size-string", _sized("64"), ROW),
    _binary_case("binary-size-bool", _sized(True), ROW),
    _binary_case("binary-size-huge", _sized(2**62), ROW),
    _binary_case("binary-trailing-bytes", _sized(64), ROW + b"\0" * 8),
    _binary_case("binary-bytes-truncated-prefix", _sized(2, "BYTES", (1,)), b"\x05\x00"),
    _binary_case("binary-bytes-runs-past", _sized(6, "BYTES", (1,)), b"\x09\0\0\0ab"),
    _binary_case("header-length-beyond-body", _sized(64), ROW, header_length=10**6),
    _binary_case("header-length-negative", _sized(64), ROW, header_length=-5),
    _binary_case("header-length-zero", _sized(64), ROW, header_length=0),
    _binary_case("header-length-not-integer", _sized(64), ROW, header_length="ten"),
    _binary_case("header-length-splits-json", _sized(64), ROW, header_length=12),
]
HEADERS = [
    Case("encoding-unsupported", _one(), {"Content-Encoding": "br"}),
    Case("encoding-gzip-garbage", b"not gzip at all", {"Content-Encoding": "gzip"}),
    Case("gzip-bomb", gzip.compress(b"\0" * (4 << 20)), {"Content-Encoding": "gzip"}),
    Case("declared-length-huge", _one(), {"Content-Length": str(8 << 30)}),
    Case("body-over-limit", b" " * (2 << 20) + _one()),
]
NAMES_AND_PARAMETERS = [
    Case("duplicate-inputs", _doc(inputs=[_tensor(), _tensor()])),
    Case("duplicate-outputs", _one(outputs=[{"name": "output"}, {"name": "output"}])),
    Case("unknown-input", _input(name="other")),
    Case("unknown-output", _one(outputs=[{"name": "nope"}])),
    Case("input-shared-memory", _input(parameters={"shared_memory_region": "r",
                                                   "shared_memory_byte_size": 64})),
    Case("output-shared-memory", _one(outputs=[
        {"name": "output", "parameters": {"shared_memory_region": "r"}}])),
    Case("output-classification-not-a-count", _one(outputs=[
        {"name": "output", "parameters": {"classification": "three"}}])),
    Case("sequence-id", _one(parameters={"sequence_id": 42, "sequence_start": True})),
    Case("input-parameters-list", _input(parameters=["binary_data_size"])),
    Case("version-not-integer", _one(), path="/v2/models/affine/versions/x/infer"),
    Case("version-unknown", _one(), path="/v2/models/affine/versions/99/infer"),
    Case("model-unknown", _one(), path="/v2/models/nope/infer"),
    Case("model-name-with-newline", _one(), path="/v2/models/bad%0Aname/infer"),
]
CORPUS = BAD_JSON + WRONG_TYPES + SHAPES + DATATYPES + BINARY + HEADERS + NAMES_AND_PARAMETERS


def test_corpus_is_large_and_named_uniquely() -> None:
    names = [case.name for case in CORPUS]
    assert len(names) >= 40 and len(set(names)) == len(names)


@pytest.fixture(scope="module")
def start_rss(server: Server) -> int:
    """The server's resident memory once it has answered a valid request."""
    assert _valid_http(server) == 200
    return int(psutil.Process(server.process.pid).memory_info().rss)


def _valid_http(server: Server) -> int:
    return server.request("POST", INFER, _one())[0]


@pytest.mark.parametrize("case", CORPUS, ids=[case.name for case in CORPUS])
def test_http_malformed_is_4xx_with_an_error_and_one_log_line(server: Server, start_rss: int,
                                                               case: Case) -> None:
    logged = server.log.stat().st_size
    status, body = server.request("POST", case.path, case.body, case.headers)
    assert 400 <= status < 500, (status, body[:300])
    error = orjson.loads(body)["error"]
    assert isinstance(error, str) and error
    # The server logs the refusal before it answers: the line is in its log by now.
    with server.log.open("rb") as log:
        log.seek(logged)
        lines = log.read().decode().splitlines()
    assert len(lines) == 1, lines  # a newline in the path is escaped, not a second line
    assert lines[0].endswith(one_line(f"{status} POST {unquote(case.path)}: {error}"))


@pytest.mark.parametrize("name", ["binary-size-negative", "binary-size-string",
                                  "binary-size-bool"])
def test_a_binary_size_that_is_no_count_is_named_so(server: Server, name: str) -> None:
    case = next(case for case in CORPUS if case.name == name)
    status, body = server.request("POST", case.path, case.body, case.headers)
    assert status == 400
    assert "binary_data_size must be an integer >= 0" in orjson.loads(body)["error"]


# Below the protocol: requests the HTTP parser itself rejects (uvicorn logs them, the
# server's protocol class answers with the usual JSON error).
UNPARSEABLE = {
    "request-line": b"GARBAGE\r\n\r\n",
    "content-length-word": b"POST " + INFER.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                           b"Content-Length: abc\r\n\r\n",
    "header-without-colon": b"POST " + INFER.encode() + b" HTTP/1.1\r\nBad Header\r\n\r\n",
}


@pytest.mark.parametrize("raw", UNPARSEABLE.values(), ids=UNPARSEABLE.keys())
def test_unparseable_http_is_400_with_one_log_line(server: Server, raw: bytes) -> None:
    logged = server.log.stat().st_size
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(raw)
        answer = b""
        while chunk := sock.recv(4096):  # the server closes the connection after it
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower()
    assert orjson.loads(body)["error"].startswith("malformed HTTP request: ")
    with server.log.open("rb") as log:
        log.seek(logged)
        lines = log.read().decode().splitlines()
    assert len(lines) == 1 and "Invalid HTTP request" in lines[0], lines


@pytest.fixture(scope="module")
def stub(server: Server) -> Iterator[Any]:
    channel = grpc.insecure_channel(server.grpc_url)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def _request(shape: list[int], datatype: str = "FP32", raw: bytes | None = ROW,
             name: str = "input") -> Any:
    request = service_pb2.ModelInferRequest(model_name="affine")
    request.inputs.add(name=name, datatype=datatype, shape=shape)
    if raw is not None:
        request.raw_input_contents.append(raw)
    return request


def _with(request: Any, change: Any) -> Any:
    change(request)
    return request


def _bytes_raw(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


GRPC_CORPUS: list[tuple[str, Any]] = [
    ("huge-dim", _request([0, 2**62], raw=b"")),
    ("65-dims", _request([1] * 65, raw=b"\0" * 4)),
    ("negative-dim", _request([-1, 16])),
    ("count-overflows", _request([2**32, 2**32, 2**8], raw=b"")),  # np.prod wraps to 0
    ("int8-out-of-range", _with(_request([1, 16], "INT8", raw=None),
                                lambda r: r.inputs[0].contents.int_contents.extend([300] * 16))),
    ("uint8-out-of-range", _with(_request([1, 16], "UINT8", raw=None),
                                 lambda r: r.inputs[0].contents.uint_contents.extend([999] * 16))),
    ("negative-priority", _with(_request([1, 16]), lambda r: r.parameters["priority"].MergeFrom(
        service_pb2.InferParameter(int64_param=-1)))),
    ("negative-timeout", _with(_request([1, 16]), lambda r: r.parameters["timeout"].MergeFrom(
        service_pb2.InferParameter(int64_param=-5)))),
    ("duplicate-inputs", _with(_request([1, 16]), lambda r: (
        r.inputs.add(name="input", datatype="FP32", shape=[1, 16]),
        r.raw_input_contents.append(ROW)))),
    ("duplicate-outputs", _with(_request([1, 16]), lambda r: (
        r.outputs.add(name="output"), r.outputs.add(name="output")))),
    ("raw-size-mismatch", _request([1, 16], raw=ROW[:10])),
    ("raw-count-mismatch", _with(_request([1, 16]), lambda r: r.raw_input_contents.append(ROW))),
    ("unknown-datatype", _request([1, 16], "FP99")),
    ("contents-count-mismatch", _with(_request([1, 16], raw=None),
                                      lambda r: r.inputs[0].contents.fp32_contents.extend([1.0]))),
    ("shared-memory", _with(_request([1, 16]), lambda r: r.inputs[0].parameters[
        "shared_memory_region"].MergeFrom(service_pb2.InferParameter(string_param="r")))),
    ("sequence-id", _with(_request([1, 16]), lambda r: r.parameters["sequence_id"].MergeFrom(
        service_pb2.InferParameter(int64_param=7)))),
    ("bytes-truncated", _request([1], "BYTES", raw=_bytes_raw(b"abc")[:5])),
    ("shape-against-model", _request([1, 17], raw=b"\0" * 68)),
]


@pytest.mark.parametrize("request_", [r for _, r in GRPC_CORPUS],
                         ids=[name for name, _ in GRPC_CORPUS])
def test_grpc_malformed_is_invalid_argument(stub: Any, start_rss: int, request_: Any) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request_, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert caught.value.details()


def test_still_serving_with_bounded_memory(server: Server, stub: Any, start_rss: int) -> None:
    assert _valid_http(server) == 200
    reply = stub.ModelInfer(_request([1, 16]), timeout=30)
    assert np.frombuffer(reply.raw_output_contents[0], np.float32)[0] == 3.0
    grown = psutil.Process(server.process.pid).memory_info().rss - start_rss
    assert grown < RSS_GROWTH_LIMIT, f"RSS grew by {grown / 2**20:.0f} MiB"
    log = server.log.read_text()
    assert "Traceback" not in log, log[-3000:]
