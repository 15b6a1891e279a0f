"""The OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions,
/tokenize and /detokenize (vLLM's), /health and /metrics, plus the OIP generate
extension (``oip.py``).

Handlers validate, tokenize and admit, then hand the request to the engine loop and
shape what comes back. With ``--api-key`` the /v1 and /v2 routes need
``Authorization: Bearer KEY``; /health and /metrics stay open for probes and scrapers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from prometheus_client import generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from turboinfer.errors import UnknownModelError, reply_for
from turboinfer.llm.server import oip
from turboinfer.llm.server.asgi import EventStream, completed, json_response
from turboinfer.llm.server.generation import Generation, ServerState
from turboinfer.llm.server.metrics import CONTENT_TYPE
from turboinfer.llm.server.openai_format import (
    Shape,
    TokenTexts,
    error_body,
    response,
    stream,
    tool_events,
    tool_response,
)
from turboinfer.llm.server.protocol import (
    COMPLETION_DEFAULT_MAX_TOKENS,
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    parse,
)
from turboinfer.llm.server.tools import ToolPlan

log = logging.getLogger(__name__)
Handler = Callable[[Request], Awaitable[Response]]


def error_response(exc: BaseException) -> Response:
    reply = reply_for(exc)
    if reply.http_status >= 500:
        log.error("request failed: %s", reply.message)
    return json_response(error_body(exc), reply.http_status, reply.headers())


def guarded(state: ServerState, handler: Handler, *, auth: bool = True) -> Handler:
    """Key check and the one error path: every failure becomes an OpenAI error body."""
    async def endpoint(request: Request) -> Response:
        try:
            if auth:
                state.authorize(request.headers)
            return await handler(request)
        except Exception as exc:
            return error_response(exc)
    return endpoint


class Routes:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.texts = TokenTexts(state.tokenizer)

    def _check_model(self, name: str) -> None:
        if name != self.state.settings.model_name:
            raise UnknownModelError(f"the model {name!r} does not exist; this server serves "
                                    f"{self.state.settings.model_name!r}", param="model")

    async def models(self, request: Request) -> Response:
        name = self.state.settings.model_name
        return json_response({"object": "list", "data": [
            {"id": name, "object": "model", "created": self.state.created,
             "owned_by": "turboinfer", "max_model_len": self.state.limits.max_seq_len}]})

    async def completions(self, request: Request) -> Response:
        arrival = time.perf_counter()
        req = parse(CompletionRequest, await request.body())
        self._check_model(req.model)
        req.check_supported()
        n = req.choices
        self.state.limits.check_logprobs(req.logprobs, "logprobs")
        prompts = [self._encode(p) for p in req.prompts()]
        max_tokens = min(self.state.limits.max_tokens(len(p), req.max_tokens,
                                                      COMPLETION_DEFAULT_MAX_TOKENS, "prompt")
                         for p in prompts)
        params = req.sampling(max_tokens, req.logprobs)
        gen = Generation(self.state, prompts, params, priority=req.priority,
                         stream=bool(req.stream), arrival=arrival, n=n)
        return await self._answer(request, gen, Shape(False, req.model, self.texts),
                                  bool(req.stream), req.include_usage, params.stop,
                                  req.logprobs is not None)

    async def chat(self, request: Request) -> Response:
        arrival = time.perf_counter()
        req = parse(ChatRequest, await request.body())
        self._check_model(req.model)
        n = req.choices
        self.state.limits.check_logprobs(req.top_logprobs, "top_logprobs")
        tok = self.state.tokenizer
        plan = req.tool_plan()
        text = self.state.chat_template.render([m.for_template() for m in req.messages],
                                               tools=plan.tools if plan else None)
        # The template writes its own special tokens, as apply_chat_template encodes it.
        prompt = tok.encode(text, add_special_tokens=self.state.chat_template.source is None)
        max_tokens = self.state.limits.max_tokens(len(prompt), req.requested_max_tokens, None,
                                                  "messages")
        params = req.sampling(max_tokens, req.num_logprobs,
                              plan.structured() if plan else None)
        gen = Generation(self.state, [prompt], params, priority=req.priority,
                         stream=bool(req.stream), arrival=arrival, kind="chatcmpl", n=n)
        shape = Shape(True, req.model, self.texts)
        if plan is not None:
            return await self._answer_tools(request, gen, shape, plan, bool(req.stream),
                                            req.include_usage)
        return await self._answer(request, gen, shape, bool(req.stream), req.include_usage,
                                  params.stop, req.num_logprobs is not None)

    async def _answer_tools(self, request: Request, gen: Generation, shape: Shape,
                            plan: ToolPlan, streaming: bool, include_usage: bool) -> Response:
        """A reply that may call tools: the whole text is needed to tell content from
        calls, so a stream sends them as one delta when the generation ends."""
        created = int(time.time())
        if streaming:
            return EventStream(tool_events(shape, gen, plan, self.state.tokenizer, created,
                                           include_usage=include_usage), gen)
        seqs = await completed(request.receive, gen)
        return json_response(tool_response(shape, gen, plan, seqs, self.state.tokenizer,
                                           created))

    def _encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.state.tokenizer.encode(prompt)
        self.state.limits.check_ids(prompt)
        return prompt

    async def _answer(self, request: Request, gen: Generation, shape: Shape, streaming: bool,
                      include_usage: bool, stop: tuple[str, ...],
                      with_logprobs: bool) -> Response:
        created = int(time.time())
        if streaming:
            events = stream(shape, gen, self.state.tokenizer, stop, created,
                            with_logprobs=with_logprobs, include_usage=include_usage)
            return EventStream(events, gen)
        seqs = await completed(request.receive, gen)
        return json_response(response(shape, gen, seqs, self.state.tokenizer, created,
                                      with_logprobs))

    async def tokenize(self, request: Request) -> Response:
        req = parse(TokenizeRequest, await request.body())
        if req.model is not None:
            self._check_model(req.model)
        req.check_one_input()
        template = self.state.chat_template
        if req.messages is not None:
            text = template.render([m.for_template() for m in req.messages])
        else:
            text = req.prompt or ""
        # A rendered chat template writes its own special tokens, as apply_chat_template.
        default = req.messages is None or template.source is None
        add = default if req.add_special_tokens is None else req.add_special_tokens
        ids = self.state.tokenizer.encode(text, add_special_tokens=add)
        return json_response({"count": len(ids), "max_model_len": self.state.limits.max_seq_len,
                              "tokens": ids})

    async def detokenize(self, request: Request) -> Response:
        req = parse(DetokenizeRequest, await request.body())
        if req.model is not None:
            self._check_model(req.model)
        self.state.limits.check_ids(req.tokens, param="tokens")
        return json_response({"prompt": self.state.tokenizer.decode(req.tokens)})

    async def health(self, request: Request) -> Response:
        s = self.state.loop.stats
        return json_response({"status": "ok", "model": self.state.settings.model_name,
                              "kv_free_blocks": s.free_blocks, "kv_total_blocks": s.total_blocks,
                              "requests_running": s.running, "requests_waiting": s.waiting,
                              "requests_in_server": self.state.inflight})

    async def metrics(self, request: Request) -> Response:
        return Response(generate_latest(self.state.metrics.registry),
                        media_type=CONTENT_TYPE)


async def _not_found(request: Request, exc: Exception) -> Response:
    return error_response(UnknownModelError(f"no route {request.method} {request.url.path}"))


def create_app(state: ServerState) -> Starlette:
    r = Routes(state)
    g = guarded
    routes = [
        Route("/v1/models", g(state, r.models), methods=["GET"]),
        Route("/v1/completions", g(state, r.completions), methods=["POST"]),
        Route("/v1/chat/completions", g(state, r.chat), methods=["POST"]),
        Route("/tokenize", g(state, r.tokenize), methods=["POST"]),
        Route("/detokenize", g(state, r.detokenize), methods=["POST"]),
        Route("/health", g(state, r.health, auth=False), methods=["GET"]),
        Route("/metrics", g(state, r.metrics, auth=False), methods=["GET"]),
        *oip.routes(state),
    ]
    return Starlette(routes=routes, exception_handlers={404: _not_found})
