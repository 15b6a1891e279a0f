"""One streamed HTTP request on a raw asyncio connection, timed per read, parsed after.

The hot loop only awaits ``read`` and appends ``(perf_counter(), bytes)``: no header
parsing, no JSON, no allocation beyond the list entry, so client overhead stays out of
TTFT and ITL. Each request opens its own connection and asks the server to close it, so
the end of the stream is the end of the connection and nothing else has to be watched
for while timing. Everything else (status line, chunked transfer encoding, SSE framing,
JSON) happens in :func:`parse_exchange` once the request is over.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from turboinfer.load.endpoint import Endpoint

READ_SIZE = 1 << 16


@dataclass
class Exchange:
    """What came back for one request: arrival-stamped reads, or why it failed."""

    sent_s: float
    reads: list[tuple[float, bytes]] = field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True)
class StreamedResponse:
    """The HTTP status and the SSE ``data:`` payloads, each with its arrival time."""

    status: int
    events: tuple[tuple[float, bytes], ...]
    body: bytes
    complete: bool


def build_request(endpoint: Endpoint, method: str, path: str, body: bytes = b"",
                  headers: Sequence[tuple[str, str]] = ()) -> bytes:
    lines = [f"{method} {endpoint.base_path}{path} HTTP/1.1", f"Host: {endpoint.host_header}",
             "Connection: close", "Accept: text/event-stream, application/json"]
    lines += [f"{name}: {value}" for name, value in headers]
    if body:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def exchange(endpoint: Endpoint, request: bytes, timeout_s: float) -> Exchange:
    """Send ``request`` and collect every read until the server closes the connection."""
    result = Exchange(sent_s=time.perf_counter())
    try:
        await asyncio.wait_for(_collect(endpoint, request, result), timeout_s)
    except TimeoutError:
        result.error = f"timed out after {timeout_s:g}s"
    except OSError as exc:
        result.error = _describe(exc)
    return result


async def _collect(endpoint: Endpoint, request: bytes, result: Exchange) -> None:
    reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
    try:
        writer.write(request)
        append, read, clock = result.reads.append, reader.read, time.perf_counter
        while True:
            data = await read(READ_SIZE)
            if not data:
                return
            append((clock(), data))
    finally:
        writer.close()


def _describe(exc: OSError) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ConnectionResetError):
        return "connection reset by the server"
    return exc.strerror or type(exc).__name__


class ChunkedDecoder:
    """HTTP/1.1 chunked transfer encoding, fed piece by piece; a chunk's bytes come out
    as soon as they arrive, so an event is stamped with the read that completed it."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._remaining = 0  # payload bytes still due in the current chunk
        self._in_chunk = False
        self.done = False

    def feed(self, data: bytes) -> bytes:
        self._buffer += data
        out = bytearray()
        while not self.done:
            if self._in_chunk:
                if self._remaining:
                    take = self._buffer[:self._remaining]
                    out += take
                    del self._buffer[:len(take)]
                    self._remaining -= len(take)
                    if self._remaining:
                        break
                if len(self._buffer) < 2:
                    break
                del self._buffer[:2]  # the CRLF closing the chunk
                self._in_chunk = False
                continue
            end = self._buffer.find(b"\r\n")
            if end < 0:
                break
            self._remaining = int(bytes(self._buffer[:end]).split(b";")[0] or b"0", 16)
            del self._buffer[:end + 2]
            self._in_chunk = True
            self.done = self._remaining == 0
        return bytes(out)


class SseSplitter:
    """Server-sent events: the joined ``data:`` lines of each complete event."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data.replace(b"\r\n", b"\n")
        *events, self._buffer = self._buffer.split(b"\n\n")
        out = []
        for event in events:
            lines = [line[5:].strip() for line in event.split(b"\n")
                     if line.startswith(b"data:")]
            if lines:
                out.append(b"\n".join(lines))
        return out


def parse_exchange(reads: Sequence[tuple[float, bytes]]) -> StreamedResponse:
    """Status, SSE events stamped with the read that completed them, and the raw body.

    Raises ``ValueError`` on a response that is not HTTP.
    """
    head_buffer, index = b"", 0
    while b"\r\n\r\n" not in head_buffer and index < len(reads):
        head_buffer += reads[index][1]
        index += 1
    head, sep, rest = head_buffer.partition(b"\r\n\r\n")
    if not sep or not head.startswith(b"HTTP/1."):
        raise ValueError("no HTTP response head")
    status = int(head[9:12])
    chunked = b"transfer-encoding: chunked" in head.lower()
    decoder, splitter = ChunkedDecoder(), SseSplitter()
    events: list[tuple[float, bytes]] = []
    body = bytearray()
    pieces = [(reads[index - 1][0], rest), *reads[index:]]
    for stamp, data in pieces:
        payload = decoder.feed(data) if chunked else data
        body += payload
        events += [(stamp, event) for event in splitter.feed(payload)]
    return StreamedResponse(status, tuple(events), bytes(body), decoder.done or not chunked)
