"""uvicorn's HTTP/1.1 protocol with small infer requests answered in place.

A small infer request is the server's hot path. Through ASGI it costs uvicorn a
``RequestResponseCycle``, the receive and send message dicts, a check of every response
header against its patterns and two socket writes (status and headers, then the body);
here the parser's callbacks gather the body and one task answers it with one write.

Everything else takes uvicorn's path unchanged: other routes, bodies without a declared
length or over ``OFFLOAD_BYTES`` (their memory is reserved before they are read),
``Expect: 100-continue``, URLs with a query or escapes, upgrades, a request pipelined
behind one still being answered, and requests beyond ``limit_concurrency`` (uvicorn's
503).
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from turboinfer.listening import JsonErrorHttp
from turboinfer.serve.http_infer import (
    OFFLOAD_BYTES,
    Headers,
    InferEndpoint,
    held_body,
    infer_path,
)

__all__ = ["InferHttp", "infer_protocol"]


class _NoEvent:
    """What ``connection_lost`` sets on a cycle: nothing waits on it here."""

    __slots__ = ()

    def set(self) -> None:
        pass


_NO_EVENT = _NoEvent()


class _Reply:
    """One infer request answered in place. It stands in for uvicorn's cycle as the
    protocol's ``cycle``, with the attributes the protocol reads and writes there
    (``response_complete``, ``disconnected``, ``keep_alive``, ``message_event``), so
    pipelining, shutdown and a lost connection are handled as for uvicorn's own."""

    __slots__ = (
        "chunks",
        "disconnected",
        "headers",
        "keep_alive",
        "message_event",
        "path",
        "protocol",
        "response_complete",
        "started",
        "target",
    )

    def __init__(self, protocol: InferHttp, path: str, target: tuple[str, str | None],
                 headers: Headers, keep_alive: bool) -> None:
        self.protocol, self.path, self.target, self.headers = protocol, path, target, headers
        self.chunks: list[bytes] = []
        self.keep_alive = keep_alive
        self.response_complete = False
        self.started = False
        self.disconnected = False
        self.message_event = _NO_EVENT

    async def run(self) -> None:
        protocol = self.protocol
        chunks = self.chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.chunks = []
        status, headers, content = await protocol.endpoint.answer(
            self.path, self.target, self.headers, held_body(body))
        if self.disconnected:
            return
        if protocol.flow.write_paused:
            await protocol.flow.drain()
            if self.disconnected:
                return
        out = [STATUS_LINE[status]]
        for name, value in protocol.server_state.default_headers:
            out += (name, b": ", value, b"\r\n")
        for name, value in headers:
            out += (name, b": ", value, b"\r\n")
        out.append(b"content-length: %d\r\n" % len(content))
        if not self.keep_alive:
            out.append(b"connection: close\r\n")
        out += (b"\r\n", content)
        transport = protocol.transport
        transport.write(b"".join(out))
        self.response_complete = True
        if not self.keep_alive:
            transport.close()
        protocol.on_response_complete()


class InferHttp(JsonErrorHttp):
    """``JsonErrorHttp`` answering small infer requests without the ASGI cycle
    (``infer_protocol`` binds it to the endpoint)."""

    endpoint: InferEndpoint

    def on_headers_complete(self) -> None:
        reply = self._reply()
        if reply is None:
            super().on_headers_complete()
        else:
            self.cycle = reply  # type: ignore[assignment]

    def _reply(self) -> _Reply | None:
        """The in-place answer for this request, or None for uvicorn's path."""
        parser = self.parser
        if (parser.get_method() != b"POST" or self.expect_100_continue
                or parser.should_upgrade() or self.root_path
                or (self.cycle is not None and not self.cycle.response_complete)):
            return None
        url = self.url
        if b"?" in url or b"%" in url or not url.isascii():
            return None
        target = infer_path(path := url.decode("ascii"))
        if target is None:
            return None
        length = None
        for name, value in self.headers:
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                return None
        if length is None or not length.isdigit() or int(length) > OFFLOAD_BYTES:
            return None
        limit = self.limit_concurrency
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            return None     # uvicorn answers 503
        keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
        return _Reply(self, path, target, self.headers, keep_alive)

    def _gathering(self) -> _Reply | None:
        """The in-place answer whose request is being read now, if any (an answer
        already started or done is some earlier request's: an upgrade, which uvicorn
        leaves without a cycle, goes to uvicorn's callbacks)."""
        cycle = self.cycle
        if type(cycle) is _Reply and not cycle.started and not self.parser.should_upgrade():
            return cycle
        return None

    def on_body(self, body: bytes) -> None:
        reply = self._gathering()
        if reply is None:
            super().on_body(body)
        else:
            reply.chunks.append(body)

    def on_message_complete(self) -> None:
        reply = self._gathering()
        if reply is None:
            super().on_message_complete()
            return
        reply.started = True
        task = self.loop.create_task(reply.run())
        tasks = self.tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)


def infer_protocol(endpoint: InferEndpoint) -> type[InferHttp]:
    """The protocol class uvicorn instantiates per connection, bound to ``endpoint``."""
    return type("InferHttp", (InferHttp,), {"endpoint": endpoint})
