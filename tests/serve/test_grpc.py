"""The gRPC endpoint through tritonclient.grpc."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from test_malformed import GRPC_CORPUS
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

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
