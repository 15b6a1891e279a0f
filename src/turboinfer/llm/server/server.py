"""Running the LLM server: bind, start the engine loop, serve HTTP until a signal.

The socket is bound before anything is announced, so the one line printed on stdout
(``turboinfer llm serving http=HOST:PORT model=NAME``) means requests can be sent.
SIGTERM/SIGINT stop accepting, let uvicorn close the connections (streams in flight get
``timeout_graceful_shutdown`` seconds), then stop the engine thread.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from turboinfer.listening import QuietUvicorn, listen, stop_on_signals
from turboinfer.llm.api import LLM
from turboinfer.llm.server.app import create_app
from turboinfer.llm.server.chat import ChatTemplate
from turboinfer.llm.server.generation import ServerState
from turboinfer.llm.server.loop import EngineLoop
from turboinfer.llm.server.metrics import LLMMetrics
from turboinfer.llm.server.protocol import Limits
from turboinfer.llm.server.settings import ServerSettings

SWITCH_INTERVAL_S = 0.0005


@dataclass(frozen=True)
class Bound:
    host: str
    port: int
    model_name: str


def build_state(llm: LLM, settings: ServerSettings, model_dir: Path,
                loop: asyncio.AbstractEventLoop) -> ServerState:
    engine = llm.engine
    engine_loop = EngineLoop(engine, loop)
    return ServerState(
        settings=settings, tokenizer=llm.tokenizer,
        chat_template=ChatTemplate.from_folder(model_dir),
        limits=Limits(engine.max_seq_len, engine.model.config.vocab_size,
                      settings.max_logprobs),
        loop=engine_loop, metrics=LLMMetrics(settings.model_name, lambda: engine_loop.stats),
        max_num_seqs=engine.config.max_num_seqs)


async def serve(llm: LLM, settings: ServerSettings, model_dir: Path,
                on_ready: Callable[[Bound], None] | None = None,
                stop: asyncio.Event | None = None) -> None:
    """Serve until ``stop`` is set or SIGTERM/SIGINT arrives (main thread only)."""
    state = build_state(llm, settings, model_dir, asyncio.get_running_loop())
    # Between torch ops the engine thread re-takes the GIL before a waiting event loop
    # wakes up, so the loop waits for the forced switch: 5 ms by default, one whole step
    # of a small model added to every first token. 0.5 ms bounds that wait.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    stop = stop or asyncio.Event()
    stop_on_signals(stop)
    sock = listen(settings.host, settings.port)
    config = uvicorn.Config(create_app(state), log_level="warning", access_log=False,
                            lifespan="off", loop="none", timeout_graceful_shutdown=5,
                            timeout_keep_alive=30, proxy_headers=False, server_header=False)
    http = QuietUvicorn(config)
    state.loop.start()
    http_task = asyncio.create_task(http.serve(sockets=[sock]))
    try:
        if on_ready is not None:
            on_ready(Bound(settings.host, sock.getsockname()[1], settings.model_name))
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({stopper, http_task}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
    finally:
        http.should_exit = True
        await asyncio.gather(http_task, return_exceptions=True)
        state.loop.stop()


def run(llm: LLM, settings: ServerSettings, model_dir: Path,
        on_ready: Callable[[Bound], None] | None = None) -> None:
    """Blocking entry point: uvloop when installed, else the default loop."""
    main = serve(llm, settings, model_dir, on_ready)
    try:
        import uvloop  # optional: a faster event loop where it is installed
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)
