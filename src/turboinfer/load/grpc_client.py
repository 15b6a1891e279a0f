"""The OIP gRPC client (``inference.GRPCInferenceService``, as Triton and KServe speak it).

Infer requests are serialized protobufs prepared once; the hot path passes those bytes
to a channel method with no serializer, so no protobuf work happens per request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from turboinfer.errors import MissingDependencyError, UnknownModelError
from turboinfer.load.endpoint import Endpoint
from turboinfer.load.failures import TIMEOUT, ErrorLog, ServerError
from turboinfer.load.inputs import ModelInfo, TensorInfo, parse_metadata
from turboinfer.load.protocol import input_datatype, tensor_bytes

try:
    import grpc
    from tritonclient.grpc import service_pb2
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingDependencyError(
        "--protocol grpc needs the grpcio and tritonclient packages: "
        "pip install grpcio 'tritonclient[grpc]'"
    ) from exc

_SERVICE = "/inference.GRPCInferenceService"
_STRING = 13  # model_config_pb2.TYPE_STRING
# No size caps: an image batch easily passes gRPC's 4 MiB default.
_CHANNEL_OPTIONS = [("grpc.max_send_message_length", -1),
                    ("grpc.max_receive_message_length", -1)]

__all__ = ["GrpcInferClient", "encode_grpc"]


class GrpcInferClient:
    def __init__(self, endpoint: Endpoint, *, timeout_s: float) -> None:
        self.endpoint = endpoint
        self._timeout_s = timeout_s
        self._channel = grpc.aio.insecure_channel(endpoint.host_header,
                                                  options=_CHANNEL_OPTIONS)
        self._infer = self._channel.unary_unary(f"{_SERVICE}/ModelInfer")
        self._version = ""
        self._errors = ErrorLog()

    async def _call(self, method: str, request: Any, response_type: Any) -> Any:
        call = self._channel.unary_unary(
            f"{_SERVICE}/{method}",
            request_serializer=type(request).SerializeToString,
            response_deserializer=response_type.FromString,
        )
        try:
            return await call(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                raise UnknownModelError(f"{self.endpoint.host_header}: {exc.details()}") from None
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise ServerError(f"cannot reach grpc://{self.endpoint.host_header}: "
                                  f"{exc.details()}") from None
            raise ServerError(f"{method}: {exc.code().name}: {exc.details()}") from None

    async def model_info(self, model: str, version: str) -> ModelInfo:
        request = service_pb2.ModelMetadataRequest(name=model, version=version)
        meta = await self._call("ModelMetadata", request, service_pb2.ModelMetadataResponse)
        doc = {
            "name": meta.name,
            "versions": list(meta.versions),
            "inputs": [_tensor(t) for t in meta.inputs],
            "outputs": [_tensor(t) for t in meta.outputs],
        }
        info = parse_metadata(doc, version=version)
        self._version = version
        inputs = info.inputs
        try:
            config = await self._call("ModelConfig", service_pb2.ModelConfigRequest(
                name=model, version=version), service_pb2.ModelConfigResponse)
            max_batch = int(config.config.max_batch_size)
            inputs = _mark_raw(inputs, config.config)
        except ServerError:
            max_batch = 0
        return ModelInfo(info.name, info.version, inputs, info.outputs, max_batch)

    def prepare(self, info: ModelInfo, tensors: Mapping[str, np.ndarray], *,
                binary: bool) -> bytes:
        # gRPC always carries raw tensor contents; ``binary`` matters only to HTTP.
        return encode_grpc(info, tensors, version=self._version)

    async def infer(self, request: bytes) -> str | None:
        try:
            await self._infer(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return TIMEOUT
            return self._errors.note(f"grpc_{exc.code().name}", exc.details() or "")
        return None

    async def check(self, request: bytes) -> None:
        kind = await self.infer(request)
        if kind is not None:
            detail = self._errors.first.get(kind, "")
            raise ServerError(f"the server answered {kind} to a request: {detail}")

    def error_details(self) -> dict[str, str]:
        return dict(self._errors.first)

    async def close(self) -> None:
        await self._channel.close()


def encode_grpc(info: ModelInfo, tensors: Mapping[str, np.ndarray], *,
                version: str = "") -> bytes:
    """A serialized ``inference.ModelInferRequest`` with raw input contents."""
    request = service_pb2.ModelInferRequest(model_name=info.name, model_version=version)
    for name, array in tensors.items():
        datatype = input_datatype(info, name)
        request.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        request.raw_input_contents.append(tensor_bytes(array, datatype))
    return bytes(request.SerializeToString())


def _mark_raw(inputs: tuple[TensorInfo, ...], config: Any) -> tuple[TensorInfo, ...]:
    """gRPC metadata cannot say which inputs the server pre-processes; its config marks
    them as optional strings (kind unknown: "raw")."""
    raw = {i.name for i in config.input if i.optional and i.data_type == _STRING}
    return tuple(replace(spec, preprocess="raw") if spec.name in raw else spec
                 for spec in inputs)


def _tensor(t: Any) -> dict[str, Any]:
    return {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
