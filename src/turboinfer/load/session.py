"""One load test end to end: connect, describe the model, prepare the request once,
run the scenario, and hand back a report that keeps whatever finished."""

from __future__ import annotations

import asyncio
import datetime as dt
import platform
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from turboinfer.errors import InvalidInputError, TurboinferError
from turboinfer.hardware import profile
from turboinfer.load.client import InferClient, make_client
from turboinfer.load.endpoint import Endpoint
from turboinfer.load.inputs import ModelInfo, load_inputs, random_inputs
from turboinfer.load.metrics import MetricsSource
from turboinfer.load.raw_data import is_raw, raw_requests
from turboinfer.load.results import LoadReport
from turboinfer.load.runner import Progress, Requests
from turboinfer.load.scenarios import (
    Context,
    Scenario,
    ScenarioSettings,
    run_concurrency,
    run_poisson,
    run_single,
)
from turboinfer.load.search import run_maxrate
from turboinfer.load.soak import run_soak

SCENARIOS: dict[Scenario, Callable[[Context], Awaitable[None]]] = {
    Scenario.SINGLE: run_single,
    Scenario.CONCURRENCY: run_concurrency,
    Scenario.POISSON: run_poisson,
    Scenario.MAXRATE: run_maxrate,
    Scenario.SOAK: run_soak,
}


@dataclass(frozen=True)
class LoadSettings:
    """Where to send, what to send, and the scenario to run."""

    url: str
    model: str
    version: str = ""
    protocol: str = "http"
    binary: bool = True
    input_file: Path | None = None
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    batch_size: int = 1
    max_connections: int = 1024
    # None: the server's own /metrics over HTTP; "" turns scraping off.
    metrics_url: str | None = None
    min_duration_s: float = 1.0
    min_requests: int = 100
    scenario: ScenarioSettings = field(default_factory=ScenarioSettings)

    def resolved_metrics_url(self) -> str:
        if self.metrics_url is not None:
            return self.metrics_url
        if self.protocol != "http":
            return ""
        return Endpoint.parse(self.url).url + "/metrics"


def run_load(settings: LoadSettings, *, progress: Progress | None = None) -> LoadReport:
    """Run the scenario. Failures before anything was measured raise; later ones (and
    Ctrl-C) are recorded in ``report.error`` beside the runs that finished."""
    report = new_report(settings)
    try:
        asyncio.run(_run(settings, report, progress))
    except TurboinferError as exc:
        if not report.runs:
            raise
        report.error = str(exc)
    except KeyboardInterrupt:
        report.error = "interrupted"
    return report


def new_report(settings: LoadSettings) -> LoadReport:
    scenario = asdict(settings.scenario)
    scenario["scenario"] = settings.scenario.scenario.value
    return LoadReport(
        url=settings.url, model=settings.model, protocol=settings.protocol,
        encoding="binary" if settings.binary else "json",
        scenario=settings.scenario.scenario.value, settings=scenario,
        machine=machine(), started_at=dt.datetime.now(dt.UTC).isoformat(),
        min_duration_s=settings.min_duration_s, min_requests=settings.min_requests,
    )


async def _run(settings: LoadSettings, report: LoadReport, progress: Progress | None) -> None:
    client = make_client(settings.url, protocol=settings.protocol,
                         timeout_s=settings.scenario.timeout_s,
                         max_connections=settings.max_connections)
    metrics_url = settings.resolved_metrics_url()
    metrics = MetricsSource(metrics_url) if metrics_url else None
    try:
        info = await client.model_info(settings.model, settings.version)
        request = await _prepare(client, info, settings, report)
        ctx = Context(client, request, info, settings.scenario, report, metrics, progress)
        await SCENARIOS[settings.scenario.scenario](ctx)
    finally:
        await client.close()
        if metrics is not None:
            await metrics.close()
            if metrics.unavailable:
                report.warnings.append(f"server metrics not read: {metrics.unavailable}")


async def _prepare(client: InferClient, info: ModelInfo, settings: LoadSettings,
                   report: LoadReport) -> Requests:
    """Encode the requests once and check that the server accepts the first."""
    if settings.input_file is not None and is_raw(settings.input_file):
        if settings.input_file.is_dir() and not settings.binary:
            raise InvalidInputError("--input-data with image files needs binary tensors "
                                    "(JSON carries text only); drop --json-tensors")
        many = raw_requests(settings.input_file, info, settings.batch_size)
        report.settings["inputs"] = {name: {"shape": list(a.shape), "dtype": "BYTES",
                                            "source": str(settings.input_file),
                                            "requests": len(many)}
                                     for name, a in many[0].items()}
        report.settings["max_batch_size"] = info.max_batch_size
        requests = [client.prepare(info, tensors, binary=settings.binary) for tensors in many]
        await client.check(requests[0])
        return requests
    tensors = _tensors(info, settings)
    report.settings["inputs"] = {name: {"shape": list(a.shape), "dtype": str(a.dtype)}
                                 for name, a in tensors.items()}
    report.settings["max_batch_size"] = info.max_batch_size
    request = client.prepare(info, tensors, binary=settings.binary)
    await client.check(request)
    return request


async def prepare_request(client: InferClient, settings: LoadSettings) -> bytes:
    """Describe the model, encode its request once, and check the server accepts it."""
    info = await client.model_info(settings.model, settings.version)
    request = client.prepare(info, _tensors(info, settings), binary=settings.binary)
    await client.check(request)
    return request


def _tensors(info: ModelInfo, settings: LoadSettings) -> dict[str, np.ndarray]:
    if not info.tensor_inputs:
        raise InvalidInputError(f"model {info.name!r} declares no inputs in its metadata, so "
                                f"there is nothing to send; declare them on the server")
    if settings.input_file is not None:
        if is_raw(settings.input_file):
            return raw_requests(settings.input_file, info, settings.batch_size)[0]
        return load_inputs(settings.input_file, info)
    return random_inputs(info, batch_size=settings.batch_size, shapes=dict(settings.shapes),
                         seed=settings.scenario.seed)


def error_verdict(report: LoadReport, max_error_rate: float) -> str:
    """Why the run failed on errors, or "" — a search's failing trials are expected."""
    if report.error:
        return report.error
    if report.scenario == Scenario.MAXRATE.value:
        return ""
    for run in report.runs:
        if run.error_rate >= max_error_rate and run.failed:
            kinds = ", ".join(f"{k} x{n}" for k, n in run.errors.items())
            return (f"{run.label}: {run.failed} of {run.ok + run.failed} requests failed "
                    f"({kinds})")
    return ""


def machine() -> dict[str, Any]:
    """Enough to tell two machines apart in a recorded result."""

    hw = profile(engines=False, gpus=False)
    return {
        "cpu": hw.cpu.model_name or platform.processor() or platform.machine(),
        "logical_cores": hw.cpu.logical_cores,
        "memory_gb": round(hw.memory.total_bytes / 2**30, 1),
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
    }
