"""An HTTP/1.1 keep-alive client on raw asyncio transports, for the infer hot path.

A general client (aiohttp) spends most of a 2-core machine's CPU on request objects,
header dictionaries and cookie handling; here a request is one ``transport.write`` of
bytes built once, and a response is found by its head and ``Content-Length``.
benchmarks/serving/client_overhead.py measures both against a server that answers at
once (raw figures in benchmarks/serving/client_overhead.json).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from turboinfer.load.endpoint import Endpoint

_HEAD_END = b"\r\n\r\n"


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def error_message(self) -> str:
        """The ``{"error": ...}`` body servers use, or the start of whatever came."""
        try:
            doc = orjson.loads(self.body)
            if isinstance(doc, dict) and "error" in doc:
                return str(doc["error"])
        except orjson.JSONDecodeError:
            pass
        return self.body[:200].decode("utf-8", "replace").strip() or f"HTTP {self.status}"


def build_request(endpoint: Endpoint, method: str, path: str, body: bytes = b"",
                  headers: Sequence[tuple[str, str]] = ()) -> bytes:
    """The full bytes of one request; keep-alive is HTTP/1.1's default."""
    lines = [f"{method} {endpoint.base_path}{path} HTTP/1.1", f"Host: {endpoint.host_header}"]
    lines += [f"{name}: {value}" for name, value in headers]
    if body or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def parse_response(buffer: bytearray) -> tuple[Response, int, bool] | None:
    """(response, bytes consumed, keep-alive) once ``buffer`` holds a whole response."""
    end = buffer.find(_HEAD_END)
    if end < 0:
        return None
    head = bytes(buffer[:end]).lower()
    start = end + 4
    keep_alive = b"\r\nconnection: close" not in head
    if b"\r\ntransfer-encoding: chunked" in head:
        chunked = _parse_chunked(buffer, start)
        if chunked is None:
            return None
        body, consumed = chunked
    else:
        body, consumed = _parse_sized(buffer, head, start)
        if consumed < 0:
            return None
    return Response(int(head[9:12]), body), consumed, keep_alive


def _parse_sized(buffer: bytearray, head: bytes, start: int) -> tuple[bytes, int]:
    at = head.find(b"\r\ncontent-length:")
    if at < 0:
        return b"", start
    line_end = head.find(b"\r\n", at + 2)
    length = int(head[at + 17:line_end if line_end > 0 else len(head)])
    if len(buffer) < start + length:
        return b"", -1
    return bytes(buffer[start:start + length]), start + length


def _parse_chunked(buffer: bytearray, at: int) -> tuple[bytes, int] | None:
    parts: list[bytes] = []
    while True:
        line_end = buffer.find(b"\r\n", at)
        if line_end < 0:
            return None
        size = int(bytes(buffer[at:line_end]).split(b";")[0], 16)
        at = line_end + 2
        if size == 0:
            trailer_end = buffer.find(_HEAD_END, at - 2)
            return (b"".join(parts), trailer_end + 4) if trailer_end >= 0 else None
        if len(buffer) < at + size + 2:
            return None
        parts.append(bytes(buffer[at:at + size]))
        at += size + 2


class HttpConnection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._buffer = bytearray()
        self._waiter: asyncio.Future[Response] | None = None
        self._transport: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        waiter = self._waiter
        if waiter is None:
            return
        parsed = parse_response(self._buffer)
        if parsed is None:
            return
        response, consumed, keep_alive = parsed
        del self._buffer[:consumed]
        self._waiter = None
        if not keep_alive:
            self.abort()
        if not waiter.done():
            waiter.set_result(response)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError("the server closed the connection"))

    def send(self, request: bytes) -> asyncio.Future[Response]:
        assert self._transport is not None
        self._waiter = waiter = self._loop.create_future()
        self._transport.write(request)
        return waiter

    def abort(self) -> None:
        """Drop a connection whose state is unknown (timeout, cancel, server close)."""
        self.closed = True
        if self._transport is not None:
            self._transport.abort()


class HttpClient:
    """A pool of keep-alive connections to one server, at most ``max_connections``."""

    def __init__(self, endpoint: Endpoint, *, timeout_s: float, max_connections: int) -> None:
        self.endpoint = endpoint
        self._timeout_s = timeout_s
        self._max_connections = max_connections
        self._idle: list[HttpConnection] = []
        self._open = 0
        # Waiters get a connection, or None: "one closed, open your own".
        self._waiters: deque[asyncio.Future[HttpConnection | None]] = deque()
        self._loop = asyncio.get_running_loop()

    async def send(self, request: bytes) -> Response:
        """One request/response; raises ``TimeoutError`` or ``OSError`` on failure."""
        conn = await self._acquire()
        waiter = conn.send(request)
        timer = self._loop.call_later(self._timeout_s, _expire, waiter)
        try:
            return await waiter
        except BaseException:
            conn.abort()
            raise
        finally:
            timer.cancel()
            self._release(conn)

    async def _acquire(self) -> HttpConnection:
        if self._idle:
            return self._idle.pop()
        if self._open >= self._max_connections:
            waiter: asyncio.Future[HttpConnection | None] = self._loop.create_future()
            self._waiters.append(waiter)
            conn = await waiter
            if conn is not None:
                return conn
        self._open += 1
        try:
            return await self._connect()
        except BaseException:
            self._open -= 1
            self._wake_one(None)
            raise

    async def _connect(self) -> HttpConnection:
        connecting = self._loop.create_connection(
            lambda: HttpConnection(self._loop), self.endpoint.host, self.endpoint.port)
        _, conn = await asyncio.wait_for(connecting, self._timeout_s)
        return conn

    def _release(self, conn: HttpConnection) -> None:
        if conn.closed:
            self._open -= 1
            self._wake_one(None)
        elif not self._wake_one(conn):
            self._idle.append(conn)

    def _wake_one(self, conn: HttpConnection | None) -> bool:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return True
        return False

    async def close(self) -> None:
        for conn in self._idle:
            conn.abort()
        self._idle.clear()


def _expire(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())
