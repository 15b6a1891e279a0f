"""The load generator must not be the bottleneck: one process, one core, >= 3,000 req/s
against a server that answers at once (the recorded figure is in benchmarks/README.md)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from turboinfer.load.scenarios import Scenario, ScenarioSettings
from turboinfer.load.session import LoadSettings, run_load

REQUIRED_QPS = 3_000


@pytest.fixture(scope="module")
def instant_url() -> Iterator[str]:
    process = subprocess.Popen([sys.executable, "-m", "turboinfer.load.instant"],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    try:
        line = process.stdout.readline()   # "instant OIP server on http://... model=..."
        yield line.split()[4]
    finally:
        process.terminate()
        process.wait(10)
        process.stdout.close()


def test_client_sustains_3000_requests_per_second(instant_url: str) -> None:
    report = run_load(LoadSettings(
        url=instant_url, model="instant", metrics_url="",
        scenario=ScenarioSettings(scenario=Scenario.CONCURRENCY, concurrency=(8,),
                                  window_s=0.5, max_windows=3, stability=10.0,
                                  warmup_s=0.2)))
    (run,) = report.runs
    assert run.failed == 0
    assert run.qps >= REQUIRED_QPS, f"{run.qps:.0f} req/s"
