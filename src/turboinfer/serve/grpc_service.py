"""``inference.GRPCInferenceService`` (KServe v2 / Triton gRPC) on ``grpc.aio``.

The message classes are the protocol's own generated definitions as shipped with
tritonclient. The service runs on the HTTP server's event loop, so both transports share
one batcher per model version. Descriptions come from ``ServerCore`` as Triton's JSON and
are parsed into the messages, so gRPC and HTTP always agree.

``ModelStreamInfer`` carries many infer requests on one call, as Triton's does: each
request runs as it arrives (several in flight on one stream batch together), and each
answer is written when ready, carrying its request's ``id``; a refused request gets a
response with ``error_message`` and the stream goes on. A unary call costs grpc.aio a
task and four completion-queue operations of its own, a streamed request one read and
one write, which is why a busy client should stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import numpy as np
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from turboinfer.errors import ConfigError, InvalidInputError, TurboinferError, reply_for
from turboinfer.serve.core import ServerCore
from turboinfer.serve.protocol import (
    InferRequest,
    RequestedOutput,
    apply_parameters,
    check_tensor_parameters,
    check_unique_outputs,
    classification_count,
    datatype_of,
    from_raw,
    from_values,
    raw_bytes,
    tensor_spec,
)
from turboinfer.serve.request_log import log as request_log
from turboinfer.serve.request_log import logged, one_line

log = logging.getLogger(__name__)
SERVICE = "inference.GRPCInferenceService"
# Typed (non-raw) contents fields by datatype, for clients that do not send raw bytes.
_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
             "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
             "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
             "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}

# Requests one stream may have in flight: past it the stream is not read until one is
# answered, so a client that sends without reading its answers holds bounded memory here
# (HTTP/2 flow control then holds back its sends).
STREAM_IN_FLIGHT = 128
# A stream's client may ask that each request's last response be marked final.
_FINAL_ASKED = "triton_enable_empty_final_response"
_FINAL = "triton_final_response"

T = TypeVar("T")


async def _guard(context: grpc.aio.ServicerContext, call: Callable[[], Awaitable[T]],
                 method: str = "") -> T:
    """Run ``call``; a failure aborts the RPC with the code ``reply_for`` gives it. A
    request refused as the client's fault gets one log line (as on HTTP), a failure of
    the server's own its traceback."""
    try:
        return await call()
    except Exception as exc:
        reply = reply_for(exc)
        if not isinstance(exc, TurboinferError):
            log.exception("gRPC call failed")
        elif logged(reply.http_status):
            request_log.warning("%s", one_line(f"{reply.grpc_code} gRPC {method}: "
                                               f"{reply.message}"))
        await context.abort(grpc.StatusCode[reply.grpc_code], reply.message)
        raise  # abort raises; this line only satisfies the type checker


def parse_infer(data: bytes) -> Any:
    """The ModelInferRequest in ``data``; bytes that are not one are the client's fault."""
    try:
        return service_pb2.ModelInferRequest.FromString(data)
    except DecodeError as exc:
        raise InvalidInputError(f"the request is not a ModelInferRequest: {exc}") from None


def decode_infer(request: Any) -> InferRequest:
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidInputError(f"{len(raw)} raw_input_contents for {len(request.inputs)} "
                                "inputs")
    inputs: dict[str, np.ndarray] = {}
    for index, tensor in enumerate(request.inputs):
        name = tensor.name
        if name in inputs:
            raise InvalidInputError(f"input {name!r} appears twice in the request")
        # The same checks as the HTTP door: shape and datatype in the one codec.
        dtype, shape, count = tensor_spec(name, tensor.datatype, list(tensor.shape))
        check_tensor_parameters(f"input {name!r}", _values(tensor.parameters))
        if raw:
            inputs[name] = from_raw(name, raw[index], dtype, shape)
        else:
            inputs[name] = _from_contents(tensor, dtype, shape, count)
    decoded = InferRequest(inputs=inputs, id=request.id or None)
    apply_parameters(decoded, _values(request.parameters))
    if request.outputs:
        decoded.outputs = [_output(o) for o in request.outputs]
        check_unique_outputs(decoded.outputs)
    return decoded


def _values(params: Any) -> dict[str, Any] | None:
    """Protobuf parameters as the plain dict the HTTP door reads from JSON."""
    if not params:
        return None
    values: dict[str, Any] = {}
    for key, param in params.items():
        which = param.WhichOneof("parameter_choice")
        values[key] = getattr(param, which) if which else None
    return values


def _output(output: Any) -> RequestedOutput:
    params = check_tensor_parameters(f"output {output.name!r}", _values(output.parameters))
    return RequestedOutput(output.name, True, classification_count(output.name, params))


def _from_contents(tensor: Any, dtype: np.dtype, shape: tuple[int, ...],
                   count: int) -> np.ndarray:
    field = _CONTENTS.get(tensor.datatype)
    if field is None:
        raise InvalidInputError(f"input {tensor.name!r}: {tensor.datatype} must be sent in "
                                "raw_input_contents")
    return from_values(tensor.name, list(getattr(tensor.contents, field)), dtype, shape,
                       count)


def encode_infer(model: str, version: str, request: InferRequest,
                 outputs: dict[str, np.ndarray], response: Any = None) -> Any:
    """The ModelInferResponse, built in ``response`` when given (a stream's message)."""
    names = [o.name for o in request.outputs] if request.outputs else list(outputs)
    if response is None:
        response = service_pb2.ModelInferResponse()
    response.model_name, response.model_version = model, version
    response.id = request.id or ""
    for name in names:
        array = outputs[name]
        response.outputs.add(name=name, datatype=datatype_of(array.dtype), shape=array.shape)
        data = raw_bytes(array)
        response.raw_output_contents.append(data if isinstance(data, bytes) else data.tobytes())
    return response


class InferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, core: ServerCore) -> None:
        self.core = core

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.core.ready)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        ready = self.core.model_ready(request.name, request.version or None)
        return service_pb2.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return json_format.ParseDict(self.core.server_metadata(),
                                     service_pb2.ServerMetadataResponse())

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            data = self.core.model_metadata(request.name, request.version or None)
            # The raw inputs' parameters (what they fill) have no field in the protobuf.
            return json_format.ParseDict(data, service_pb2.ModelMetadataResponse(),
                                         ignore_unknown_fields=True)
        return await _guard(context, call)

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            data = self.core.model_config(request.name, request.version or None)
            config = json_format.ParseDict(data, model_config_pb2.ModelConfig())
            return service_pb2.ModelConfigResponse(config=config)
        return await _guard(context, call)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            data = self.core.statistics(request.name or None, request.version or None)
            return json_format.ParseDict(data, service_pb2.ModelStatisticsResponse(),
                                         ignore_unknown_fields=True)
        return await _guard(context, call)

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            decoded = decode_infer(request)
            served, outputs = await self.core.infer(request.model_name,
                                                    request.model_version or None, decoded)
            return encode_infer(served.name, served.label, decoded, outputs)
        return await _guard(context, call, "ModelInfer")

    async def model_infer_bytes(self, data: bytes, context: Any) -> bytes:
        """ModelInfer on the wire's bytes: parsed here, so a body that is no protobuf
        gets INVALID_ARGUMENT (grpc's own deserializer would fail the call with a
        traceback in the log)."""
        async def call() -> bytes:
            request = parse_infer(data)
            decoded = decode_infer(request)
            served, outputs = await self.core.infer(request.model_name,
                                                    request.model_version or None, decoded)
            response = encode_infer(served.name, served.label, decoded, outputs)
            return bytes(response.SerializeToString())
        return await _guard(context, call, "ModelInfer")

    async def model_stream_infer_bytes(self, requests: Any, context: Any) -> None:
        """ModelStreamInfer on the wire's bytes: each request runs in its own task as
        it arrives; answers go out one write at a time, in the order they finish."""
        writing = asyncio.Lock()  # grpc.aio takes one write at a time
        running: set[asyncio.Task[None]] = set()
        room = asyncio.Semaphore(STREAM_IN_FLIGHT)

        def finished(task: asyncio.Task[None]) -> None:
            running.discard(task)
            room.release()

        try:
            while True:
                await room.acquire()
                data = await context.read()
                if data is grpc.aio.EOF:
                    break
                task = asyncio.create_task(self._stream_one(data, context, writing))
                running.add(task)
                task.add_done_callback(finished)
            if running:
                await asyncio.gather(*running)
        finally:
            for task in running:  # the client went away: nobody reads these answers
                task.cancel()

    async def _stream_one(self, data: bytes, context: Any, writing: asyncio.Lock) -> None:
        message = service_pb2.ModelStreamInferResponse()
        request: Any = None
        try:
            request = parse_infer(data)
            decoded = decode_infer(request)
            served, outputs = await self.core.infer(request.model_name,
                                                    request.model_version or None, decoded)
            encode_infer(served.name, served.label, decoded, outputs,
                         message.infer_response)
            if decoded.parameters.get(_FINAL_ASKED) is True:
                # A model here answers once: that answer is the final one (Triton marks
                # it so, with no empty response after, for a model that is not decoupled).
                message.infer_response.parameters[_FINAL].bool_param = True
        except Exception as exc:
            message = _stream_error(exc, request)
        async with writing:
            try:
                await context.write(message.SerializeToString())
            except Exception:  # the call ended (client gone): nobody reads this answer
                log.debug("stream answer not written: the call has ended", exc_info=True)

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        return json_format.ParseDict({"models": self.core.repository_index()},
                                     service_pb2.RepositoryIndexResponse())

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            await self.core.load(request.model_name)
            return service_pb2.RepositoryModelLoadResponse()
        return await _guard(context, call)

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            await self.core.unload(request.model_name)
            return service_pb2.RepositoryModelUnloadResponse()
        return await _guard(context, call)


def _stream_error(exc: Exception, request: Any) -> Any:
    """A stream's answer to a refused request: Triton's ``error_message``, with the
    request's id and model so the client can tell which one failed."""
    reply = reply_for(exc)
    if not isinstance(exc, TurboinferError):
        log.exception("gRPC stream request failed")
    elif logged(reply.http_status):
        request_log.warning("%s", one_line(f"{reply.grpc_code} gRPC ModelStreamInfer: "
                                           f"{reply.message}"))
    message = service_pb2.ModelStreamInferResponse(error_message=reply.message)
    if request is not None:
        message.infer_response.id = request.id
        message.infer_response.model_name = request.model_name
        message.infer_response.model_version = request.model_version
    return message


async def start_grpc(core: ServerCore, host: str, port: int) -> tuple[Any, int]:
    """Start the service; returns the server and the bound port (``port`` 0: any)."""
    limit = core.settings.max_body_bytes
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit),
                                      ("grpc.max_send_message_length", -1)])
    _register(server, InferenceService(core))
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:
        raise ConfigError(f"cannot listen on {host}:{port} for gRPC (port in use?)") from None
    await server.start()
    return server, bound


class _Handlers:
    """Stands in for the server while the generated code registers the service, to
    collect its method handlers: ModelInfer's and ModelStreamInfer's are then replaced by
    the bytes ones."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None: ...

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        self.handlers = dict(handlers)


def _register(server: Any, service: InferenceService) -> None:
    collected = _Handlers()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(service, collected)
    handlers = collected.handlers
    handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(service.model_infer_bytes)
    handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
        service.model_stream_infer_bytes)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)
