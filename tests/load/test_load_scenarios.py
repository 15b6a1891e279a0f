"""Each scenario against the live loopback test server, bounded to about a second."""

from __future__ import annotations

from dataclasses import replace

import pytest
from load_helpers import MAX_BATCH, OipServer

from turboinfer.load.scenarios import Scenario, ScenarioSettings
from turboinfer.load.session import LoadSettings, run_load

QUICK = ScenarioSettings(duration_s=0.4, window_s=0.2, warmup_s=0.0, timeout_s=5.0,
                         trial_s=0.3, max_windows=4)


def _settings(server: OipServer, **scenario: object) -> LoadSettings:
    return LoadSettings(url=server.url, model="linear", min_duration_s=0.1, min_requests=10,
                        scenario=replace(QUICK, **scenario))  # type: ignore[arg-type]


@pytest.mark.parametrize("binary", [True, False])
def test_single_counts_what_the_server_saw(oip_server: OipServer, binary: bool) -> None:
    report = run_load(replace(_settings(oip_server), binary=binary))
    (run,) = report.runs
    assert run.label == "single" and run.concurrency == 1 and run.failed == 0
    # The check request before the run is the one the server saw that the run did not.
    assert run.ok + 1 <= oip_server.state.requests <= run.ok + 2
    assert 0 < run.latency.p50_ms <= run.latency.p99_ms <= run.latency.max_ms
    assert run.qps == pytest.approx(run.ok / run.duration_s)
    assert report.validity() == (True, [])


def test_concurrency_sweep_reports_each_level_with_server_side(oip_server: OipServer) -> None:
    report = run_load(_settings(oip_server, scenario=Scenario.CONCURRENCY,
                                concurrency=(1, 4), stability=10.0))
    assert [r.label for r in report.runs] == ["concurrency 1", "concurrency 4"]
    for run in report.runs:
        # A huge tolerance makes every level stable after exactly 3 windows.
        assert run.stable is True and len(run.windows) == 3
        server = run.server
        assert server is not None and server.requests_ok == pytest.approx(run.ok, rel=0.2)
        assert server.avg_batch_size == pytest.approx(2.0, rel=0.05)  # batch_every=2
        assert server.batch_efficiency == pytest.approx(2.0 / MAX_BATCH, rel=0.05)
        assert server.queue_ms is not None and server.memory_mb == pytest.approx(100.0)


def test_unstable_levels_are_marked_and_make_the_run_invalid(oip_server: OipServer) -> None:
    report = run_load(_settings(oip_server, scenario=Scenario.CONCURRENCY, concurrency=(2,),
                                stability=1e-9, max_windows=3))
    assert report.runs[0].stable is False
    valid, reasons = report.validity()
    assert not valid and "concurrency 2: not stable" in reasons


def test_poisson_keeps_the_rate(oip_server: OipServer) -> None:
    report = run_load(_settings(oip_server, scenario=Scenario.POISSON, rate=400.0,
                                duration_s=1.0))
    (run,) = report.runs
    assert run.mode == "open" and run.target_rate == 400.0
    assert run.qps == pytest.approx(400.0, rel=0.5)
    assert run.send_lag_p99_ms is not None


def test_maxrate_finds_the_rate_a_slow_server_sustains(oip_server: OipServer) -> None:
    # 5 ms per request at concurrency 2 → about 400 req/s; a p99 bound of 50 ms holds
    # below that and breaks above it as the queue grows.
    oip_server.state.delay_s = 0.005
    report = run_load(_settings(oip_server, scenario=Scenario.MAXRATE, p99_ms=50.0,
                                probe_concurrency=2, trial_s=0.5, max_trials=5))
    result = report.maxrate
    assert result is not None and len(result.trials) == 5
    assert 0 < result.max_rate <= 1.5 * result.capacity_qps
    assert any(ok for _, ok in result.trials)
    passing = [run for run in report.runs if run.target_rate == result.max_rate]
    assert passing and passing[0].latency.p99_ms <= 50.0


def test_soak_sees_a_leaking_server(oip_server: OipServer) -> None:
    oip_server.state.leak_per_request = 200_000  # 0.2 MB a request: 100 MB at the start
    report = run_load(_settings(oip_server, scenario=Scenario.SOAK, rate=200.0,
                                duration_s=1.0, window_s=0.25))
    soak = report.soak
    assert soak is not None and soak.verdict == "drift"
    assert soak.memory_growth is not None and soak.memory_growth > 0.2
    assert any("memory grew" in reason for reason in soak.reasons)
    assert len(soak.memory_series) >= 4
