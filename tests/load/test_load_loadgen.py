"""MLPerf LoadGen driving the loopback test server through turboinfer's client."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from load_helpers import OipServer

from turboinfer.cli import main
from turboinfer.errors import MissingDependencyError
from turboinfer.load.loadgen import LoadgenSettings, run_loadgen
from turboinfer.load.scenarios import ScenarioSettings
from turboinfer.load.session import LoadSettings


def _settings(server: OipServer, **scenario: float) -> LoadSettings:
    return LoadSettings(url=server.url, model="linear", metrics_url="",
                        scenario=ScenarioSettings(duration_s=0.5, timeout_s=5.0, **scenario))


def test_singlestream_is_valid_and_counts_every_query(oip_server: OipServer,
                                                      tmp_path: Path) -> None:
    pytest.importorskip("mlperf_loadgen")
    summary = run_loadgen(_settings(oip_server),
                          LoadgenSettings(mode="singlestream", output_dir=tmp_path))
    assert summary.valid and summary.result == "VALID" and not summary.errors
    assert summary.fields["Scenario"] == "SingleStream"
    # The check request comes first; every LoadGen query reached the server.
    assert oip_server.state.requests >= 100


def test_server_mode_through_the_cli(oip_server: OipServer, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("mlperf_loadgen")
    code = main(["load", oip_server.url, "--model", "linear", "--loadgen", "server",
                 "--rate", "200", "--p99-ms", "100", "--duration", "0.5",
                 "--no-metrics", "--loadgen-logs", str(tmp_path)])
    out = capsys.readouterr().out
    assert out.startswith("MLPerf LoadGen server: ")
    assert "Scheduled samples per second" in out and "full summary" in out
    assert code == (0 if "server: VALID" in out else 1)


def test_server_errors_make_the_run_invalid(oip_server: OipServer, tmp_path: Path) -> None:
    pytest.importorskip("mlperf_loadgen")
    oip_server.state.fail_status, oip_server.state.fail_after = 503, 20
    summary = run_loadgen(_settings(oip_server),
                          LoadgenSettings(mode="singlestream", output_dir=tmp_path))
    assert not summary.valid and summary.errors["http_503"] > 0


def test_missing_package_names_it(oip_server: OipServer, monkeypatch: pytest.MonkeyPatch,
                                  tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "mlperf_loadgen", None)
    with pytest.raises(MissingDependencyError, match="pip install mlcommons-loadgen"):
        run_loadgen(_settings(oip_server), LoadgenSettings(output_dir=tmp_path))
