"""Chunked encoding, SSE framing and the OpenAI stream, from recorded bytes split anywhere."""

from __future__ import annotations

import orjson
import pytest

from turboinfer.load.openai.protocol import StreamError, read_stream
from turboinfer.load.openai.settings import EndpointKind
from turboinfer.load.openai.stream import ChunkedDecoder, Exchange, SseSplitter, parse_exchange

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _chunked(*pieces: bytes, end: bool = True) -> bytes:
    out = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
    return out + (b"0\r\n\r\n" if end else b"")


def _event(doc: object) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def _text(t: str) -> bytes:
    return _event({"id": "x", "choices": [{"index": 0, "text": t, "finish_reason": None}]})


USAGE = _event({"id": "x", "choices": [], "usage": {"prompt_tokens": 7,
                                                    "completion_tokens": 3}})


def test_chunked_decoder_at_every_split() -> None:
    payload = b"data: a\n\n" + b"data: " + b"x" * 300 + b"\n\n"
    raw = _chunked(payload[:5], payload[5:])
    for cut in range(len(raw) + 1):
        decoder = ChunkedDecoder()
        assert decoder.feed(raw[:cut]) + decoder.feed(raw[cut:]) == payload
        assert decoder.done


def test_sse_splitter_joins_data_lines_and_crlf() -> None:
    splitter = SseSplitter()
    assert splitter.feed(b"data: one\r\n\r\ndata: tw") == [b"one"]
    assert splitter.feed(b"o\n: comment\ndata: more\n\nevent: x\n\n") == [b"two\nmore"]


def test_each_event_takes_the_time_of_the_read_that_completed_it() -> None:
    body = _chunked(_text("a"), _text("b") + _text("c"), b"data: [DONE]\n\n")
    first_end = body.index(_text("a")) + len(_text("a"))  # the first event's last byte
    reads = [(1.0, HEAD + body[:10]), (2.0, body[10:first_end]), (3.0, body[first_end:])]
    response = parse_exchange(reads)
    assert response.status == 200 and response.complete
    assert [stamp for stamp, _ in response.events] == [2.0, 3.0, 3.0, 3.0]


def test_completion_stream_with_usage() -> None:
    body = _chunked(_text("He"), _text(""), _text("llo"), USAGE, b"data: [DONE]\n\n")
    step = 7
    reads = [(float(i), (HEAD + body)[i:i + step]) for i in range(0, len(HEAD + body), step)]
    content = read_stream(Exchange(0.0, reads), EndpointKind.COMPLETIONS)
    assert content.text == "Hello"
    assert len(content.chunk_times) == 3  # an empty-text chunk still counts, as in vLLM
    assert (content.prompt_tokens, content.completion_tokens) == (7, 3)


def test_chat_counts_only_chunks_with_content() -> None:
    role = _event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
    piece = _event({"choices": [{"index": 0, "delta": {"content": "Hi"}}]})
    reads = [(0.5, HEAD + _chunked(role, piece, piece, b"data: [DONE]\n\n"))]
    content = read_stream(Exchange(0.0, reads), EndpointKind.CHAT)
    assert content.text == "HiHi" and len(content.chunk_times) == 2
    assert content.completion_tokens is None


@pytest.mark.parametrize(("raw", "message"), [
    (HEAD + _chunked(b"data: {not json\n\n"), "malformed SSE event"),
    (HEAD + _chunked(_text("a"), _event({"error": {"message": "engine broke"}})),
     "error event: engine broke"),
    (HEAD + _chunked(_text("a"), end=False), "stream cut off"),
    (HEAD + _chunked(b"data: [DONE]\n\n"), "no token in the stream"),
    (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 52\r\n\r\n"
     b'{"error": {"message": "max_tokens must be positive"}}',
     "HTTP 400: max_tokens must be positive"),
    (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy", "HTTP 503: busy"),
    (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP response"),
])
def test_bad_streams_fail_with_a_reason(raw: bytes, message: str) -> None:
    with pytest.raises(StreamError, match=message):
        read_stream(Exchange(0.0, [(1.0, raw)]), EndpointKind.COMPLETIONS)


def test_transport_errors_pass_through() -> None:
    with pytest.raises(StreamError, match="connection refused"):
        read_stream(Exchange(0.0, error="connection refused"), EndpointKind.COMPLETIONS)
    with pytest.raises(StreamError, match="closed without a response"):
        read_stream(Exchange(0.0), EndpointKind.COMPLETIONS)
