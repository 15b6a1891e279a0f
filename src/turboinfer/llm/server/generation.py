"""One HTTP request's sequences, seen from the event loop: admission, updates, abort.

A ``Generation`` puts its prompts into the engine loop and reads their updates from one
``asyncio.Queue``. Closing it (the response is done, the client went away, the deadline
passed) aborts whatever still runs, which frees the KV blocks in the loop's next turn.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hmac
import itertools
import os
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from turboinfer.errors import (
    InferenceError,
    TooManyRequestsError,
    TurboinferError,
    UnauthorizedError,
)
from turboinfer.llm.engine.sampling_params import SamplingParams
from turboinfer.llm.engine.sequence import FinishReason, Sequence
from turboinfer.llm.server.chat import ChatTemplate
from turboinfer.llm.server.loop import EngineLoop, Update
from turboinfer.llm.server.metrics import LLMMetrics
from turboinfer.llm.server.protocol import Limits
from turboinfer.llm.server.settings import ServerSettings
from turboinfer.llm.tokenizer import Tokenizer


class RequestTimeoutError(TurboinferError):
    """A request ran past the server's request timeout and was aborted."""

    http_status = 504
    grpc_code = "DEADLINE_EXCEEDED"
    error_type = "timeout_error"


class ClientGoneError(TurboinferError):
    """The client closed the connection; nobody reads the answer."""

    http_status = 499


@dataclass
class ServerState:
    settings: ServerSettings
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    limits: Limits
    loop: EngineLoop
    metrics: LLMMetrics
    max_num_seqs: int
    inflight: int = 0  # sequences submitted and not yet finished or aborted
    created: int = field(default_factory=lambda: int(time.time()))

    def authorize(self, headers: Mapping[str, str]) -> None:
        key = self.settings.api_key
        if key is None:
            return
        given = headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        # Constant-time comparison: the time taken must not reveal how much matched.
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), key.encode()):
            raise UnauthorizedError("a valid API key is required (Authorization: Bearer KEY)")

    def admit(self, n: int) -> None:
        limit = self.max_num_seqs + self.settings.max_waiting
        if self.inflight + n > limit:
            exc = TooManyRequestsError(
                f"the server is full ({self.inflight} sequences running or waiting, limit "
                f"{limit}); retry later")
            exc.retry_after_s = self.settings.retry_after_s
            raise exc
        self.inflight += n


_ids = itertools.count()
_PREFIX = os.urandom(4).hex()


def new_id(kind: str) -> str:
    return f"{kind}-{_PREFIX}{next(_ids):08x}"


class Generation:
    """``prompts`` (token ids) submitted together, ``n`` choices each (choice
    ``prompt * n + j``); ``stream`` asks for every step's tokens.

    A prompt's further choices join once its first has been prefilled, so their prompt
    blocks come from the prefix cache instead of being computed ``n`` times; with a
    ``seed``, choice ``j`` samples with ``seed + j``, so the choices differ and repeat.
    """

    def __init__(self, state: ServerState, prompts: list[list[int]], params: SamplingParams,
                 *, priority: int, stream: bool, arrival: float, kind: str = "cmpl",
                 n: int = 1) -> None:
        state.admit(len(prompts) * n)
        self.state = state
        self.id = new_id(kind)
        self.arrival = arrival
        self.prompt_lens = [len(p) for p in prompts for _ in range(n)]
        self.prompt_tokens = sum(len(p) for p in prompts)  # usage counts a prompt once
        self.results: list[Sequence | None] = [None] * len(self.prompt_lens)
        self._queue: asyncio.Queue[Update] = asyncio.Queue()
        self._open = set(range(len(self.prompt_lens)))
        self._closed = False
        self._add = functools.partial(state.loop.add, priority=priority, queue=self._queue)
        self._stream = stream
        # First choice's index -> the (index, prompt, params) of the copies waiting for it.
        self._copies: dict[int, list[tuple[int, list[int], SamplingParams]]] = {}
        for i, prompt in enumerate(prompts):
            first = i * n
            self._copies[first] = [
                (first + j, prompt, params if params.seed is None
                 else dataclasses.replace(params, seed=params.seed + j))
                for j in range(1, n)]
            # Its first token must come back even unstreamed: it lets the copies in.
            self._add(f"{self.id}-{first}", first, prompt, params,
                      every_step=stream or n > 1)
        loop = asyncio.get_running_loop()
        deadline = arrival + state.settings.request_timeout_s - time.perf_counter()
        self._timer = loop.call_later(max(deadline, 0.0), self._interrupt, RequestTimeoutError(
            f"the request ran past the server's {state.settings.request_timeout_s:g} s "
            "timeout"))

    async def updates(self) -> AsyncIterator[Update]:
        """Each update as it comes; raises the error that ends the request early."""
        metrics = self.state.metrics
        while self._open:
            update = await self._queue.get()
            if update.error is not None:
                raise update.error
            copies = self._copies.pop(update.index, None)
            if copies and not self._closed:  # its prompt is in the prefix cache now
                for index, prompt, params in copies:
                    self._add(f"{self.id}-{index}", index, prompt, params,
                              every_step=self._stream)
            metrics.generation_tokens.inc(len(update.token_ids))
            if update.finished:
                assert update.seq is not None
                self._open.discard(update.index)
                if not self._closed:  # close() already gave back the slots still open
                    self.state.inflight -= 1
                if update.seq.finish_reason is FinishReason.ABORT:
                    raise InferenceError("the engine dropped the request")
                self.results[update.index] = update.seq
                metrics.finished(update.seq, self.arrival)
            yield update

    async def wait(self) -> list[Sequence]:
        """Every sequence, finished."""
        async for _ in self.updates():
            pass
        return [seq for seq in self.results if seq is not None]

    def cancel(self) -> None:
        """The client went away: stop reading, abort the rest."""
        self._interrupt(ClientGoneError("the client disconnected"))

    def _interrupt(self, error: TurboinferError) -> None:
        self._queue.put_nowait(Update(-1, finished=True, error=error))
        self.close()

    def close(self) -> None:
        """Abort what still runs and give back its admission slots (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._timer.cancel()
        for index in self._open:
            self.state.loop.abort(f"{self.id}-{index}")
        self.state.inflight -= len(self._open)
