"""OIP clients: what a load test needs from a server, over HTTP or gRPC.

``infer`` is the hot path: it sends bytes prepared once by ``prepare`` and answers only
"ok" (``None``) or the kind of failure ("http_503", "timeout", "connection",
"grpc_UNAVAILABLE"), keeping the first message of each kind for the report.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import orjson

from turboinfer.errors import UnknownModelError
from turboinfer.load.endpoint import Endpoint
from turboinfer.load.failures import CONNECTION, TIMEOUT, ErrorLog, ServerError
from turboinfer.load.http_client import HttpClient, Response, build_request
from turboinfer.load.inputs import ModelInfo, parse_metadata
from turboinfer.load.protocol import encode_http

# ServerError stays importable from here, where the load modules have always found it.
__all__ = ["HttpInferClient", "InferClient", "ServerError", "make_client"]


class InferClient(Protocol):
    endpoint: Endpoint

    async def model_info(self, model: str, version: str) -> ModelInfo: ...

    def prepare(self, info: ModelInfo, tensors: Mapping[str, np.ndarray], *,
                binary: bool) -> bytes: ...

    async def infer(self, request: bytes) -> str | None: ...

    async def check(self, request: bytes) -> None: ...

    def error_details(self) -> dict[str, str]: ...

    async def close(self) -> None: ...


class HttpInferClient:
    def __init__(self, endpoint: Endpoint, *, timeout_s: float, max_connections: int) -> None:
        self.endpoint = endpoint
        self._http = HttpClient(endpoint, timeout_s=timeout_s, max_connections=max_connections)
        self._version = ""
        self._errors = ErrorLog()

    async def get(self, path: str) -> Response:
        """A cold-path GET; connection failures become a one-line :class:`ServerError`."""
        try:
            return await self._http.send(build_request(self.endpoint, "GET", path))
        except TimeoutError:
            raise ServerError(f"{self.endpoint.url}{path}: no answer (timed out)") from None
        except OSError as exc:
            raise ServerError(f"cannot reach {self.endpoint.url}: {_reason(exc)}") from None

    async def model_info(self, model: str, version: str) -> ModelInfo:
        versioned = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
        response = await self.get(versioned)
        if response.status == 404:
            raise UnknownModelError(f"model {model!r} not found at {self.endpoint.url}: "
                                    f"{response.error_message()}")
        if not response.ok:
            raise ServerError(f"{self.endpoint.url}{versioned}: HTTP {response.status}: "
                              f"{response.error_message()}")
        info = parse_metadata(_json(response), version=version)
        self._version = version
        config = await self.get(f"{versioned}/config")
        max_batch = _max_batch_size(_json(config)) if config.ok else 0
        return ModelInfo(info.name, info.version, info.inputs, info.outputs, max_batch)

    def prepare(self, info: ModelInfo, tensors: Mapping[str, np.ndarray], *,
                binary: bool) -> bytes:
        payload = encode_http(info, tensors, binary=binary, version=self._version)
        return build_request(self.endpoint, "POST", payload.path, payload.body, payload.headers)

    async def infer(self, request: bytes) -> str | None:
        try:
            response = await self._http.send(request)
        except TimeoutError:
            return TIMEOUT
        except OSError as exc:
            return self._errors.note(CONNECTION, _reason(exc))
        if response.ok:
            return None
        return self._errors.note(f"http_{response.status}", response.error_message())

    async def check(self, request: bytes) -> None:
        """Send one request and raise :class:`ServerError` unless it succeeds."""
        try:
            response = await self._http.send(request)
        except TimeoutError:
            raise ServerError(f"{self.endpoint.url}: the first request timed out") from None
        except OSError as exc:
            raise ServerError(f"cannot reach {self.endpoint.url}: {_reason(exc)}") from None
        if not response.ok:
            raise ServerError(f"the server answered HTTP {response.status} to a request: "
                              f"{response.error_message()}")

    def error_details(self) -> dict[str, str]:
        return dict(self._errors.first)

    async def close(self) -> None:
        await self._http.close()


def _reason(exc: OSError) -> str:
    # asyncio's connect errors read "Connect call failed (...)"; the errno says why.
    if exc.errno:
        return os.strerror(exc.errno)
    return str(exc) or type(exc).__name__


def _json(response: Response) -> Any:
    try:
        return orjson.loads(response.body)
    except orjson.JSONDecodeError:
        raise ServerError(f"the server sent JSON that does not parse: "
                          f"{response.body[:80]!r}") from None


def _max_batch_size(config: Any) -> int:
    # Triton answers the config itself; some servers wrap it in {"config": ...}.
    if isinstance(config, dict):
        inner = config.get("config", config)
        if isinstance(inner, dict):
            return int(inner.get("max_batch_size", 0) or 0)
    return 0


def make_client(url: str, *, protocol: str, timeout_s: float,
                max_connections: int) -> InferClient:
    """The client for ``protocol`` ("http" or "grpc"); call inside a running event loop."""
    endpoint = Endpoint.parse(url, protocol=protocol)
    if protocol == "grpc":
        # Optional dependency: grpcio and tritonclient load only for a gRPC test.
        from turboinfer.load.grpc_client import GrpcInferClient

        return GrpcInferClient(endpoint, timeout_s=timeout_s)
    return HttpInferClient(endpoint, timeout_s=timeout_s, max_connections=max_connections)
