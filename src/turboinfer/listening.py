"""What every server process does the same way before it serves: bind its socket, own
SIGTERM/SIGINT, and run uvicorn without uvicorn's own signal handling. The OIP server and
the OpenAI-compatible LLM server both use it; it imports nothing above ``errors``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
from collections.abc import Generator

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from turboinfer.errors import ConfigError


class QuietUvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: the server's drain owns SIGTERM/SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class JsonErrorHttp(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol (httptools), except that a request its parser rejects
    gets the ``{"error": ...}`` body every other refused request gets, not plain text.
    uvicorn has logged the one line for it already."""

    def send_400_response(self, msg: str) -> None:
        body = json.dumps({"error": f"malformed HTTP request: {msg}"}).encode()
        head = [b"HTTP/1.1 400 Bad Request\r\n"]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: application/json\r\n",
                 b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n"]
        self.transport.write(b"".join(head) + body)
        self.transport.close()


def listen(host: str, port: int) -> socket.socket:
    """A bound, listening, non-blocking socket; a port in use is a ConfigError."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def stop_on_signals(stop: asyncio.Event) -> None:
    """SIGTERM and SIGINT set ``stop`` (where the loop can take signal handlers: the main
    thread of a Unix process)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
