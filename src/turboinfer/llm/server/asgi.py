"""Small ASGI pieces: JSON responses and a server-sent-event stream that aborts its
generation the moment the client disconnects."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from turboinfer.llm.engine.sequence import Sequence
from turboinfer.llm.server.generation import Generation

SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"),
               (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


def json_response(body: object, status: int = 200,
                  headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status, headers, media_type="application/json")


class EventStream(Response):
    """SSE over ASGI. A task watches for the client's disconnect: writes to a closed
    connection do not fail under uvicorn, and a request still waiting for its first
    token has nothing to write, yet both must be aborted at once."""

    def __init__(self, events: AsyncIterator[bytes], gen: Generation) -> None:
        self._events = events
        self._gen = gen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.create_task(_watch_disconnect(receive, self._gen))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            async for chunk in self._events:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()
            self._gen.close()


async def _watch_disconnect(receive: Receive, gen: Generation) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    gen.cancel()


async def completed(receive: Receive, gen: Generation) -> list[Sequence]:
    """Wait for a non-streamed generation, aborting it if the client goes away."""
    watcher = asyncio.create_task(_watch_disconnect(receive, gen))
    try:
        return await gen.wait()
    finally:
        watcher.cancel()
        gen.close()
