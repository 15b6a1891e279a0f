"""HTTP routes of the Open Inference Protocol (KServe v2) on Starlette.

Every error leaves as ``{"error": "..."}`` with the error's HTTP status: tritonclient
reads exactly that key. Large JSON bodies are decoded and encoded on a worker thread so a
10 MB request does not stall every other connection on the event loop.
"""

from __future__ import annotations

import asyncio
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
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


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


def create_app(core: ServerCore) -> Starlette:
    """The Starlette application serving ``core``."""
    limit = core.settings.max_body_bytes

    async def infer(request: Request) -> Response:
        body = await read_body(request, limit)
        header_length = _header_length(request)
        if header_length is None and len(body) > OFFLOAD_BYTES:
            decoded = await asyncio.to_thread(decode_request, body, header_length)
        else:
            decoded = decode_request(body, header_length)
        served, outputs = await core.infer(request.path_params["model"], _version(request),
                                           decoded)
        content, json_length = encode_response(served.name, served.label, decoded, outputs)
        if json_length is None:
            return Response(content, media_type=JSON)
        return Response(content, media_type="application/octet-stream",
                        headers={"Inference-Header-Content-Length": str(json_length)})

    async def live(request: Request) -> Response:
        return json_response({"live": True})

    async def ready(request: Request) -> Response:
        if core.ready:
            return json_response({"ready": True})
        reason = "draining" if core.draining else "starting"
        return error_response(f"server not ready: {reason}", 503)

    async def server_metadata(request: Request) -> Response:
        return json_response(core.server_metadata())

    async def model_metadata(request: Request) -> Response:
        return json_response(core.model_metadata(request.path_params["model"],
                                                 _version(request)))

    async def model_ready(request: Request) -> Response:
        model = request.path_params["model"]
        if core.model_ready(model, _version(request)):
            return json_response({"name": model, "ready": True})
        return error_response(f"model {model!r} is not ready", 400)

    async def model_config(request: Request) -> Response:
        return json_response(core.model_config(request.path_params["model"],
                                               _version(request)))

    async def model_stats(request: Request) -> Response:
        return json_response(core.statistics(request.path_params.get("model"),
                                             _version(request)))

    async def repository_index(request: Request) -> Response:
        return json_response(core.repository.index())

    async def load(request: Request) -> Response:
        await read_body(request, limit)  # parameters (config overrides) are not supported
        await core.load(request.path_params["model"])
        return json_response({})

    async def unload(request: Request) -> Response:
        await read_body(request, limit)
        await core.unload(request.path_params["model"])
        return json_response({})

    async def metrics(request: Request) -> Response:
        return Response(core.metrics.render(), media_type=CONTENT_TYPE)

    model_routes: list[Route] = []
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        model_routes += [
            Route(prefix, model_metadata),
            Route(prefix + "/ready", model_ready),
            Route(prefix + "/infer", infer, methods=["POST"]),
            Route(prefix + "/config", model_config),
            Route(prefix + "/stats", model_stats),
        ]
    routes = [
        Route("/v2/health/live", live),
        Route("/v2/health/ready", ready),
        Route("/v2", server_metadata),
        Route("/v2/models/stats", model_stats),
        *model_routes,
        Route("/v2/repository/index", repository_index, methods=["GET", "POST"]),
        Route("/v2/repository/models/{model}/load", load, methods=["POST"]),
        Route("/v2/repository/models/{model}/unload", unload, methods=["POST"]),
        Route("/metrics", metrics),
    ]
    return Starlette(routes=routes, exception_handlers={
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
