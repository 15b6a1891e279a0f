"""The load report page: real short runs against the test server, written with
``--html``'s ``write_html`` and rendered in headless Chromium with no network."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from load_helpers import OipServer

from report_browser import Rendered, render
from turboinfer.load.html import nines, write_html
from turboinfer.load.results import LoadReport
from turboinfer.load.scenarios import Scenario, ScenarioSettings
from turboinfer.load.session import LoadSettings, run_load

QUICK = {"duration_s": 0.4, "window_s": 0.1, "warmup_s": 0.0, "timeout_s": 5.0}


def _load(server: OipServer, scenario: ScenarioSettings) -> LoadReport:
    report = run_load(LoadSettings(url=server.url, model="linear", min_duration_s=0.1,
                                   min_requests=10, scenario=scenario))
    assert report.complete and report.runs
    return report


def _render(report: LoadReport, folder: Path, charts: int) -> Rendered:
    page, shot = folder / "load.html", folder / "load-report.png"
    write_html(report, page)
    seen = render(page, shot, charts=charts)
    assert seen.console_errors == []
    assert seen.outside_requests == [] and seen.failed_requests == []
    assert seen.charts == charts and all(seen.traces)
    assert seen.tables == 2  # the facts and the summary
    header = shot.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    assert width >= 1000 and height >= 900 and shot.stat().st_size > 10_000
    return seen


def test_a_concurrency_sweep_renders_offline_in_chromium(oip_server: OipServer,
                                                        tmp_path: Path) -> None:
    report = _load(oip_server, ScenarioSettings(scenario=Scenario.CONCURRENCY,
                                                concurrency=(1, 4), **QUICK))
    # Latency over time, by percentile, and throughput against p99 (two load points).
    seen = _render(report, tmp_path, charts=3)
    assert "concurrency 1" in seen.hover_text and " ms" in seen.hover_text
    page = (tmp_path / "load.html").read_text()
    assert "<script src=" not in page and "<pre>" not in page
    assert "queue ms" in page  # the server's side, read from its /metrics


def test_a_maxrate_search_draws_its_p99_bound(oip_server: OipServer, tmp_path: Path) -> None:
    oip_server.state.delay_s = 0.002
    # Probes of a second: one of 0.3 s completed no request once in a whole-suite run on
    # a busy 2-core machine.
    report = _load(oip_server, ScenarioSettings(
        scenario=Scenario.MAXRATE, p99_ms=50.0, probe_concurrency=4, trial_s=1.0,
        max_trials=2, **QUICK))
    assert report.maxrate is not None
    _render(report, tmp_path, charts=3)
    page = (tmp_path / "load.html").read_text()
    assert page.count("p99 bound 50 ms") >= 3  # one line on each latency chart
    assert "max rate with p99 &lt;= 50 ms" in page


@pytest.mark.parametrize(("percentile", "position"), [
    (0.0, 0.0), (90.0, 1.0), (99.0, 2.0), (99.9, 3.0), (100.0, 5.0)])
def test_percentiles_sit_on_the_nines_axis(percentile: float, position: float) -> None:
    assert nines(percentile) == pytest.approx(position)
