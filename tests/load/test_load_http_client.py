import pytest

from turboinfer.errors import ConfigError
from turboinfer.load.endpoint import Endpoint
from turboinfer.load.http_client import Response, build_request, parse_response


def test_sized_response_waits_for_the_whole_body() -> None:
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: x\r\n\r\nhel"
    buffer = bytearray(raw)
    assert parse_response(buffer) is None
    buffer += b"loHTTP/1.1"
    response, consumed, keep_alive = parse_response(buffer)  # type: ignore[misc]
    assert response == Response(200, b"hello") and keep_alive
    assert bytes(buffer[consumed:]) == b"HTTP/1.1"


def test_chunked_response_and_connection_close() -> None:
    raw = (b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n"
           b"Connection: close\r\n\r\n4\r\n{\"er\r\na\r\nror\": \"x\"}\r\n0\r\n\r\n")
    assert parse_response(bytearray(raw[:-3])) is None
    response, consumed, keep_alive = parse_response(bytearray(raw))  # type: ignore[misc]
    assert response.status == 503 and not keep_alive and consumed == len(raw)
    assert response.error_message() == "x"


def test_error_message_falls_back_to_text() -> None:
    assert Response(500, b"Internal Server Error").error_message() == "Internal Server Error"
    assert Response(500, b"").error_message() == "HTTP 500"


def test_request_bytes_carry_length_and_prefix() -> None:
    endpoint = Endpoint.parse("http://127.0.0.1:9000/prefix/")
    raw = build_request(endpoint, "POST", "/v2/models/m/infer", b"{}", [("X-A", "1")])
    head, body = raw.split(b"\r\n\r\n")
    assert head.startswith(b"POST /prefix/v2/models/m/infer HTTP/1.1\r\n")
    assert b"Content-Length: 2" in head and b"Host: 127.0.0.1:9000" in head and body == b"{}"


@pytest.mark.parametrize(("url", "protocol", "expected"), [
    ("http://127.0.0.1:8000", "http", ("http", "127.0.0.1", 8000)),
    ("localhost", "http", ("http", "localhost", 8000)),
    ("127.0.0.1:9001", "grpc", ("grpc", "127.0.0.1", 9001)),
])
def test_endpoint_parse(url: str, protocol: str, expected: tuple[str, str, int]) -> None:
    endpoint = Endpoint.parse(url, protocol=protocol)
    assert (endpoint.scheme, endpoint.host, endpoint.port) == expected


@pytest.mark.parametrize("url", ["https://127.0.0.1:8000", "http://:80", "http://h:port"])
def test_endpoint_rejects_what_it_cannot_use(url: str) -> None:
    with pytest.raises(ConfigError):
        Endpoint.parse(url)
