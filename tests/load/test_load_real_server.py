"""The load tool against ``turboinfer serve`` itself, over HTTP and gRPC."""

from __future__ import annotations

import pytest
from load_helpers import MAX_BATCH, RealServer

from turboinfer.load.scenarios import Scenario, ScenarioSettings
from turboinfer.load.session import LoadSettings, run_load

QUICK = ScenarioSettings(duration_s=0.5, window_s=0.25, warmup_s=0.2, timeout_s=10.0,
                         stability=10.0, max_windows=3)


def test_http_concurrency_with_the_servers_metrics(real_server: RealServer) -> None:
    settings = LoadSettings(url=real_server.http_url, model="linear", min_requests=10,
                            scenario=ScenarioSettings(**{**QUICK.__dict__,
                                                         "scenario": Scenario.CONCURRENCY,
                                                         "concurrency": (1, 8)}))
    report = run_load(settings)
    assert [r.label for r in report.runs] == ["concurrency 1", "concurrency 8"]
    assert not report.warnings, report.warnings   # /metrics was read
    for run in report.runs:
        assert run.ok > 0 and run.failed == 0
        server = run.server
        assert server is not None and server.max_batch_size == MAX_BATCH
        assert server.avg_batch_size is not None and 1.0 <= server.avg_batch_size <= MAX_BATCH
        assert server.queue_ms is not None and server.compute_ms is not None
        assert server.memory_mb is not None and server.memory_mb > 10
    # Eight clients keep the batcher busier than one.
    assert report.runs[1].server.avg_batch_size >= report.runs[0].server.avg_batch_size  # type: ignore[union-attr]


@pytest.mark.parametrize("binary", [True, False])
def test_http_single(real_server: RealServer, binary: bool) -> None:
    report = run_load(LoadSettings(url=real_server.http_url, model="linear", binary=binary,
                                   scenario=QUICK))
    assert report.runs[0].ok > 10 and report.runs[0].failed == 0


def test_grpc_poisson(real_server: RealServer) -> None:
    settings = LoadSettings(
        url=real_server.grpc_url, model="linear", protocol="grpc",
        metrics_url=real_server.http_url + "/metrics",
        scenario=ScenarioSettings(**{**QUICK.__dict__, "scenario": Scenario.POISSON,
                                     "rate": 100.0}))
    (run,) = run_load(settings).runs
    assert run.mode == "open" and run.failed == 0 and run.ok > 20
    assert run.server is not None and run.server.requests_ok == pytest.approx(run.ok, abs=25)


def test_grpc_unknown_model(real_server: RealServer) -> None:
    from turboinfer.errors import UnknownModelError

    with pytest.raises(UnknownModelError):
        run_load(LoadSettings(url=real_server.grpc_url, model="nope", protocol="grpc",
                              scenario=QUICK))
