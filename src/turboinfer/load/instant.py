"""A server that answers every OIP request at once, to measure the load generator itself.

Whatever throughput ``turboinfer load`` reaches against it is the client's ceiling on
this machine: run ``python -m turboinfer.load.instant`` and point a load test at it.
It speaks just enough HTTP/1.1 (keep-alive, Content-Length bodies) for that purpose.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

import orjson

MODEL = "instant"
METADATA = orjson.dumps({
    "name": MODEL, "versions": ["1"], "platform": "instant",
    "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 16]}],
    "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, 16]}],
})
INFER = orjson.dumps({"model_name": MODEL, "model_version": "1", "outputs": []})
NOT_FOUND = orjson.dumps({"error": "not found"})


def _response(status: str, body: bytes) -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


RESPONSES = {
    b"/v2/models/instant": _response("200 OK", METADATA),
    b"/v2/models/instant/infer": _response("200 OK", INFER),
}
MISSING = _response("404 Not Found", NOT_FOUND)


class InstantProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while True:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self._buffer[:end])
            size = _content_length(head)
            if len(self._buffer) < end + 4 + size:
                return
            del self._buffer[:end + 4 + size]
            path = head.split(b" ", 2)[1]
            assert self._transport is not None
            self._transport.write(RESPONSES.get(path, MISSING))


def _content_length(head: bytes) -> int:
    at = head.lower().find(b"\r\ncontent-length:")
    if at < 0:
        return 0
    line_end = head.find(b"\r\n", at + 2)
    return int(head[at + 17:line_end if line_end > 0 else len(head)])


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(InstantProtocol, host, port)
    bound = server.sockets[0].getsockname()[1]
    print(f"instant OIP server on http://{host}:{bound} model={MODEL}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
