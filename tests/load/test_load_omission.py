"""Coordinated omission: a server that stalls once, measured both ways.

The server stops answering for STALL_S once, early in the run. An open loop keeps
sending on schedule, so every request scheduled during the stall waits and its latency
(from its scheduled time) shows it: the p99 carries the stall. A closed loop stops
sending while it waits, records the stall once, and its p99 hides it; the report must
say so, with the corrected p99.
"""

from __future__ import annotations

import pytest
from load_helpers import OipServer

from turboinfer.load.scenarios import Scenario, ScenarioSettings
from turboinfer.load.session import LoadSettings, run_load

STALL_S = 0.4


def _run(server: OipServer, scenario: ScenarioSettings) -> LoadSettings:
    return LoadSettings(url=server.url, model="linear", metrics_url="", scenario=scenario)


def test_open_loop_p99_shows_the_stall(oip_server: OipServer) -> None:
    oip_server.state.stall_after, oip_server.state.stall_s = 60, STALL_S
    report = run_load(_run(oip_server, ScenarioSettings(
        scenario=Scenario.POISSON, rate=200.0, duration_s=1.5, window_s=0.5, warmup_s=0.0)))
    (run,) = report.runs
    # ~80 of ~300 requests were scheduled inside the stall: well past the 99th percentile.
    assert run.latency.p99_ms >= 0.5 * STALL_S * 1000
    assert run.latency.p90_ms >= 0.1 * STALL_S * 1000
    assert run.failed == 0 and run.qps == pytest.approx(200, rel=0.3)


def test_closed_loop_p99_hides_the_stall_and_the_report_says_so(oip_server: OipServer) -> None:
    oip_server.state.stall_after, oip_server.state.stall_s = 200, STALL_S
    report = run_load(_run(oip_server, ScenarioSettings(
        scenario=Scenario.SINGLE, duration_s=1.5, window_s=0.5, warmup_s=0.0)))
    (run,) = report.runs
    assert run.latency.max_ms >= STALL_S * 1000
    assert run.latency.p99_ms < run.corrected_p99_ms if run.corrected_p99_ms else True
    assert run.corrected_p99_ms is not None
    assert run.corrected_p99_ms >= 0.5 * STALL_S * 1000        # the correction finds it
    (warning,) = [w for w in run.warnings if "coordinated omission" in w]
    assert f"{run.corrected_p99_ms:.1f} ms" in warning and "--scenario poisson" in warning

