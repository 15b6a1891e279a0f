"""Running the server: one event loop for HTTP (uvicorn), gRPC and the batchers.

Lifecycle: sockets are bound first (``/v2/health/live`` answers while models load), the
repository loads, then ``ready`` turns true (a SIGTERM or SIGINT while it loads stops at
once). On SIGTERM or SIGINT the server stops taking
inference requests (``ready`` false, new infers get 503) and waits for the ones in flight,
up to one deadline (``drain_timeout_s``); then it frees the models (what is still in
flight fails) and closes the listeners, which get a short grace to write the last
responses.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import uvicorn

from turboinfer.errors import ConfigError
from turboinfer.listening import QuietUvicorn, listen, stop_on_signals
from turboinfer.models.zoo import names as zoo_names
from turboinfer.serve.app import create_app
from turboinfer.serve.core import ModelControl, ServerCore, ServerSettings
from turboinfer.serve.engine_threads import leave_running_engines
from turboinfer.serve.infer_http import infer_protocol
from turboinfer.serve.metrics import Metrics
from turboinfer.serve.repository import Repository
from turboinfer.serve.sources import ModelSource, scan_directory, zoo_sources

log = logging.getLogger(__name__)

# After the drain: seconds the listeners get to write responses that are on their way.
_FLUSH_GRACE_S = 1
# An instance thread (after its engine run) and gRPC's poller thread each need the GIL
# back from a busy event loop, which holds it until the forced switch: 5 ms by default,
# the p99 of both hops under load when measured. 0.5 ms bounds that wait.
_SWITCH_INTERVAL_S = 0.0005


@dataclass(frozen=True)
class Bound:
    host: str
    http_port: int
    grpc_port: int | None


def _sources(settings: ServerSettings) -> dict[str, ModelSource]:
    if settings.repository is not None:
        return scan_directory(settings.repository)
    known = zoo_names()
    unknown = [name for name in settings.zoo_models if name not in known]
    if unknown:
        raise ConfigError(f"unknown built-in model {unknown[0]!r}; known: {', '.join(known)}")
    # Every zoo model is listed (and loadable through the API); the chosen ones load now.
    return zoo_sources(known)


def _initial(settings: ServerSettings) -> list[str] | None:
    return None if settings.repository is not None else list(settings.zoo_models)


def build_core(settings: ServerSettings) -> ServerCore:
    metrics = Metrics()
    repository = Repository(_sources(settings), metrics, root=settings.repository,
                            drain_timeout_s=settings.drain_timeout_s)
    return ServerCore(settings, repository, metrics)


def _uvicorn_config(core: ServerCore) -> uvicorn.Config:
    app = create_app(core)
    return uvicorn.Config(
        # Small infer requests are answered by the protocol itself (serve/infer_http.py).
        app, log_level="warning", access_log=False, lifespan="off",
        loop="none", http=infer_protocol(app),
        # The drain has waited for the requests already (one deadline, see _shutdown).
        timeout_graceful_shutdown=_FLUSH_GRACE_S,
        # Keep-alive long enough that benchmark and client pools are never torn down.
        timeout_keep_alive=30,
        # Beyond this many connections and tasks uvicorn answers 503 at once.
        limit_concurrency=core.settings.max_connections,
        # No X-Forwarded-* rewriting: nothing here reads the client address, and the
        # middleware costs every request a scope copy.
        proxy_headers=False, server_header=False,
    )


async def serve(settings: ServerSettings, on_ready: Callable[[Bound], None] | None = None,
                stop: asyncio.Event | None = None) -> None:
    """Serve until ``stop`` is set or a SIGTERM/SIGINT arrives (main thread only)."""
    core = build_core(settings)
    stop = stop or asyncio.Event()
    stop_on_signals(stop)
    sock = listen(settings.host, settings.http_port)
    http = QuietUvicorn(_uvicorn_config(core))
    http_task = asyncio.create_task(http.serve(sockets=[sock]))
    grpc_server, grpc_port = None, None
    if settings.grpc_port is not None:
        # Heavy: grpc and the protocol's protobuf modules take ~0.1 s to import.
        from turboinfer.serve.grpc_service import start_grpc

        grpc_server, grpc_port = await start_grpc(core, settings.host, settings.grpc_port)
    background: list[asyncio.Task[None]] = []
    try:
        if not await _load_unless_stopped(core, _initial(settings), stop):
            raise LoadingInterrupted
        core.started = True
        # What is alive now (modules, torch, sessions: ~200,000 objects) lives as long as
        # the server; frozen, a full collection no longer walks it (~100 ms that stalled
        # every request in flight).
        gc.freeze()
        sys.setswitchinterval(_SWITCH_INTERVAL_S)
        if settings.model_control is ModelControl.POLL:
            background.append(asyncio.create_task(_poll(core)))
        if on_ready is not None:
            on_ready(Bound(settings.host, sock.getsockname()[1], grpc_port))
        await _wait_for(stop, http_task)
    finally:
        await _shutdown(core, http, http_task, grpc_server, background)


class LoadingInterrupted(Exception):
    """A signal arrived while the models were still loading."""


async def _load_unless_stopped(core: ServerCore, names: list[str] | None,
                               stop: asyncio.Event) -> bool:
    """Load the repository unless ``stop`` is set first (then cancel the loading and
    answer False): a signal during a long export or load must not wait for it."""
    loading = asyncio.create_task(core.repository.load_all(names))
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({loading, stopper}, return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    if loading.done():
        loading.result()  # a failed load raises here
        return True
    loading.cancel()
    await asyncio.gather(loading, return_exceptions=True)
    return False


async def _wait_for(stop: asyncio.Event, http_task: asyncio.Task[None]) -> None:
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({stopper, http_task}, return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()


async def _shutdown(core: ServerCore, http: QuietUvicorn, http_task: asyncio.Task[None],
                    grpc_server: Any, background: list[asyncio.Task[None]]) -> None:
    for task in background:
        task.cancel()
    if not await core.drain(core.settings.drain_timeout_s):
        log.warning("drain deadline of %g s passed with %d requests in flight; failing them",
                    core.settings.drain_timeout_s, core.in_flight)
    log.info("drained; stopping")
    await core.close()
    if grpc_server is not None:
        await grpc_server.stop(grace=_FLUSH_GRACE_S)
    http.should_exit = True
    await asyncio.gather(http_task, return_exceptions=True)


async def _poll(core: ServerCore) -> None:
    while True:
        await asyncio.sleep(core.settings.poll_seconds)
        try:
            await core.repository.poll_once()
        except Exception:  # a broken repository must not stop the poller
            log.exception("repository poll failed")


def run(settings: ServerSettings, on_ready: Callable[[Bound], None] | None = None) -> None:
    """Blocking entry point: uvloop when installed, else the default loop. A signal
    during loading exits the process at once: a model build running in a worker thread
    cannot be interrupted, and the event loop's shutdown would wait for it."""
    main: Coroutine[Any, Any, None] = _exit_if_interrupted(serve(settings, on_ready))
    try:
        import uvloop  # optional: not on every platform
    except ImportError:
        asyncio.run(main)
        leave_running_engines()
        return
    uvloop.run(main)
    leave_running_engines()


async def _exit_if_interrupted(main: Coroutine[Any, Any, None]) -> None:
    try:
        await main
    except LoadingInterrupted:
        log.warning("stopped while loading models")
        logging.shutdown()
        sys.stderr.flush()
        os._exit(0)
