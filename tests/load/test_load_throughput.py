"""The load generator against a server that answers at once: the path used to measure the
client's own ceiling. The speed itself (>= 3,000 req/s from one process) is recorded by
benchmarks/serving/client_overhead.py in benchmarks/README.md, not asserted here."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from turboinfer.load.scenarios import Scenario, ScenarioSettings
from turboinfer.load.session import LoadSettings, run_load


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


def test_client_drives_an_instant_server(instant_url: str) -> None:
    report = run_load(LoadSettings(
        url=instant_url, model="instant", metrics_url="",
        scenario=ScenarioSettings(scenario=Scenario.CONCURRENCY, concurrency=(8,),
                                  window_s=0.5, max_windows=3, stability=10.0,
                                  warmup_s=0.2)))
    (run,) = report.runs
    assert run.failed == 0
    assert run.ok > 0 and run.qps > 0
    assert run.client_cpu >= 0
