"""The OIP ingress in front of the model replicas: the URLs of ``turboinfer serve``.

Requests under /v2/models/NAME go whole (method, path, headers, raw body) to a replica of
that model, which answers them with turboinfer's own handlers; the ingress only reads the
body (within the body limit) and passes bytes both ways, so decoding, batching and
encoding run on the replicas, in parallel. What no single replica can answer is answered
here: health, server metadata, the repository index (each model's replica answers for
its model), statistics and /metrics (replayed from every replica's observations, see
``events``). Loading and unloading belong to the deployment: the API refuses them.

The ingress knows its replicas as ``ReplicaCaller`` objects, so it runs the same with Ray
Serve's deployment handles and with replicas in the same process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Protocol

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from turboinfer import __version__
from turboinfer.errors import (
    ConfigError,
    TurboinferError,
    UnavailableError,
    UnknownModelError,
    reply_for,
)
from turboinfer.scaleout.events import Event, replay
from turboinfer.scaleout.forwarding import Forwarded, Reply
from turboinfer.serve.app import error_response, json_response, reply_response
from turboinfer.serve.core import EXTENSIONS, ServerSettings
from turboinfer.serve.http_infer import error_reply, read_body
from turboinfer.serve.metrics import CONTENT_TYPE, Metrics

log = logging.getLogger(__name__)


class ReplicaCaller(Protocol):
    """One model's replicas, as the ingress calls them (any replica may answer)."""

    async def handle(self, request: Forwarded) -> tuple[Reply, list[Event]]: ...

    async def events(self) -> list[Event]: ...


def forwarded_model(path: str) -> str | None:
    """The model a path belongs to when a replica answers it: everything under
    /v2/models/NAME but the statistics, which cover every replica."""
    parts = path.split("/")
    if len(parts) < 4 or parts[1:3] != ["v2", "models"] or parts[3] in ("", "stats"):
        return None
    return None if parts[-1] == "stats" else parts[3]


class OipIngress:
    """ASGI application: model routes to the replicas, the rest answered here."""

    def __init__(self, replicas: Mapping[str, ReplicaCaller], settings: ServerSettings) -> None:
        self.replicas = dict(replicas)
        self.settings = settings
        self.metrics = Metrics()
        self.routes = Starlette(routes=self._routes(), exception_handlers={
            TurboinferError: _error, HTTPException: _http_error, Exception: _error})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        model = forwarded_model(scope["path"]) if scope["type"] == "http" else None
        if model is None:
            await self.routes(scope, receive, send)
            return
        try:
            reply = await self._forward(model, scope, receive)
        except Exception as exc:  # the client gets the protocol's error shape either way
            reply = Reply(*error_reply(exc))
            reply.headers.append((b"content-length", str(len(reply.body)).encode()))
        await send({"type": "http.response.start", "status": reply.status,
                    "headers": reply.headers})
        await send({"type": "http.response.body", "body": reply.body})

    async def _forward(self, model: str, scope: Scope, receive: Receive) -> Reply:
        caller = self.replicas.get(model)
        if caller is None:
            raise UnknownModelError(f"unknown model {model!r}")
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        length = next((value for name, value in headers if name == b"content-length"), None)
        # Raw bytes within the server's largest body; the replica applies the finer
        # limits (JSON bodies, decompressed size) exactly as ``turboinfer serve`` does.
        body = await read_body(receive, length, None, self.settings.max_body_bytes)
        request = Forwarded(scope["method"], scope["path"], headers, body,
                            scope.get("query_string", b""))
        reply, events = await self._call(model, caller.handle(request))
        replay(self.metrics, events)
        return reply

    async def _call(self, model: str, call: Any) -> Any:
        try:
            return await call
        except TurboinferError:
            raise
        except Exception as exc:  # a replica that died or was removed mid-request
            log.warning("a replica of model %s failed: %s", model, exc)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise UnavailableError(f"the replica serving model {model!r} failed: "
                                   f"{first[:200]}") from None

    async def _collect(self, models: list[str]) -> None:
        """Replay what the replicas observed and have not yet sent with an answer."""
        results = await asyncio.gather(*(self._call(m, self.replicas[m].events())
                                         for m in models))
        for events in results:
            replay(self.metrics, events)

    async def _ask(self, model: str, method: str, path: str) -> Reply:
        reply: Reply
        reply, events = await self._call(model, self.replicas[model].handle(
            Forwarded(method, path, [])))
        replay(self.metrics, events)
        return reply

    # --- the routes answered here ---------------------------------------------------
    async def live(self, request: Request) -> Response:
        return json_response({"live": True})

    async def ready(self, request: Request) -> Response:
        replies = await asyncio.gather(*(self._ask(m, "GET", f"/v2/models/{m}/ready")
                                         for m in self.replicas))
        waiting = [m for m, reply in zip(self.replicas, replies, strict=True)
                   if reply.status != 200]
        if waiting:
            raise UnavailableError(f"server not ready: model(s) {', '.join(waiting)} not ready")
        return json_response({"ready": True})

    async def server_metadata(self, request: Request) -> Response:
        return json_response({"name": "turboinfer", "version": __version__,
                              "extensions": EXTENSIONS})

    async def repository_index(self, request: Request) -> Response:
        replies = await asyncio.gather(*(self._ask(m, "POST", "/v2/repository/index")
                                         for m in self.replicas))
        index: list[Any] = []
        for reply in replies:
            index += orjson.loads(reply.body) if reply.status == 200 else []
        return json_response(index)

    async def model_control(self, request: Request) -> Response:
        raise ConfigError("cannot load or unload models on Ray Serve: each model is a "
                          "deployment; change the repository and deploy it again")

    async def stats(self, request: Request) -> Response:
        model = request.path_params.get("model")
        version = request.path_params.get("version")
        if model is not None and model not in self.replicas:
            raise UnknownModelError(f"unknown model {model!r}")
        await self._collect([model] if model is not None else list(self.replicas))
        chosen = [stats.to_dict() for (name, number), stats
                  in sorted(self.metrics.versions.items())
                  if model in (None, name) and version in (None, number)]
        if version is not None and not chosen:
            raise UnknownModelError(f"model {model!r} has no ready version {version}")
        return json_response({"model_stats": chosen})

    async def scrape(self, request: Request) -> Response:
        await self._collect(list(self.replicas))
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    def _routes(self) -> list[Route]:
        return [
            Route("/v2/health/live", self.live),
            Route("/v2/health/ready", self.ready),
            Route("/v2", self.server_metadata),
            Route("/v2/models/stats", self.stats),
            Route("/v2/models/{model}/stats", self.stats),
            Route("/v2/models/{model}/versions/{version}/stats", self.stats),
            Route("/v2/repository/index", self.repository_index, methods=["GET", "POST"]),
            Route("/v2/repository/models/{model}/load", self.model_control, methods=["POST"]),
            Route("/v2/repository/models/{model}/unload", self.model_control,
                  methods=["POST"]),
            Route("/metrics", self.scrape),
        ]


async def _error(request: Request, exc: Exception) -> Response:
    return reply_response(reply_for(exc))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    detail = exc.detail if exc.status_code != 404 else f"no route {request.url.path}"
    return error_response(str(detail), exc.status_code)
