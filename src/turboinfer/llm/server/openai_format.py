"""OpenAI response bodies: completions and chat, whole or as server-sent events.

Bodies are plain dicts serialised with orjson: on the hot path (one SSE chunk per piece
of text) building a pydantic model per chunk would cost more than the chunk itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson

from turboinfer.errors import TurboinferError, reply_for
from turboinfer.llm.engine.sequence import Sequence, TokenLogprob
from turboinfer.llm.server.generation import ClientGoneError, Generation
from turboinfer.llm.server.textstream import TextStream
from turboinfer.llm.server.tools import ToolPlan
from turboinfer.llm.tokenizer import Tokenizer

DONE = b"data: [DONE]\n\n"
Body = dict[str, Any]


def sse(body: Body) -> bytes:
    return b"data: " + orjson.dumps(body) + b"\n\n"


def error_body(exc: BaseException) -> Body:
    reply = reply_for(exc)
    return {"error": {"message": reply.message, "type": reply.error_type,
                      "param": getattr(exc, "param", None), "code": None}}


def usage(prompt_tokens: int, completion_tokens: int) -> Body:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def final_text(seq: Sequence, tokenizer: Tokenizer) -> str:
    """The text ``LLM.generate`` returns: cut at a stop string when one was hit."""
    return seq.output_text or tokenizer.decode(seq.output_token_ids)


def finish_reason(seq: Sequence) -> str:
    return "length" if seq.finish_reason is not None and seq.finish_reason.value == "length" \
        else "stop"


class TokenTexts:
    """Token id -> its text, cached: logprobs name every token and its alternatives."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self._tokenizer.decode([token_id])
        return text


@dataclass
class Shape:
    """What differs between completions and chat in a body and its chunks."""

    chat: bool
    model: str
    texts: TokenTexts

    def choice(self, index: int, text: str, ids: list[int], lps: list[TokenLogprob] | None,
               reason: str | None, *, delta: bool) -> Body:
        logprobs = None if lps is None else self.logprobs(ids, lps)
        if not self.chat:
            return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}
        key, message = ("delta", {"content": text} if text else {}) if delta else \
            ("message", {"role": "assistant", "content": text})
        return {"index": index, key: message, "logprobs": logprobs, "finish_reason": reason}

    def logprobs(self, ids: list[int], lps: list[TokenLogprob]) -> Body:
        t = self.texts
        if self.chat:
            return {"content": [
                {"token": t(i), "logprob": lp, "bytes": list(t(i).encode()),
                 "top_logprobs": [{"token": t(a), "logprob": v, "bytes": list(t(a).encode())}
                                  for a, v in top]}
                for i, (lp, top) in zip(ids, lps, strict=True)], "refusal": None}
        return {"tokens": [t(i) for i in ids], "token_logprobs": [lp for lp, _ in lps],
                "top_logprobs": [{t(a): v for a, v in top} or {t(i): lp}
                                 for i, (lp, top) in zip(ids, lps, strict=True)],
                "text_offset": _offsets([t(i) for i in ids])}

    def envelope(self, gen: Generation, created: int, *, chunk: bool) -> Body:
        kind = "chat.completion" if self.chat else "text_completion"
        if chunk and self.chat:
            kind += ".chunk"
        return {"id": gen.id, "object": kind, "created": created, "model": self.model}


def _offsets(tokens: list[str]) -> list[int]:
    out, pos = [], 0
    for token in tokens:
        out.append(pos)
        pos += len(token)
    return out


def response(shape: Shape, gen: Generation, seqs: list[Sequence], tokenizer: Tokenizer,
             created: int, with_logprobs: bool) -> Body:
    body = shape.envelope(gen, created, chunk=False)
    body["choices"] = [
        shape.choice(i, final_text(s, tokenizer), s.output_token_ids,
                     s.logprobs if with_logprobs else None, finish_reason(s), delta=False)
        for i, s in enumerate(seqs)]
    body["usage"] = usage(gen.prompt_tokens, sum(s.num_output_tokens for s in seqs))
    return body


async def stream(shape: Shape, gen: Generation, tokenizer: Tokenizer, stop: tuple[str, ...],
                 created: int, *, with_logprobs: bool, include_usage: bool,
                 ) -> AsyncIterator[bytes]:
    """The SSE events of one request, ending with ``[DONE]``; an error after the first
    event is sent as an ``error`` event (the status line has gone out already)."""
    base = shape.envelope(gen, created, chunk=True)
    if include_usage:
        base["usage"] = None
    n = len(gen.prompt_lens)
    streams = [TextStream(tokenizer, stop) for _ in range(n)]
    pending: list[tuple[list[int], list[TokenLogprob]]] = [([], []) for _ in range(n)]
    if shape.chat:  # OpenAI opens each chat choice with the role
        for i in range(n):
            yield sse({**base, "choices": [{"index": i, "delta": {"role": "assistant",
                       "content": ""}, "logprobs": None, "finish_reason": None}]})
    try:
        async for u in gen.updates():
            reason = None
            if u.finished:
                # Not pushed: the last tokens may hold a stop string the final text cuts.
                assert u.seq is not None
                text = streams[u.index].finish(final_text(u.seq, tokenizer))
                reason = finish_reason(u.seq)
            else:
                text = streams[u.index].push(u.token_ids)
            lps = None
            if with_logprobs:
                ids, acc = pending[u.index]
                ids += u.token_ids
                acc += u.logprobs
                if not (text or reason):
                    continue
                pending[u.index] = ([], [])
                lps = acc
                u.token_ids = ids
            elif not (text or reason):
                continue
            choice = shape.choice(u.index, text, u.token_ids, lps, reason, delta=True)
            yield sse({**base, "choices": [choice]})
    except ClientGoneError:
        return
    except TurboinferError as exc:
        yield sse(error_body(exc))
        yield DONE
        return
    for event in _ending(base, gen, include_usage):
        yield event


def _ending(base: Body, gen: Generation, include_usage: bool) -> list[bytes]:
    """The last events of a stream: the usage chunk when asked for, then ``[DONE]``."""
    if not include_usage:
        return [DONE]
    total = sum(s.num_output_tokens for s in gen.results if s is not None)
    return [sse({**base, "choices": [], "usage": usage(gen.prompt_tokens, total)}), DONE]


def _tool_message(plan: ToolPlan, seq: Sequence, tokenizer: Tokenizer) -> tuple[Body, str]:
    """The assistant message of a reply that may call tools, and its finish reason."""
    content, calls = plan.calls(final_text(seq, tokenizer))
    message: Body = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
        return message, "tool_calls"
    return message, finish_reason(seq)


def tool_response(shape: Shape, gen: Generation, plan: ToolPlan, seqs: list[Sequence],
                  tokenizer: Tokenizer, created: int) -> Body:
    body = shape.envelope(gen, created, chunk=False)
    choices = []
    for i, seq in enumerate(seqs):
        message, reason = _tool_message(plan, seq, tokenizer)
        choices.append({"index": i, "message": message, "logprobs": None,
                        "finish_reason": reason})
    body["choices"] = choices
    body["usage"] = usage(gen.prompt_tokens, sum(s.num_output_tokens for s in seqs))
    return body


async def tool_events(shape: Shape, gen: Generation, plan: ToolPlan, tokenizer: Tokenizer,
                      created: int, *, include_usage: bool) -> AsyncIterator[bytes]:
    """The SSE events of a reply that may call tools: the role, then the content or the
    calls (each call's arguments whole in one delta, as clients concatenate them)."""
    base = shape.envelope(gen, created, chunk=True)
    if include_usage:
        base["usage"] = None
    for i in range(len(gen.prompt_lens)):
        yield sse({**base, "choices": [{"index": i, "delta": {"role": "assistant",
                                                              "content": ""},
                                        "logprobs": None, "finish_reason": None}]})
    try:
        seqs = await gen.wait()
    except ClientGoneError:
        return
    except TurboinferError as exc:
        yield sse(error_body(exc))
        yield DONE
        return
    for i, seq in enumerate(seqs):
        message, reason = _tool_message(plan, seq, tokenizer)
        delta: Body = {}
        if message["content"]:
            delta["content"] = message["content"]
        if "tool_calls" in message:
            delta["tool_calls"] = [{"index": k, **c}
                                   for k, c in enumerate(message["tool_calls"])]
        if delta:
            yield sse({**base, "choices": [{"index": i, "delta": delta, "logprobs": None,
                                            "finish_reason": None}]})
        yield sse({**base, "choices": [{"index": i, "delta": {}, "logprobs": None,
                                        "finish_reason": reason}]})
    for event in _ending(base, gen, include_usage):
        yield event
