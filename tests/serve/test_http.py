"""The HTTP endpoint through tritonclient.http (binary and JSON) and raw requests."""

from __future__ import annotations

import gzip
from typing import TYPE_CHECKING

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

if TYPE_CHECKING:
    from conftest import Server


@pytest.fixture(scope="module")
def client(server: Server) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.http_url, concurrency=4)


def _infer(client: httpclient.InferenceServerClient, x: np.ndarray, binary: bool,
           **kwargs: object) -> httpclient.InferResult:
    tensor = httpclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput("output", binary_data=binary)]
    return client.infer("affine", [tensor], outputs=outputs, **kwargs)


def test_health_and_metadata(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("affine") and client.is_model_ready("affine", "1")
    assert not client.is_model_ready("nope")
    assert client.get_server_metadata()["name"] == "turboinfer"
    meta = client.get_model_metadata("affine")
    assert meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 16]}]
    config = client.get_model_config("affine")
    assert config["max_batch_size"] == 8 and config["input"][0]["dims"] == [16]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 2000


@pytest.mark.parametrize("binary", [True, False])
def test_infer(client: httpclient.InferenceServerClient, binary: bool) -> None:
    x = np.arange(32, dtype=np.float32).reshape(2, 16)
    result = _infer(client, x, binary, request_id="abc")
    np.testing.assert_allclose(result.as_numpy("output"), 2 * x + 1)
    response = result.get_response()
    assert response["model_version"] == "1" and response["id"] == "abc"
    assert ("parameters" in response["outputs"][0]) is binary


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests(client: httpclient.InferenceServerClient, algorithm: str) -> None:
    x = np.ones((1, 16), np.float32)
    tensor = httpclient.InferInput("input", [1, 16], "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("affine", [tensor], request_compression_algorithm=algorithm)
    np.testing.assert_allclose(result.as_numpy("output"), 3 * x)


def test_concurrent_requests_are_batched_and_counted(
        client: httpclient.InferenceServerClient) -> None:
    before = client.get_inference_statistics("affine")["model_stats"][0]
    x = np.ones((1, 16), np.float32)
    tensor = httpclient.InferInput("input", [1, 16], "FP32")
    tensor.set_data_from_numpy(x)
    pending = [client.async_infer("affine", [tensor]) for _ in range(16)]
    for request in pending:
        np.testing.assert_allclose(request.get_result().as_numpy("output"), 3 * x)
    stats = client.get_inference_statistics("affine")["model_stats"][0]
    assert stats["inference_count"] - before["inference_count"] == 16
    executions = stats["execution_count"] - before["execution_count"]
    assert executions <= 16
    sizes = {b["batch_size"] for b in stats["batch_stats"]}
    assert sizes and max(sizes) <= 8
    stats_ns = stats["inference_stats"]
    assert stats_ns["success"]["count"] >= 16 and stats_ns["queue"]["ns"] > 0
    # Per request in inference_stats, per batch in batch_stats (Triton's semantics).
    computed = stats_ns["compute_infer"]["count"]
    assert computed - before["inference_stats"]["compute_infer"]["count"] == 16
    assert sum(b["compute_infer"]["count"] for b in stats["batch_stats"]) == \
        stats["execution_count"]


def test_repository_index_load_unload(client: httpclient.InferenceServerClient) -> None:
    index = {(m["name"], m.get("version")): m["state"]
             for m in client.get_model_repository_index()}
    assert index[("affine", "1")] == "READY" and index[("slow", "1")] == "READY"
    client.unload_model("slow")
    assert not client.is_model_ready("slow")
    with pytest.raises(InferenceServerException, match="not ready"):
        client.infer("slow", [_slow_input()])
    client.load_model("slow")
    assert client.is_model_ready("slow")
    assert client.infer("slow", [_slow_input()]).as_numpy("output").shape == (1, 512)
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.load_model("absent")


def _slow_input() -> httpclient.InferInput:
    tensor = httpclient.InferInput("input", [1, 512], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 512), np.float32))
    return tensor


def _input(shape: list[int], datatype: str = "FP32", data: object = None) -> dict:
    count = int(np.prod(shape))
    return {"name": "input", "datatype": datatype, "shape": shape,
            "data": data if data is not None else [1] * count}


GOOD = orjson.dumps({"inputs": [_input([1, 16])]})


@pytest.mark.parametrize("path, body, headers, status, message", [
    ("/v2/models/affine/infer", b'{"inputs": [', {}, 400, "malformed JSON"),
    ("/v2/models/affine/infer", orjson.dumps({"inputs": [_input([1, 16], "INT32")]}), {},
     400, "datatype INT32, the model expects FP32"),
    ("/v2/models/affine/infer", orjson.dumps({"inputs": [_input([1, 15])]}), {},
     400, "shape [1, 15], the model expects [batch, 16]"),
    ("/v2/models/affine/infer", orjson.dumps({"inputs": [_input([1, 16], data=[1, 2])]}), {},
     400, "has 2 elements"),
    ("/v2/models/affine/infer", orjson.dumps({"inputs": [_input([9, 16])]}), {},
     400, "exceeds max_batch_size 8"),
    ("/v2/models/affine/infer", orjson.dumps(
        {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16],
                     "parameters": {"binary_data_size": 64}}]}) + b"\0" * 60,
     "binary", 400, "binary_data_size 64 exceeds"),
    ("/v2/models/affine/infer", orjson.dumps({"inputs": [_input([1, 16])],
                                              "parameters": {"priority": -2}}), {},
     400, "priority must be an integer >= 0"),
    ("/v2/models/affine/infer", orjson.dumps({"inputs": [_input([1, 16])],
                                              "outputs": [{"name": "nope"}]}), {},
     400, "unknown output 'nope'"),
    ("/v2/models/nope/infer", GOOD, {}, 404, "unknown model 'nope'"),
    ("/v2/models/affine/versions/7/infer", GOOD, {}, 404, "no ready version 7"),
    ("/v2/models/affine/infer", b"x" * (1024 * 1024 + 1), {}, 413, "exceeds the limit"),
    ("/v2/nothing/here", b"", {}, 404, "no route"),
])
def test_bad_requests(server: Server, path: str, body: bytes, headers: object, status: int,
                      message: str) -> None:
    sent_headers = {}
    if headers == "binary":
        sent_headers["Inference-Header-Content-Length"] = str(body.index(b"}]}") + 3)
    got, payload = server.request("POST", path, body, sent_headers)
    assert got == status
    error = orjson.loads(payload)["error"]
    assert message in error
    ok, answer = server.request("POST", "/v2/models/affine/infer", GOOD)
    assert ok == 200 and orjson.loads(answer)["outputs"][0]["data"][0] == 3.0


def test_compressed_body_over_the_limit(server: Server) -> None:
    bomb = gzip.compress(b"0" * (2 * 1024 * 1024))  # inflates past the 1 MiB limit
    status, payload = server.request("POST", "/v2/models/affine/infer", bomb,
                                     {"Content-Encoding": "gzip"})
    assert status == 413 and "decompressed" in orjson.loads(payload)["error"]
    status, payload = server.request("POST", "/v2/models/affine/infer", b"junk",
                                     {"Content-Encoding": "gzip"})
    assert status == 400 and "cannot decompress" in orjson.loads(payload)["error"]


def test_metrics(server: Server, client: httpclient.InferenceServerClient) -> None:
    _infer(client, np.zeros((1, 16), np.float32), True)
    status, body = server.request("GET", "/metrics")
    text = body.decode()
    assert status == 200
    for line in ('turboinfer_request_success_total{model="affine",version="1"}',
                 'turboinfer_inference_total{model="affine",version="1"}',
                 'turboinfer_execution_total{model="affine",version="1"}',
                 'turboinfer_request_failure_total{model="affine",reason="invalid_input",'
                 'version="1"}',
                 "turboinfer_queue_duration_seconds_bucket", "turboinfer_batch_size_bucket",
                 "turboinfer_pending_requests", "turboinfer_loaded_models 2.0",
                 "turboinfer_process_resident_memory_bytes"):
        assert line in text, line
