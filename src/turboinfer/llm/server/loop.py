"""The engine loop: one thread owns the engine; HTTP handlers reach it only through queues.

Handlers post closures to ``_inbox`` (add a request, abort one); the thread runs them
between steps, so every request from every connection joins the same continuous batch.
After each step the new tokens of all updated sequences go back to the event loop in one
``call_soon_threadsafe`` (one wake-up per step, not per token), each into its request's
``asyncio.Queue``. A thread rather than an asyncio task because a step is milliseconds of
compute: on the event loop it would stall every connection; here torch releases the GIL
while it computes and the event loop formats and writes the previous step's tokens.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from turboinfer.errors import InferenceError, TurboinferError
from turboinfer.llm.engine.llm_engine import LLMEngine
from turboinfer.llm.engine.sampling_params import SamplingParams
from turboinfer.llm.engine.sequence import Sequence, TokenLogprob

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Update:
    """New tokens of one sequence (``index``: its place in the request), or an error."""

    index: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    seq: Sequence | None = None
    finished: bool = False
    error: TurboinferError | None = None


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot the loop publishes after every step, for /health and /metrics."""

    free_blocks: int = 0
    total_blocks: int = 0
    running: int = 0
    waiting: int = 0
    preempted_waiting: int = 0
    preemptions: int = 0
    prefix_hits: int = 0
    prefix_queries: int = 0
    spec_drafted: int = 0
    spec_accepted: int = 0


@dataclass(slots=True)
class _Tracked:
    index: int
    queue: asyncio.Queue[Update]
    every_step: bool  # streaming: send each step's tokens; else only the finished sequence
    sent: int = 0


class EngineLoop:
    def __init__(self, engine: LLMEngine, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self._loop = loop
        self._inbox: collections.deque[Callable[[], None]] = collections.deque()
        self._wake = threading.Event()
        self._tracked: dict[str, _Tracked] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="llm-engine", daemon=True)
        self.stats = self._snapshot()

    # -- called from the event loop ----------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=10)

    def add(self, request_id: str, index: int, prompt: list[int], params: SamplingParams, *,
            priority: int, queue: asyncio.Queue[Update], every_step: bool) -> None:
        def command() -> None:
            try:
                self.engine.add_request(prompt, params, priority=priority,
                                        request_id=request_id)
            except TurboinferError as exc:
                self._deliver([(queue, Update(index, finished=True, error=exc))])
                return
            self._tracked[request_id] = _Tracked(index, queue, every_step)
        self._post(command)

    def abort(self, request_id: str) -> None:
        def command() -> None:
            self._tracked.pop(request_id, None)
            self.engine.abort(request_id)
        self._post(command)

    def _post(self, command: Callable[[], None]) -> None:
        self._inbox.append(command)
        self._wake.set()

    # -- the engine thread -------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping:
            if not self._inbox and not self.engine.has_unfinished():
                self.stats = self._snapshot()
                self._wake.wait()
            self._wake.clear()
            while self._inbox:
                self._inbox.popleft()()
            if self.engine.has_unfinished():
                self._step()
        while self._inbox:  # aborts posted while stopping still free their blocks
            self._inbox.popleft()()

    def _step(self) -> None:
        try:
            updated = self.engine.step()
        except Exception as exc:  # a bug in a step must not kill the loop for everyone
            log.exception("engine step failed")
            self._fail_all(InferenceError(f"the engine failed: {type(exc).__name__}: {exc}"))
            return
        out: list[tuple[asyncio.Queue[Update], Update]] = []
        for seq in updated:
            tracked = self._tracked.get(seq.request_id)
            if tracked is None:
                continue
            finished = seq.is_finished
            if finished:
                del self._tracked[seq.request_id]
            elif not tracked.every_step:
                continue
            sent, tracked.sent = tracked.sent, seq.num_output_tokens
            out.append((tracked.queue, Update(
                tracked.index, seq.token_ids[seq.num_prompt_tokens + sent:],
                seq.logprobs[sent:], seq, finished)))
        self.stats = self._snapshot()
        if out:
            self._deliver(out)

    def _fail_all(self, error: TurboinferError) -> None:
        out = [(t.queue, Update(t.index, finished=True, error=error))
               for t in self._tracked.values()]
        for request_id in list(self._tracked):
            self.engine.abort(request_id)
        self._tracked.clear()
        self._deliver(out)

    def _deliver(self, out: list[tuple[asyncio.Queue[Update], Update]]) -> None:
        # RuntimeError: the event loop has closed, nobody is listening.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(_put_all, out)

    def _snapshot(self) -> EngineStats:
        e = self.engine
        bm, sched, spec = e.block_manager, e.scheduler, e.spec_stats
        return EngineStats(
            free_blocks=bm.num_free_blocks, total_blocks=bm.num_blocks,
            running=len(sched.running), waiting=len(sched.waiting),
            preempted_waiting=sum(1 for s in sched.waiting if s.num_preemptions),
            preemptions=sched.num_preemptions, prefix_hits=bm.prefix_hits,
            prefix_queries=bm.prefix_queries, spec_drafted=spec.drafted,
            spec_accepted=spec.accepted)


def _put_all(out: list[tuple[asyncio.Queue[Update], Update]]) -> None:
    for queue, update in out:
        queue.put_nowait(update)
