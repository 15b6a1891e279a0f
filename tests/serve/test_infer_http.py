"""HTTP/1.1 as clients speak it, on the infer route, over raw sockets to a real server.

Small infer requests are answered by the protocol itself (serve/infer_http.py) and the
rest by uvicorn's ASGI cycle; whichever path a request takes, the answers must be the
same: in order on a kept-alive connection, pipelined or not, beside other routes, for
HTTP/1.0, ``Connection: close``, ``Expect: 100-continue``, chunked and compressed bodies,
and a client that leaves halfway.
"""

from __future__ import annotations

import asyncio
import gzip
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pytest
import uvicorn
from uvicorn.server import ServerState

from turboinfer.serve.app import create_app
from turboinfer.serve.config import ModelConfig, write_entry
from turboinfer.serve.core import ServerCore, ServerSettings
from turboinfer.serve.infer_http import infer_protocol
from turboinfer.serve.metrics import Metrics
from turboinfer.serve.repository import Repository
from turboinfer.serve.sources import scan_directory

if TYPE_CHECKING:
    from conftest import Server

INFER = "/v2/models/affine/infer"   # 2 * x + 1, input [batch <= 8, 16]


def _body(value: float) -> bytes:
    return orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16],
                                     "data": [value] * 16}]})


def _request(body: bytes, *, path: str = INFER, version: str = "1.1",
             headers: dict[str, str] | None = None) -> bytes:
    head = [f"POST {path} HTTP/{version}", "Host: test",
            f"Content-Length: {len(body)}"]
    head += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class Reader:
    """HTTP/1.1 responses read off one socket, one at a time (sized bodies only)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buffer = sock, b""

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buffer += chunk
        return bool(chunk)

    def response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            assert self._fill(), f"connection closed mid-response: {self.buffer!r}"
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
        length = int(headers["content-length"])
        while len(self.buffer) < length:
            assert self._fill(), "connection closed mid-body"
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return status, headers, body

    def closed(self) -> bool:
        """The server closed the connection (after whatever is buffered)."""
        self.sock.settimeout(10)
        return not self._fill()


def _connect(server: Server) -> tuple[socket.socket, Reader]:
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    return sock, Reader(sock)


def _output(body: bytes) -> list[float]:
    doc = orjson.loads(body)
    return doc["outputs"][0]["data"]


def test_one_connection_many_requests_in_order(server: Server) -> None:
    sock, reader = _connect(server)
    with sock:
        for i in range(20):
            sock.sendall(_request(_body(float(i))))
            status, headers, body = reader.response()
            assert status == 200, body
            assert headers["content-type"] == "application/json"
            assert "date" in headers
            assert _output(body) == [2.0 * i + 1.0] * 16


def test_pipelined_requests_are_answered_in_order(server: Server) -> None:
    """Several requests in one write, infer and not: each answered once, in order."""
    sock, reader = _connect(server)
    burst = (_request(_body(1.0)) + _request(_body(2.0))
             + b"GET /v2/health/ready HTTP/1.1\r\nHost: test\r\n\r\n"
             + _request(_body(3.0)) + _request(b"{", path=INFER))
    with sock:
        sock.sendall(burst)
        answers = [reader.response() for _ in range(5)]
    assert [a[0] for a in answers] == [200, 200, 200, 200, 400]
    assert _output(answers[0][2]) == [3.0] * 16
    assert _output(answers[1][2]) == [5.0] * 16
    assert _output(answers[3][2]) == [7.0] * 16
    assert "error" in orjson.loads(answers[4][2])


def test_http_1_0_and_connection_close_end_the_connection(server: Server) -> None:
    for request in (_request(_body(1.0), version="1.0"),
                    _request(_body(1.0), headers={"Connection": "close"})):
        sock, reader = _connect(server)
        with sock:
            sock.sendall(request)
            status, headers, body = reader.response()
            assert status == 200 and _output(body) == [3.0] * 16
            assert headers.get("connection") == "close"
            assert reader.closed()


def test_expect_continue_chunked_query_and_gzip(server: Server) -> None:
    sock, reader = _connect(server)
    with sock:
        # Expect: 100-continue: the interim answer, then the body, then the response.
        body = _body(4.0)
        head = _request(b"", headers={"Expect": "100-continue"}).replace(
            b"Content-Length: 0", f"Content-Length: {len(body)}".encode())
        sock.sendall(head)
        while b"\r\n\r\n" not in reader.buffer:
            assert reader._fill()
        assert reader.buffer.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        reader.buffer = reader.buffer[len(b"HTTP/1.1 100 Continue\r\n\r\n"):]
        sock.sendall(body)
        status, _, answer = reader.response()
        assert status == 200 and _output(answer) == [9.0] * 16
        # A chunked body (no declared length).
        body = _body(5.0)
        chunked = (f"POST {INFER} HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
                   f"{len(body[:10]):x}\r\n").encode() + body[:10] + (
            f"\r\n{len(body[10:]):x}\r\n").encode() + body[10:] + b"\r\n0\r\n\r\n"
        sock.sendall(chunked)
        status, _, answer = reader.response()
        assert status == 200 and _output(answer) == [11.0] * 16
        # A query string, and a gzip body.
        sock.sendall(_request(_body(6.0), path=INFER + "?trace=1"))
        status, _, answer = reader.response()
        assert status == 200 and _output(answer) == [13.0] * 16
        sock.sendall(_request(gzip.compress(_body(7.0)), headers={"Content-Encoding": "gzip"}))
        status, _, answer = reader.response()
        assert status == 200 and _output(answer) == [15.0] * 16


def test_errors_keep_the_connection(server: Server) -> None:
    """A refused request (unknown model, bad body, wrong length header) is a 4xx with
    ``{"error": ...}``, and the same connection goes on serving."""
    sock, reader = _connect(server)
    with sock:
        for request, status in (
                (_request(_body(1.0), path="/v2/models/nope/infer"), 404),
                (_request(b"[1, 2"), 400),
                (_request(_body(1.0), headers={"Inference-Header-Content-Length": "x"}), 400),
                (_request(_body(1.0), path="/v2/models/affine/versions/9/infer"), 404)):
            sock.sendall(request)
            got, headers, body = reader.response()
            assert got == status, body
            assert headers["content-type"] == "application/json"
            assert set(orjson.loads(body)) == {"error"}
        sock.sendall(_request(_body(2.0)))
        status, _, body = reader.response()
        assert status == 200 and _output(body) == [5.0] * 16


@pytest.mark.parametrize("cut", ["headers", "body"])
def test_a_client_leaving_midway_leaves_the_server_serving(server: Server, cut: str) -> None:
    request = _request(_body(1.0))
    part = request[:20] if cut == "headers" else request[:-10]
    for _ in range(5):
        sock, _ = _connect(server)
        sock.sendall(part)
        sock.close()
    time.sleep(0.2)
    sock, reader = _connect(server)
    with sock:
        sock.sendall(request)
        status, _, body = reader.response()
    assert status == 200 and _output(body) == [3.0] * 16


class _Recorder(asyncio.Transport):
    """The socket side of one connection in process: what the protocol wrote."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5), "sockname": ("127.0.0.1", 8000)}.get(
            name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def test_small_infer_requests_skip_the_asgi_cycle(tmp_path: Path,
                                                  model_files: dict[str, Path]) -> None:
    """A small infer request is answered by the protocol in one write; the others
    (Expect: 100-continue, a chunked body, another route) keep uvicorn's cycle."""
    write_entry(tmp_path / "repo", "affine", model_files["affine1"],
                ModelConfig(max_batch_size=8))

    async def scenario() -> None:
        root = tmp_path / "repo"
        metrics = Metrics()
        repository = Repository(scan_directory(root), metrics, root=root)
        await repository.load_all()
        core = ServerCore(ServerSettings(repository=root, grpc_port=None), repository,
                          metrics)
        core.started = True
        app = create_app(core)
        config = uvicorn.Config(app, http=infer_protocol(app), lifespan="off",
                                access_log=False)
        config.load()
        kinds = []
        for request in (_request(_body(1.0)),
                        _request(_body(1.0), headers={"Expect": "100-continue"}),
                        b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n"):
            protocol = config.http_protocol_class(config=config, server_state=ServerState(),
                                                   app_state={})
            transport = _Recorder()
            protocol.connection_made(transport)
            protocol.data_received(request)
            kinds.append(type(protocol.cycle).__name__)
            for _ in range(2000):
                if any(b"\r\n\r\n" in w and not w.startswith(b"HTTP/1.1 100")
                       for w in transport.writes):
                    break
                await asyncio.sleep(0.001)
            answer = b"".join(transport.writes)
            assert answer.split(b" ")[1] in (b"100", b"200"), answer
            if kinds[-1] == "_Reply":
                assert len(transport.writes) == 1   # status, headers and body at once
                assert _output(answer.split(b"\r\n\r\n", 1)[1]) == [3.0] * 16
        await core.close()
        assert kinds == ["_Reply", "RequestResponseCycle", "RequestResponseCycle"]

    asyncio.run(scenario())
