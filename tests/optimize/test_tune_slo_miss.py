"""A tune where no candidate meets the SLO: exit code 3 with the best candidate and by
how much it missed, and nothing written unless asked, so `tune && serve` never deploys a
configuration that misses the SLO."""

from __future__ import annotations

from pathlib import Path

import pytest

from turboinfer.cli import main

# An SLO no engine meets (a microsecond), on a quick search.
ARGS = ["tune", "builtin:digits-cnn", "--slo-p99-ms", "0.001", "--max-accuracy-drop", "1",
        "--engines", "onnxruntime", "--variants", "graph", "--batch-sizes", "1,4",
        "--threads", "1", "--calib-count", "50"]


def test_a_missed_slo_exits_3_and_writes_nothing(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "-o", str(tmp_path)]) == 3
    out = capsys.readouterr().out
    assert "no candidate meets the p99 SLO of 0.001 ms" in out and "ms over" in out
    assert "--write-on-slo-miss" in out
    assert not (tmp_path / "digits-cnn" / "config.yaml").exists()
    assert (tmp_path / "digits-cnn" / "tune" / "report.json").exists()


def test_write_on_slo_miss_writes_the_lowest_latency_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "-o", str(tmp_path), "--write-on-slo-miss"]) == 3
    assert "it was written as asked" in capsys.readouterr().out
    assert (tmp_path / "digits-cnn" / "config.yaml").exists()
