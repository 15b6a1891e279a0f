"""The gRPC endpoint through tritonclient.grpc."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from test_malformed import GRPC_CORPUS
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from turboinfer.serve.grpc_service import STREAM_IN_FLIGHT
from turboinfer.serve.request_log import one_line

if TYPE_CHECKING:
    from conftest import Server


@pytest.fixture(scope="module")
def client(server: Server) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(server.grpc_url)


def _tensor(x: np.ndarray, datatype: str = "FP32") -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("input", list(x.shape), datatype)
    tensor.set_data_from_numpy(x)
    return tensor


def test_health_metadata_config(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("affine") and not client.is_model_ready("nope")
    assert client.get_server_metadata(as_json=True)["name"] == "turboinfer"
    meta = client.get_model_metadata("affine", as_json=True)
    assert meta["inputs"][0] == {"name": "input", "datatype": "FP32", "shape": ["-1", "16"]}
    config = client.get_model_config("affine", as_json=True)["config"]
    assert config["max_batch_size"] == 8
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == "2000"


def test_infer_and_stats(client: grpcclient.InferenceServerClient) -> None:
    x = np.arange(48, dtype=np.float32).reshape(3, 16)
    result = client.infer("affine", [_tensor(x)], request_id="g1",
                          outputs=[grpcclient.InferRequestedOutput("output")], priority=2)
    np.testing.assert_allclose(result.as_numpy("output"), 2 * x + 1)
    response = result.get_response(as_json=True)
    assert response["model_version"] == "1" and response["id"] == "g1"
    stats = client.get_inference_statistics("affine", as_json=True)["model_stats"][0]
    assert int(stats["inference_count"]) >= 3
    assert stats["batch_stats"] and "compute_infer" in stats["batch_stats"][0]


def test_errors_carry_status(client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="unknown model") as info:
        client.infer("nope", [_tensor(np.zeros((1, 16), np.float32))])
    assert "NOT_FOUND" in str(info.value.status())
    with pytest.raises(InferenceServerException, match="datatype INT32") as info:
        client.infer("affine", [_tensor(np.zeros((1, 16), np.int32), "INT32")])
    assert "INVALID_ARGUMENT" in str(info.value.status())
    good = client.infer("affine", [_tensor(np.zeros((1, 16), np.float32))])
    assert good.as_numpy("output")[0, 0] == 1.0


def test_repository(client: grpcclient.InferenceServerClient) -> None:
    index = client.get_model_repository_index(as_json=True)["models"]
    assert {m["name"] for m in index} == {"affine", "slow"}
    client.unload_model("slow")
    assert not client.is_model_ready("slow")
    client.load_model("slow")
    assert client.is_model_ready("slow")


def _new_log_lines(server: Server, since: int) -> list[str]:
    with server.log.open("rb") as log:
        log.seek(since)
        return log.read().decode().splitlines()


def test_bytes_that_are_no_protobuf_are_invalid_argument_with_one_log_line(
        server: Server) -> None:
    since = server.log.stat().st_size
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as caught:
            call(b"\xff\xff\xff\xff not a protobuf", timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a ModelInferRequest" in (caught.value.details() or "")
    lines = _new_log_lines(server, since)
    assert len(lines) == 1 and "INVALID_ARGUMENT gRPC ModelInfer" in lines[0], lines


def test_each_malformed_request_gets_invalid_argument_and_one_log_line(
        server: Server) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for name, request in GRPC_CORPUS:
            since = server.log.stat().st_size
            with pytest.raises(grpc.RpcError) as caught:
                stub.ModelInfer(request, timeout=30)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
            lines = _new_log_lines(server, since)
            assert len(lines) == 1, (name, lines)
            assert lines[0].endswith(one_line(
                f"INVALID_ARGUMENT gRPC ModelInfer: {caught.value.details()}")), name
    assert "Traceback" not in server.log.read_text()


def test_stream_answers_every_request_by_id(client: grpcclient.InferenceServerClient) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        # All sent before any is read: several are in flight on the one stream at once.
        for i in range(20):
            x = np.full((1 + i % 3, 16), i, np.float32)
            client.async_stream_infer("affine", [_tensor(x)], request_id=f"s{i}")
        got = [answers.get(timeout=30) for _ in range(20)]
    finally:
        client.stop_stream()
    assert all(error is None for _, error in got), [e for _, e in got if e]
    by_id = {result.get_response().id: result for result, _ in got}
    assert sorted(by_id) == sorted(f"s{i}" for i in range(20))
    for i in range(20):
        x = np.full((1 + i % 3, 16), i, np.float32)
        np.testing.assert_allclose(by_id[f"s{i}"].as_numpy("output"), 2 * x + 1)


def test_stream_answers_more_requests_than_it_holds_in_flight(
        client: grpcclient.InferenceServerClient) -> None:
    """Past STREAM_IN_FLIGHT the server stops reading the stream until answers go out;
    every request sent ahead still gets its answer."""
    count = 2 * STREAM_IN_FLIGHT + 1
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for i in range(count):
            client.async_stream_infer("affine", [_tensor(np.full((1, 16), i, np.float32))],
                                      request_id=str(i))
        got = [answers.get(timeout=60) for _ in range(count)]
    finally:
        client.stop_stream()
    assert all(error is None for _, error in got), [e for _, e in got if e][:3]
    values = {result.get_response().id: result.as_numpy("output")[0, 0] for result, _ in got}
    assert values == {str(i): 2.0 * i + 1 for i in range(count)}


def test_stream_marks_the_answer_final_when_asked(
        client: grpcclient.InferenceServerClient) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        x = np.zeros((1, 16), np.float32)
        client.async_stream_infer("affine", [_tensor(x)], request_id="plain")
        plain, _ = answers.get(timeout=30)
        client.async_stream_infer("affine", [_tensor(x)], request_id="asked",
                                  enable_empty_final_response=True)
        asked, error = answers.get(timeout=30)
    finally:
        client.stop_stream()
    assert error is None and asked.get_response().id == "asked"
    assert asked.get_response().parameters["triton_final_response"].bool_param is True
    assert "triton_final_response" not in plain.get_response().parameters
    np.testing.assert_allclose(asked.as_numpy("output"), 2 * x + 1)


def test_stream_refuses_one_request_and_goes_on(
        client: grpcclient.InferenceServerClient) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("nope", [_tensor(np.zeros((1, 16), np.float32))],
                                  request_id="bad")
        _, error = answers.get(timeout=30)
        client.async_stream_infer("affine", [_tensor(np.zeros((1, 16), np.float32))],
                                  request_id="good")
        result, after = answers.get(timeout=30)
    finally:
        client.stop_stream()
    assert isinstance(error, InferenceServerException) and "unknown model" in str(error)
    assert after is None and result.get_response().id == "good"
    assert result.as_numpy("output")[0, 0] == 1.0


def test_stream_answers_each_malformed_request_with_an_error_and_one_log_line(
        server: Server) -> None:
    """The malformed corpus and bytes that are no protobuf, all on one stream: each gets
    an ``error_message`` naming the problem, one log line, and the stream stays open
    (a good request after them succeeds)."""
    requests = [request.SerializeToString() for _, request in GRPC_CORPUS]
    requests.append(b"\xff\xff\xff\xff not a protobuf")
    good = service_pb2.ModelInferRequest(model_name="affine", id="last")
    good.inputs.add(name="input", datatype="FP32", shape=[1, 16])
    good.raw_input_contents.append(np.zeros(16, np.float32).tobytes())
    since = server.log.stat().st_size
    answered = threading.Semaphore(0)
    answers = []
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer",
                                     response_deserializer=(
                                         service_pb2.ModelStreamInferResponse.FromString))
        # One at a time, so each answer lines up with its request.
        for answer in call(_paced([*requests, good.SerializeToString()], answered),
                           timeout=60):
            answers.append(answer)
            answered.release()
    assert len(answers) == len(requests) + 1
    names = [name for name, _ in GRPC_CORPUS] + ["no protobuf"]
    for name, answer in zip(names, answers, strict=False):
        assert answer.error_message, name
    assert "not a ModelInferRequest" in answers[len(requests) - 1].error_message
    assert not answers[-1].error_message and answers[-1].infer_response.id == "last"
    lines = _new_log_lines(server, since)
    assert len(lines) == len(requests), lines
    assert all("INVALID_ARGUMENT gRPC ModelStreamInfer" in line for line in lines), lines
    assert "Traceback" not in server.log.read_text()


def _paced(requests: list[bytes], answered: threading.Semaphore) -> Iterator[bytes]:
    """Each request once the previous one's answer is in (grpc pulls this iterator on
    its own thread)."""
    for request in requests:
        yield request
        if not answered.acquire(timeout=30):
            return
