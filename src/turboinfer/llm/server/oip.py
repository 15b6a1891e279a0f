"""The Open Inference Protocol's generate extension, as Triton serves it for LLMs.

``POST /v2/models/{name}/generate`` takes ``{"text_input": ..., "max_tokens": ...}``
(sampling parameters at the top level or under ``"parameters"``) and answers
``{"model_name", "model_version", "text_output", "finish_reason", "usage"}``;
``generate_stream`` sends the same objects as server-sent events, one per piece of text
(no ``[DONE]``, as Triton). Errors are OIP-shaped: ``{"error": "message"}``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from turboinfer.errors import UnknownModelError, reply_for
from turboinfer.llm.server.asgi import EventStream, completed
from turboinfer.llm.server.generation import ClientGoneError, Generation, ServerState
from turboinfer.llm.server.openai_format import final_text, finish_reason
from turboinfer.llm.server.protocol import GenerateRequest, load_body, validate
from turboinfer.llm.server.textstream import TextStream

VERSION = "1"


def _oip_error(exc: BaseException) -> Response:
    reply = reply_for(exc)
    return Response(orjson.dumps({"error": reply.message}), reply.http_status,
                    reply.headers(), media_type="application/json")


class GenerateRoutes:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def _start(self, request: Request, stream: bool) -> tuple[Generation, GenerateRequest]:
        arrival = time.perf_counter()
        name = request.path_params["name"]
        if name != self.state.settings.model_name:
            raise UnknownModelError(f"unknown model {name!r}")
        data: Any = load_body(await request.body())
        if isinstance(data, dict) and isinstance(data.get("parameters"), dict):
            data = {**data.pop("parameters"), **data}
        req = validate(GenerateRequest, data)
        prompt = self.state.tokenizer.encode(req.text_input)
        self.state.limits.max_tokens(len(prompt), req.max_tokens, None, "text_input")
        gen = Generation(self.state, [prompt], req.sampling(), priority=req.priority,
                         stream=stream, arrival=arrival, kind="gen")
        return gen, req

    def _body(self, text: str, reason: str | None) -> dict[str, Any]:
        return {"model_name": self.state.settings.model_name, "model_version": VERSION,
                "text_output": text, "finish_reason": reason}

    async def generate(self, request: Request) -> Response:
        try:
            self.state.authorize(request.headers)
            gen, _ = await self._start(request, stream=False)
            seq = (await completed(request.receive, gen))[0]
        except Exception as exc:
            return _oip_error(exc)
        body = self._body(final_text(seq, self.state.tokenizer), finish_reason(seq))
        body["usage"] = {"prompt_tokens": seq.num_prompt_tokens,
                         "completion_tokens": seq.num_output_tokens}
        return Response(orjson.dumps(body), media_type="application/json")

    async def generate_stream(self, request: Request) -> Response:
        try:
            self.state.authorize(request.headers)
            gen, req = await self._start(request, stream=True)
        except Exception as exc:
            return _oip_error(exc)
        return EventStream(self._events(gen, req), gen)

    async def _events(self, gen: Generation, req: GenerateRequest) -> AsyncIterator[bytes]:
        tokenizer = self.state.tokenizer
        text = TextStream(tokenizer, req.sampling().stop)
        try:
            async for u in gen.updates():
                reason = None
                if u.finished and u.seq is not None:  # the final text settles the rest
                    piece = text.finish(final_text(u.seq, tokenizer))
                    reason = finish_reason(u.seq)
                else:
                    piece = text.push(u.token_ids)
                if piece or reason:
                    yield b"data: " + orjson.dumps(self._body(piece, reason)) + b"\n\n"
        except ClientGoneError:
            return
        except Exception as exc:
            yield b"data: " + orjson.dumps({"error": reply_for(exc).message}) + b"\n\n"

    async def ready(self, request: Request) -> Response:
        return Response(status_code=200)


def routes(state: ServerState) -> list[Route]:
    g = GenerateRoutes(state)
    return [
        Route("/v2/models/{name}/generate", g.generate, methods=["POST"]),
        Route("/v2/models/{name}/generate_stream", g.generate_stream, methods=["POST"]),
        Route("/v2/health/live", g.ready, methods=["GET"]),
        Route("/v2/health/ready", g.ready, methods=["GET"]),
    ]
