"""A buffered HTTP request and its answer as plain values, and running an ASGI
application on one in-process: how a replica answers what the ingress forwarded with
turboinfer's own HTTP handlers (the infer fast path, the control routes, their errors)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message

Headers = list[tuple[bytes, bytes]]


@dataclass(frozen=True)
class Forwarded:
    method: str
    path: str
    headers: Headers
    body: bytes = b""
    query: bytes = b""


@dataclass
class Reply:
    status: int = 500
    headers: Headers = field(default_factory=list)
    body: bytes = b""


async def call_asgi(app: ASGIApp, request: Forwarded) -> Reply:
    """``app``'s answer to ``request``; the client stays connected until it is sent."""
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1", "method": request.method, "scheme": "http",
        "path": request.path, "raw_path": request.path.encode("latin-1"),
        "query_string": request.query, "root_path": "", "headers": request.headers,
        "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0), "state": {},
    }
    reply = Reply()
    chunks: list[bytes] = []
    answered = asyncio.Event()
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await answered.wait()  # a handler watching for a disconnect sees one only now
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            reply.status = message["status"]
            reply.headers = list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                answered.set()

    try:
        await app(scope, receive, send)
    finally:
        answered.set()
    reply.body = b"".join(chunks)
    return reply
