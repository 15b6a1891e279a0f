"""The HTTP infer endpoint as a bare ASGI handler, in front of the Starlette routes.

Infer is the hot path: it skips Starlette's middleware stack, router regexes and
``Request`` objects (a fifth of the server's busy time per small request when profiled)
and reads the three headers it needs straight from the ASGI scope. Every other path
falls through to the Starlette application.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Awaitable, Callable

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from turboinfer.errors import InvalidInputError, PayloadTooLargeError, TurboinferError, reply_for
from turboinfer.serve.body_budget import BodyBudget
from turboinfer.serve.core import ServerCore
from turboinfer.serve.protocol import decode_request, encode_response
from turboinfer.serve.request_log import refused_with

log = logging.getLogger(__name__)

Headers = list[tuple[bytes, bytes]]
# The request body given its Content-Length, Content-Encoding and the limit it must keep.
BodyReader = Callable[[bytes | None, bytes | None, int], Awaitable[bytes]]

# Above this many bytes a JSON body is decoded off the event loop, so one 10 MB request
# does not stall every other connection.
OFFLOAD_BYTES = 256 * 1024
_JSON_HEADERS = [(b"content-type", b"application/json")]
# zlib window bits: gzip header, or a zlib (RFC 1950) stream for "deflate".
_ENCODINGS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


async def read_body(receive: Receive, length: bytes | None, encoding: bytes | None,
                    limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed ``limit``."""
    if length is not None and length.isdigit() and int(length) > limit:
        raise PayloadTooLargeError(f"request body of {length.decode()} bytes exceeds the "
                                   f"limit of {limit} bytes")
    chunks: list[bytes] = []
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            raise InvalidInputError("the client went away before sending the whole body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
        more = message.get("more_body", False)
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    return decompress(body, encoding.decode("latin-1"), limit) if encoding else body


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """A compressed request body (tritonclient's request_compression_algorithm), inflated
    no further than ``limit`` bytes so a small bomb cannot exhaust memory."""
    name = encoding.strip().lower()
    if name == "identity":
        return body
    bits = _ENCODINGS.get(name)
    if bits is None:
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


def infer_target(scope: Scope) -> tuple[str, str | None] | None:
    """(model, version) when the scope is ``POST /v2/models/M[/versions/V]/infer``."""
    if scope["type"] != "http" or scope["method"] != "POST":
        return None
    return infer_path(scope["path"])


def infer_path(path: str) -> tuple[str, str | None] | None:
    """(model, version) when ``path`` is ``/v2/models/M[/versions/V]/infer``."""
    parts = path.split("/")
    if parts[-1] != "infer" or parts[1:3] != ["v2", "models"]:
        return None
    if len(parts) == 5:
        return parts[3], None
    if len(parts) == 7 and parts[4] == "versions":
        return parts[3], parts[5]
    return None


def held_body(data: bytes) -> BodyReader:
    """A ``BodyReader`` for a body already received whole."""

    async def read(length: bytes | None, encoding: bytes | None, limit: int) -> bytes:
        if len(data) > limit:
            raise PayloadTooLargeError(f"request body of {len(data)} bytes exceeds the "
                                       f"limit of {limit} bytes")
        return decompress(data, encoding.decode("latin-1"), limit) if encoding else data

    return read


class InferEndpoint:
    """ASGI application: infer requests here, everything else to ``fallback``."""

    def __init__(self, core: ServerCore, fallback: ASGIApp) -> None:
        self.core = core
        self.fallback = fallback
        settings = core.settings
        self.limit = settings.max_body_bytes
        self.json_limit = min(settings.max_json_body_bytes, settings.max_body_bytes)
        self.budget = BodyBudget(settings.max_body_bytes_in_flight)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        target = infer_target(scope)
        if target is None:
            await self.fallback(scope, receive, send)
            return

        async def body(length: bytes | None, encoding: bytes | None, limit: int) -> bytes:
            return await read_body(receive, length, encoding, limit)

        status, headers, content = await self.answer(scope["path"], target,
                                                     scope["headers"], body)
        # An explicit length: without it uvicorn would send the body chunked.
        headers = [*headers, (b"content-length", str(len(content)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    async def answer(self, path: str, target: tuple[str, str | None], headers: Headers,
                     body: BodyReader) -> tuple[int, Headers, bytes]:
        """Status, headers (without the length) and body of the reply to one infer
        request; ``body`` gives the request body (refusing one over the limit)."""
        try:
            return await self._infer(headers, body, *target)
        except Exception as exc:  # the client gets the protocol's error shape either way
            if not isinstance(exc, TurboinferError):
                log.exception("infer failed")
            refused_with("POST", path, exc)
            return error_reply(exc)

    async def _infer(self, request_headers: Headers, read: BodyReader, model: str,
                     version: str | None) -> tuple[int, Headers, bytes]:
        self.core.admit(model)
        length = encoding = header = None
        for name, value in request_headers:
            if name == b"content-length":
                length = value
            elif name == b"inference-header-content-length":
                header = value
            elif name == b"content-encoding":
                encoding = value
        header_length = _header_length(header)
        # Only a body with binary tensors declares its JSON header's length.
        limit = self.json_limit if header_length is None else self.limit
        budget = self.budget
        reserved = budget.take(int(length) if length is not None and length.isdigit()
                               and int(length) <= limit else limit)
        try:
            body = await read(length, encoding, limit)
            if header_length is None and len(body) > OFFLOAD_BYTES:
                request = await asyncio.to_thread(decode_request, body, header_length)
            else:
                request = decode_request(body, header_length)
            del body  # the decoded tensors hold what they need of it
            served, outputs = await self.core.infer(model, version, request)
        finally:
            budget.give(reserved)
        content, json_length = encode_response(served.name, served.label, request, outputs)
        if json_length is None:
            return 200, _JSON_HEADERS, content
        return 200, [(b"content-type", b"application/octet-stream"),
                     (b"inference-header-content-length", str(json_length).encode())], content


def _header_length(value: bytes | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidInputError(f"Inference-Header-Content-Length must be an integer, got "
                                f"{value.decode('latin-1')!r}") from None


def error_reply(exc: BaseException) -> tuple[int, Headers, bytes]:
    """Status, headers and ``{"error": ...}`` body for a failed request."""
    reply = reply_for(exc)
    headers = _JSON_HEADERS + [(name.lower().encode("latin-1"), value.encode("latin-1"))
                               for name, value in reply.headers().items()]
    return reply.http_status, headers, orjson.dumps({"error": reply.message})
