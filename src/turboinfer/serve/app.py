"""HTTP routes of the Open Inference Protocol (KServe v2) on Starlette.

Every error leaves as ``{"error": "..."}`` with the error's HTTP status: tritonclient
reads exactly that key. Large JSON bodies are decoded and encoded on a worker thread so a
10 MB request does not stall every other connection on the event loop.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from turboinfer.errors import InvalidInputError, PayloadTooLargeError, TurboinferError
from turboinfer.serve.core import ServerCore
from turboinfer.serve.metrics import CONTENT_TYPE
from turboinfer.serve.protocol import decode_request, encode_response

JSON = "application/json"
# Above this many bytes a JSON body is decoded off the event loop.
OFFLOAD_BYTES = 256 * 1024


def json_response(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type=JSON)


def error_response(message: str, status: int) -> Response:
    return json_response({"error": message}, status)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed ``limit``."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise PayloadTooLargeError(f"request body of {length} bytes exceeds the limit of "
                                   f"{limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    encoding = request.headers.get("content-encoding")
    return decompress(body, encoding, limit) if encoding else body


# zlib window bits: gzip header, or a zlib (RFC 1950) stream for "deflate".
_ENCODINGS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """A compressed request body (tritonclient's request_compression_algorithm), inflated
    no further than ``limit`` bytes so a small bomb cannot exhaust memory."""
    bits = _ENCODINGS.get(encoding.strip().lower())
    if bits is None:
        if encoding.strip().lower() == "identity":
            return body
        raise InvalidInputError(f"unsupported Content-Encoding {encoding!r}; use gzip or "
                                "deflate")
    inflater = zlib.decompressobj(bits)
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidInputError(f"cannot decompress the {encoding} body: {exc}") from None
    if len(data) > limit or inflater.unconsumed_tail:
        raise PayloadTooLargeError(f"decompressed request body exceeds the limit of {limit} "
                                   "bytes")
    return data


def _header_length(request: Request) -> int | None:
    value = request.headers.get("inference-header-content-length")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidInputError(
            f"Inference-Header-Content-Length must be an integer, got {value!r}") from None


def _version(request: Request) -> str | None:
    version: str | None = request.path_params.get("version")
    return version


class HttpApi:
    """The route handlers over one ``ServerCore``."""

    def __init__(self, core: ServerCore) -> None:
        self.core = core
        self.limit = core.settings.max_body_bytes

    async def infer(self, request: Request) -> Response:
        body = await read_body(request, self.limit)
        header_length = _header_length(request)
        if header_length is None and len(body) > OFFLOAD_BYTES:
            decoded = await asyncio.to_thread(decode_request, body, header_length)
        else:
            decoded = decode_request(body, header_length)
        served, outputs = await self.core.infer(request.path_params["model"],
                                                _version(request), decoded)
        content, json_length = encode_response(served.name, served.label, decoded, outputs)
        if json_length is None:
            return Response(content, media_type=JSON)
        return Response(content, media_type="application/octet-stream",
                        headers={"Inference-Header-Content-Length": str(json_length)})

    async def live(self, request: Request) -> Response:
        return json_response({"live": True})

    async def ready(self, request: Request) -> Response:
        if self.core.ready:
            return json_response({"ready": True})
        reason = "draining" if self.core.draining else "starting"
        return error_response(f"server not ready: {reason}", 503)

    async def server_metadata(self, request: Request) -> Response:
        return json_response(self.core.server_metadata())

    async def model_metadata(self, request: Request) -> Response:
        return json_response(self.core.model_metadata(request.path_params["model"],
                                                      _version(request)))

    async def model_ready(self, request: Request) -> Response:
        model = request.path_params["model"]
        if model not in self.core.repository.models:
            return error_response(f"unknown model {model!r}", 404)
        if self.core.model_ready(model, _version(request)):
            return json_response({"name": model, "ready": True})
        return error_response(f"model {model!r} is not ready", 400)

    async def model_config(self, request: Request) -> Response:
        return json_response(self.core.model_config(request.path_params["model"],
                                                    _version(request)))

    async def model_stats(self, request: Request) -> Response:
        return json_response(self.core.statistics(request.path_params.get("model"),
                                                  _version(request)))

    async def repository_index(self, request: Request) -> Response:
        return json_response(self.core.repository.index())

    async def load(self, request: Request) -> Response:
        await read_body(request, self.limit)  # config overrides in the body are not supported
        await self.core.load(request.path_params["model"])
        return json_response({})

    async def unload(self, request: Request) -> Response:
        await read_body(request, self.limit)
        await self.core.unload(request.path_params["model"])
        return json_response({})

    async def metrics(self, request: Request) -> Response:
        return Response(self.core.metrics.render(), media_type=CONTENT_TYPE)

    def routes(self) -> list[Route]:
        model_routes: list[Route] = []
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            model_routes += [
                Route(prefix, self.model_metadata),
                Route(prefix + "/ready", self.model_ready),
                Route(prefix + "/infer", self.infer, methods=["POST"]),
                Route(prefix + "/config", self.model_config),
                Route(prefix + "/stats", self.model_stats),
            ]
        return [
            Route("/v2/health/live", self.live),
            Route("/v2/health/ready", self.ready),
            Route("/v2", self.server_metadata),
            Route("/v2/models/stats", self.model_stats),
            *model_routes,
            Route("/v2/repository/index", self.repository_index, methods=["GET", "POST"]),
            Route("/v2/repository/models/{model}/load", self.load, methods=["POST"]),
            Route("/v2/repository/models/{model}/unload", self.unload, methods=["POST"]),
            Route("/metrics", self.metrics),
        ]


def create_app(core: ServerCore) -> Starlette:
    """The Starlette application serving ``core``."""
    return Starlette(routes=HttpApi(core).routes(), exception_handlers={
        TurboinferError: _domain_error,
        HTTPException: _http_error,
        Exception: _internal_error,
    })


async def _domain_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, TurboinferError)
    return error_response(exc.message, exc.http_status)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    detail = exc.detail if exc.status_code != 404 else f"no route {request.url.path}"
    return error_response(str(detail), exc.status_code)


async def _internal_error(request: Request, exc: Exception) -> Response:
    return error_response(f"internal error: {type(exc).__name__}: {exc}", 500)
