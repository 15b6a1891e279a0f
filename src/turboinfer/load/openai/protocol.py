"""The OpenAI wire format: the body each request sends, and what its stream said.

Sent, besides the prompt (``prompt`` for completions, one user message for chat):
``max_tokens`` = the output length, ``temperature`` (0 by default: greedy, the same work
on every server), ``stream: true``, ``stream_options: {"include_usage": true}`` so token
counts come from the server; and, unless ``--no-ignore-eos``, ``ignore_eos: true``
(vLLM, turboinfer) with ``min_tokens`` = the output length (vLLM, llama-cpp-python), so
every request generates its full length where the server supports either. Servers that
know neither field ignore them. ``--extra-body`` is merged in last.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from tokenizers import Tokenizer

from turboinfer.load.openai.metrics import RequestResult, from_chunks
from turboinfer.load.openai.prompts import PromptRequest
from turboinfer.load.openai.settings import EndpointKind, LoadSettings
from turboinfer.load.openai.stream import Exchange, parse_exchange

MAX_ERROR_CHARS = 160


def request_body(settings: LoadSettings, model: str | None, prompt: PromptRequest) -> bytes:
    body: dict[str, Any] = {"max_tokens": prompt.output_len,
                            "temperature": settings.temperature, "stream": True,
                            "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    if settings.endpoint is EndpointKind.COMPLETIONS:
        body["prompt"] = prompt.prompt
    else:
        body["messages"] = [{"role": "user", "content": prompt.prompt}]
    if settings.ignore_eos:
        body.update(ignore_eos=True, min_tokens=prompt.output_len)
    body.update(settings.extra_body)
    return orjson.dumps(body)


@dataclass
class StreamContent:
    """The token-carrying chunks' arrival times, their text, and the server's usage."""

    chunk_times: list[float]
    text: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class StreamError(Exception):
    """The request failed; the message is what the report counts."""


def read_stream(exchange: Exchange, endpoint: EndpointKind) -> StreamContent:
    if exchange.error:
        raise StreamError(exchange.error)
    try:
        response = parse_exchange(exchange.reads)
    except ValueError:
        raise StreamError("not an HTTP response" if exchange.reads
                          else "connection closed without a response") from None
    if response.status != 200:
        raise StreamError(f"HTTP {response.status}: {_error_message(response.body)}")
    content = StreamContent([], "")
    for stamp, data in response.events:
        if data == b"[DONE]":
            break
        _read_event(data, stamp, endpoint, content)
    if not response.complete:
        raise StreamError("stream cut off before its end")
    if not content.chunk_times:
        raise StreamError("no token in the stream")
    return content


def _read_event(data: bytes, stamp: float, endpoint: EndpointKind,
                content: StreamContent) -> None:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise StreamError("malformed SSE event (not JSON)") from None
    if not isinstance(doc, dict):
        raise StreamError("malformed SSE event (not an object)")
    if "error" in doc:
        raise StreamError(f"error event: {_short(_message_of(doc['error']))}")
    choices = doc.get("choices")
    if choices and isinstance(choices[0], dict):
        # vLLM's rules: any completions chunk with a choice counts (its text may be empty,
        # e.g. a special token); a chat chunk counts when its delta carries content.
        if endpoint is EndpointKind.COMPLETIONS:
            text = choices[0].get("text") or ""
        else:
            delta = choices[0].get("delta") or {}
            text = delta.get("content") or delta.get("reasoning_content") or ""
        if endpoint is EndpointKind.COMPLETIONS or text:
            content.chunk_times.append(stamp)
            content.text += text
    usage = doc.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        content.completion_tokens = usage["completion_tokens"]
        content.prompt_tokens = usage.get("prompt_tokens")


def to_result(exchange: Exchange, endpoint: EndpointKind, prompt: PromptRequest,
              tokenizer: Tokenizer, origin_s: float) -> RequestResult:
    """The request's metrics; output tokens from ``usage``, else by tokenizing the text."""
    start_s = exchange.sent_s - origin_s
    try:
        content = read_stream(exchange, endpoint)
    except StreamError as exc:
        return RequestResult(start_s=start_s, prompt_len=prompt.prompt_len, error=str(exc))
    output_tokens = content.completion_tokens
    if output_tokens is None:
        output_tokens = len(tokenizer.encode(content.text, add_special_tokens=False).ids)
    prompt_len = content.prompt_tokens
    return from_chunks(start_s=start_s, sent_s=exchange.sent_s,
                       chunk_times=content.chunk_times,
                       prompt_len=prompt_len if isinstance(prompt_len, int)
                       else prompt.prompt_len, output_tokens=output_tokens,
                       counted_by_server=content.completion_tokens is not None)


def _error_message(body: bytes) -> str:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return _short(body.decode("utf-8", "replace").strip() or "(empty body)")
    return _short(_message_of(doc.get("error", doc) if isinstance(doc, dict) else doc))


def _message_of(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error.get("detail") or error)
    return str(error)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 3] + "..."
