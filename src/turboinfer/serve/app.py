"""HTTP routes of the Open Inference Protocol (KServe v2) on Starlette.

Every error leaves as ``{"error": "..."}`` with the status (and Retry-After) that
``errors.reply_for`` gives it: tritonclient reads exactly that key. The infer route
itself lives in ``http_infer`` (the hot path, bare ASGI); these are the control-plane
routes.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from turboinfer.errors import (
    ErrorReply,
    InvalidInputError,
    TurboinferError,
    UnavailableError,
    UnknownModelError,
    reply_for,
)
from turboinfer.serve.core import ServerCore
from turboinfer.serve.http_infer import InferEndpoint
from turboinfer.serve.json_body import parse_json_object
from turboinfer.serve.metrics import CONTENT_TYPE
from turboinfer.serve.request_log import refused, refused_with

JSON = "application/json"


def json_response(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type=JSON)


def error_response(message: str, status: int) -> Response:
    return json_response({"error": message}, status)


def reply_response(reply: ErrorReply) -> Response:
    """The protocol's error shape for a reply from ``reply_for``."""
    return Response(orjson.dumps({"error": reply.message}), status_code=reply.http_status,
                    headers=reply.headers(), media_type=JSON)


def _version(request: Request) -> str | None:
    version: str | None = request.path_params.get("version")
    return version


class HttpApi:
    """The route handlers over one ``ServerCore``."""

    def __init__(self, core: ServerCore) -> None:
        self.core = core

    async def live(self, request: Request) -> Response:
        return json_response({"live": True})

    async def ready(self, request: Request) -> Response:
        if self.core.ready:
            return json_response({"ready": True})
        reason = "draining" if self.core.draining else "starting"
        raise UnavailableError(f"server not ready: {reason}")

    async def server_metadata(self, request: Request) -> Response:
        return json_response(self.core.server_metadata())

    async def model_metadata(self, request: Request) -> Response:
        return json_response(self.core.model_metadata(request.path_params["model"],
                                                      _version(request)))

    async def model_ready(self, request: Request) -> Response:
        model = request.path_params["model"]
        if not self.core.has_model(model):
            raise UnknownModelError(f"unknown model {model!r}")
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
        params = await _control_body(request, {"ready"})
        if not isinstance(params.get("ready", False), bool):
            raise InvalidInputError("'ready' must be true or false")
        index = self.core.repository_index()
        if params.get("ready") is True:
            index = [entry for entry in index if entry.get("state") == "READY"]
        return json_response(index)

    async def load(self, request: Request) -> Response:
        await _control_body(request, set())
        await self.core.load(request.path_params["model"])
        return json_response({})

    async def unload(self, request: Request) -> Response:
        await _control_body(request, {"unload_dependents"})
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


async def _control_body(request: Request, accepted: set[str]) -> dict[str, Any]:
    """The repository API's optional body, ``{"parameters": {...}}`` as Triton's clients send
    it (the index also takes ``ready`` at the top level): a malformed body or a parameter
    this server does not carry out is a 400, never silently ignored."""
    doc = parse_json_object(await request.body())
    params = doc.get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidInputError("'parameters' must be a JSON object")
    merged = {**{k: v for k, v in doc.items() if k != "parameters"}, **params}
    unknown = sorted(set(merged) - accepted)
    if unknown:
        raise InvalidInputError(f"unsupported repository parameter(s): {', '.join(unknown)} "
                                "(model overrides are not loaded from requests; edit the "
                                "repository entry instead)")
    return merged


def create_app(core: ServerCore) -> InferEndpoint:
    """The ASGI application serving ``core``: infer on the fast path, the rest on
    Starlette."""
    routes = Starlette(routes=HttpApi(core).routes(), exception_handlers={
        TurboinferError: _error,
        HTTPException: _http_error,
        Exception: _error,
    })
    return InferEndpoint(core, routes)


async def _error(request: Request, exc: Exception) -> Response:
    refused_with(request.method, request.url.path, exc)
    return reply_response(reply_for(exc))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    detail = exc.detail if exc.status_code != 404 else f"no route {request.url.path}"
    refused(request.method, request.url.path, exc.status_code, str(detail))
    return error_response(str(detail), exc.status_code)

