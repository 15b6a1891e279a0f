"""``--loadgen``: the official MLPerf LoadGen (``mlcommons-loadgen``) drives the server.

LoadGen decides when each query is issued and judges the run; the system under test
here only forwards every sample to the server (the request prepared once, as in the
other scenarios) and reports completion. An asyncio loop in a helper thread carries the
requests, since LoadGen calls ``issue_queries`` from its own threads.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from turboinfer.errors import ConfigError, MissingDependencyError
from turboinfer.load.client import InferClient, ServerError, make_client
from turboinfer.load.runner import LoopSettings, closed_loop
from turboinfer.load.session import LoadSettings, prepare_request

T = TypeVar("T")
MODES = ("singlestream", "server", "offline")
# Identical samples: the QSL only needs enough of them for LoadGen's sampling.
SAMPLE_COUNT = 64
CAPACITY_PROBE_S = 1.0


@dataclass(frozen=True)
class LoadgenSettings:
    mode: str = "singlestream"
    output_dir: Path = Path("mlperf-logs")
    min_query_count: int = 100
    # LoadGen sizes a SingleStream run from this guess and stops once the minimum duration
    # and count are met, so a low guess only means it is never cut short.
    expected_latency_ms: float = 0.05


@dataclass(frozen=True)
class LoadgenSummary:
    mode: str
    valid: bool
    result: str
    fields: dict[str, str]
    errors: dict[str, int] = field(default_factory=dict)
    summary_path: Path | None = None


def _lg() -> Any:
    try:
        import mlperf_loadgen  # why: optional (the loadgen extra)
    except ImportError:
        raise MissingDependencyError(
            "--loadgen needs MLPerf LoadGen: pip install mlcommons-loadgen") from None
    return mlperf_loadgen


class _LoopThread:
    """An event loop in a daemon thread, for callers that are not coroutines."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def run_loadgen(settings: LoadSettings, lg_settings: LoadgenSettings) -> LoadgenSummary:
    lg = _lg()
    if lg_settings.mode == "server" and settings.scenario.rate <= 0:
        raise ConfigError("--loadgen server needs --rate: the target queries per second")
    bridge = _LoopThread()
    timeout = settings.scenario.timeout_s
    try:
        client = bridge.run(_connect(settings), timeout + 5)
        request = bridge.run(prepare_request(client, settings), timeout + 5)
        if lg_settings.mode == "offline" and settings.scenario.rate <= 0:
            # Offline issues every sample at once, sized by the expected rate: measure it.
            rate = bridge.run(_capacity(client, request, settings), timeout + 10)
            settings = replace(settings, scenario=replace(settings.scenario, rate=rate))
        errors: Counter[str] = Counter()
        try:
            _start(lg, client, request, bridge, errors, settings, lg_settings)
        finally:
            bridge.run(client.close(), 10)
    finally:
        bridge.close()
    return read_summary(lg_settings.output_dir, lg_settings.mode, dict(errors))


async def _capacity(client: InferClient, request: bytes, settings: LoadSettings) -> float:
    loop = await closed_loop(client, request, concurrency=settings.scenario.probe_concurrency,
                             settings=LoopSettings(duration_s=CAPACITY_PROBE_S,
                                                   window_s=CAPACITY_PROBE_S))
    total = loop.total
    if total.ok == 0:
        raise ServerError("the capacity probe before the offline run completed no request")
    return total.ok / total.duration_s


async def _connect(settings: LoadSettings) -> InferClient:
    return make_client(settings.url, protocol=settings.protocol,
                       timeout_s=settings.scenario.timeout_s,
                       max_connections=settings.max_connections)


def _start(lg: Any, client: InferClient, request: bytes, bridge: _LoopThread,
           errors: Counter[str], settings: LoadSettings, lg_settings: LoadgenSettings) -> None:
    async def forward(sample_id: int) -> None:
        kind = await client.infer(request)
        if kind is not None:
            errors[kind] += 1
        lg.QuerySamplesComplete([lg.QuerySampleResponse(sample_id, 0, 0)])

    def issue_queries(samples: list[Any]) -> None:
        for sample in samples:
            asyncio.run_coroutine_threadsafe(forward(sample.id), bridge.loop)

    def no_op(indices: list[int]) -> None:
        pass

    sut = lg.ConstructSUT(issue_queries, lambda: None)
    qsl = lg.ConstructQSL(SAMPLE_COUNT, SAMPLE_COUNT, no_op, no_op)
    lg_settings.output_dir.mkdir(parents=True, exist_ok=True)
    log = lg.LogSettings()
    log.log_output.outdir = str(lg_settings.output_dir)
    log.log_output.copy_summary_to_stdout = False
    try:
        lg.StartTestWithLogSettings(sut, qsl, test_settings(lg, settings, lg_settings), log)
    finally:
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)


def test_settings(lg: Any, settings: LoadSettings, lg_settings: LoadgenSettings) -> Any:
    """LoadGen's settings from ours: duration, rate and p99 bound carry over."""
    s = settings.scenario
    ts = lg.TestSettings()
    ts.scenario = {"singlestream": lg.TestScenario.SingleStream,
                   "server": lg.TestScenario.Server,
                   "offline": lg.TestScenario.Offline}[lg_settings.mode]
    ts.mode = lg.TestMode.PerformanceOnly
    ts.min_duration_ms = int(s.duration_s * 1000)
    # A ceiling keeps every run bounded even if the server is far slower than expected.
    ts.max_duration_ms = int(s.duration_s * 1000 * 3 + s.timeout_s * 1000)
    ts.min_query_count = lg_settings.min_query_count
    ts.single_stream_expected_latency_ns = int(lg_settings.expected_latency_ms * 1e6)
    if s.rate > 0:
        ts.server_target_qps = s.rate
        ts.offline_expected_qps = s.rate
    if s.p99_ms > 0:
        ts.server_target_latency_ns = int(s.p99_ms * 1e6)
    return ts


def read_summary(folder: Path, mode: str, errors: dict[str, int]) -> LoadgenSummary:
    """The key/value lines of ``mlperf_log_summary.txt`` and its VALID/INVALID verdict."""
    path = folder / "mlperf_log_summary.txt"
    fields: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() and value.strip():
                fields.setdefault(key.strip(), value.strip())
    result = fields.get("Result is", "no summary written")
    return LoadgenSummary(mode, result == "VALID" and not errors, result, fields, errors,
                          path if path.exists() else None)


def format_loadgen(summary: LoadgenSummary) -> str:
    keys = [k for k in summary.fields if any(
        word in k for word in ("per second", "latency", "Result", "Scenario", "Min ", "Max "))]
    lines = [f"MLPerf LoadGen {summary.mode}: {summary.result}"]
    lines += [f"  {key}: {summary.fields[key]}" for key in keys]
    if summary.errors:
        lines.append("  request errors: " + ", ".join(f"{k} x{n}" for k, n in
                                                      summary.errors.items()))
    if summary.summary_path is not None:
        lines.append(f"  full summary: {summary.summary_path}")
    return "\n".join(lines)
