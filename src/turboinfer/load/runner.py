"""Closed and open loops: the two ways of putting load on a server.

A closed loop keeps N requests in flight and sends the next when one returns, so its
rate is whatever the server allows; latency runs from the actual send. An open loop
sends at scheduled times (Poisson arrivals) whether or not the server keeps up, and
latency runs from the *scheduled* time: a server that stalls shows the whole backlog
it built, which a closed loop hides (coordinated omission).

Both record into the meter's current window; a controller cuts windows on time, stops
on duration, count, an early-stop rule or a server that answers only errors, and
prints progress. Every loop is bounded in time: the duration plus one drain timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from turboinfer.load.client import InferClient
from turboinfer.load.stats import Recorder, merge, summarize

# How often the controller looks at the meter; also the granularity of the duration.
TICK_S = 0.05
PROGRESS_EVERY_S = 0.5
# A window with this many failures and no success means the server is not serving.
ABORT_AFTER_ERRORS = 20
# Beyond this many requests in flight the open loop counts sends as client overload
# instead of growing memory without bound.
MAX_IN_FLIGHT = 50_000
CLIENT_OVERLOAD = "client_overload"

StopRule = Callable[[list[Recorder]], bool]
Progress = Callable[[str], None]
WindowHook = Callable[[Recorder], None]
# One encoded request sent again and again, or several sent in turn (raw data files).
Requests = bytes | Sequence[bytes]


@dataclass(frozen=True)
class LoopSettings:
    duration_s: float
    window_s: float
    max_requests: int = 0
    warmup_s: float = 0.0
    drain_s: float = 30.0

    def __post_init__(self) -> None:
        if self.duration_s <= 0 or self.window_s <= 0:
            raise ValueError("duration and window must be positive")


@dataclass
class LoopResult:
    """The windows of one loop, in time order, and how the client itself fared."""

    windows: list[Recorder]
    origin_ns: int
    client_cpu: float
    send_lag: Recorder | None = None
    aborted: str = ""
    warnings: list[str] = field(default_factory=list)

    @property
    def total(self) -> Recorder:
        return merge(self.windows)


class Meter:
    """The window being recorded into; swapped by the controller, read by senders."""

    def __init__(self) -> None:
        self.window = Recorder()
        self.running = True

    def cut(self, now_ns: int) -> Recorder:
        done = self.window.close(now_ns)
        self.window = Recorder(now_ns)
        return done


def _requests(request: Requests) -> Sequence[bytes]:
    return (request,) if isinstance(request, bytes) else request


async def closed_loop(client: InferClient, request: Requests, *, concurrency: int,
                      settings: LoopSettings, stop_rule: StopRule | None = None,
                      progress: Progress | None = None, label: str = "") -> LoopResult:
    meter = Meter()
    requests = _requests(request)
    workers = [asyncio.create_task(_closed_worker(client, requests, meter, offset))
               for offset in range(concurrency)]
    result = await _measure(meter, settings, stop_rule, progress, label)
    await _drain(workers, settings.drain_s)
    return result


async def _closed_worker(client: InferClient, requests: Sequence[bytes], meter: Meter,
                         offset: int = 0) -> None:
    clock = time.perf_counter_ns
    count, turn = len(requests), offset
    while meter.running:
        request = requests[turn % count]
        turn += 1
        sent = clock()
        kind = await client.infer(request)
        if kind is None:
            meter.window.record(clock() - sent)
        else:
            meter.window.record_error(kind)
            # A refused connection can fail without a real wait: let the loop breathe.
            await asyncio.sleep(0)


async def open_loop(client: InferClient, request: Requests, *, rate: float,
                    settings: LoopSettings, seed: int = 0,
                    progress: Progress | None = None, label: str = "",
                    on_window: WindowHook | None = None) -> LoopResult:
    if rate <= 0:
        raise ValueError("rate must be positive")
    meter = Meter()
    lag = Recorder()
    in_flight: set[asyncio.Task[None]] = set()
    scheduler = asyncio.create_task(
        _schedule(client, request, meter, lag, in_flight, rate, seed))
    result = await _measure(meter, settings, None, progress, label, on_window)
    scheduler.cancel()
    # Requests still in flight were scheduled inside the run: their latency counts.
    await _drain(list(in_flight), settings.drain_s, meter.window)
    if result.windows:
        last = result.windows[-1]
        last.histogram.add(meter.window.histogram)
        last.errors.update(meter.window.errors)
    result.send_lag = lag.close()
    return result


async def _schedule(client: InferClient, request: Requests, meter: Meter, lag: Recorder,
                    in_flight: set[asyncio.Task[None]], rate: float, seed: int) -> None:
    requests = _requests(request)
    sent = 0
    rng = np.random.default_rng(seed)
    loop = asyncio.get_running_loop()
    clock = time.perf_counter_ns
    gaps: list[int] = []
    next_ns = clock()
    while meter.running:
        now = clock()
        # After a late wake-up, send everything that was due: the schedule never slips.
        while next_ns <= now:
            if len(in_flight) >= MAX_IN_FLIGHT:
                meter.window.record_error(CLIENT_OVERLOAD)
            else:
                task = loop.create_task(_open_request(client, requests[sent % len(requests)],
                                                      meter, lag, next_ns))
                sent += 1
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            if not gaps:
                gaps = (rng.exponential(1e9 / rate, 4096)).astype(np.int64).tolist()
            next_ns += gaps.pop()
        await asyncio.sleep((next_ns - now) / 1e9)


async def _open_request(client: InferClient, request: bytes, meter: Meter, lag: Recorder,
                        scheduled_ns: int) -> None:
    clock = time.perf_counter_ns
    lag.record(clock() - scheduled_ns)
    kind = await client.infer(request)
    if kind is None:
        meter.window.record(clock() - scheduled_ns)
    else:
        meter.window.record_error(kind)


async def _measure(meter: Meter, settings: LoopSettings, stop_rule: StopRule | None,
                   progress: Progress | None, label: str,
                   on_window: WindowHook | None = None) -> LoopResult:
    """Cut windows until the duration, count or stop rule ends the loop."""
    clock = time.perf_counter_ns
    if settings.warmup_s > 0:
        await asyncio.sleep(settings.warmup_s)
    cpu_start = time.thread_time()
    origin = clock()
    meter.cut(origin)
    windows: list[Recorder] = []
    end = origin + int(settings.duration_s * 1e9)
    next_cut = origin + int(settings.window_s * 1e9)
    next_progress = origin + int(PROGRESS_EVERY_S * 1e9)
    aborted = ""
    while True:
        await asyncio.sleep(TICK_S)
        now = clock()
        aborted = _failing(meter.window)
        if aborted or _count_reached(windows, meter.window, settings.max_requests):
            # Stopped mid-window: the partial window is kept, it holds the evidence.
            windows.append(meter.cut(now))
            break
        if now >= next_cut or now >= end:
            windows.append(meter.cut(now))
            if on_window is not None:
                on_window(windows[-1])
            next_cut += int(settings.window_s * 1e9)
            if now >= end or (stop_rule is not None and stop_rule(windows)):
                break
        if progress is not None and now >= next_progress:
            progress(_progress_line(label, windows, meter.window, (now - origin) / 1e9,
                                    settings.duration_s))
            next_progress = now + int(PROGRESS_EVERY_S * 1e9)
    # Stragglers land in a fresh window: the open loop keeps them, the closed loop not.
    meter.running = False
    meter.window = Recorder(now)
    wall = (now - origin) / 1e9
    cpu = (time.thread_time() - cpu_start) / wall if wall > 0 else 0.0
    return LoopResult(windows, origin, cpu, aborted=aborted)


def _failing(window: Recorder) -> str:
    if window.ok == 0 and window.failed >= ABORT_AFTER_ERRORS:
        kinds = ", ".join(f"{k} x{n}" for k, n in window.errors.most_common(3))
        return f"the server answered only errors ({kinds})"
    return ""


def _count_reached(windows: list[Recorder], current: Recorder, limit: int) -> bool:
    if limit <= 0:
        return False
    done = sum(w.ok + w.failed for w in windows) + current.ok + current.failed
    return done >= limit


def _progress_line(label: str, windows: list[Recorder], current: Recorder,
                   elapsed_s: float, duration_s: float) -> str:
    recent = windows[-1] if windows else current
    total_ok = sum(w.ok for w in windows) + current.ok
    total_failed = sum(w.failed for w in windows) + current.failed
    p99 = summarize(recent.histogram).p99_ms
    qps = recent.ok / max(recent.duration_s, 1e-9) if windows else 0.0
    return (f"{label}  {elapsed_s:5.1f}/{duration_s:.1f} s  ok {total_ok}  "
            f"errors {total_failed}  {qps:,.0f} req/s  p99 {p99:.2f} ms")


async def _drain(tasks: list[asyncio.Task[None]], timeout_s: float,
                 window: Recorder | None = None) -> None:
    """Let requests in flight finish; those still out after the timeout count as timeouts."""
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for task in pending:
        task.cancel()
        if window is not None:
            window.record_error("timeout")
    if pending:
        await asyncio.wait(pending)
