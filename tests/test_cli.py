"""The command line as a user meets it: JSON on stdout, one-line errors, exit code 2."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from turboinfer.cli import main
from turboinfer.commands import discover


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "turboinfer", *args],
                          capture_output=True, text=True, timeout=300)


def test_every_subcommand_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    for module in discover():
        with pytest.raises(SystemExit) as info:
            main([module.NAME, "--help"])
        assert info.value.code == 0
        assert "usage: turboinfer" in capsys.readouterr().out


def test_bench_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "builtin:digits-cnn", "--engines", "onnxruntime,torch",
                 "--batch-sizes", "1,4", "--min-runs", "5", "--min-seconds", "0", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"] == "digits-cnn"
    assert report["machine"]["logical_cores"] >= 1
    rows = {(r["engine"], r["batch_size"]): r for r in report["results"]}
    assert set(rows) == {("onnxruntime", 1), ("onnxruntime", 4), ("torch", 1), ("torch", 4)}
    for row in rows.values():
        assert 0 < row["p50_ms"] <= row["p90_ms"] <= row["p95_ms"] <= row["p99_ms"]
        assert row["qps"] > 0 and row["peak_rss_mb"] > 0 and row["mean_ms"] > 0


def test_bench_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "builtin:digits-cnn", "--min-runs", "3", "--min-seconds", "0"]) == 0
    out = capsys.readouterr().out
    assert "p50_ms" in out and "onnxruntime" in out


@pytest.mark.parametrize("args, message", [
    (["bench", "builtin:nope"], "unknown builtin model 'nope'"),
    (["bench", "/nonexistent/model.onnx"], "not found: /nonexistent/model.onnx"),
    (["bench", "builtin:digits-cnn", "--input-shape", "input=1x9x9", "--min-seconds", "0"],
     "input 'input' has shape [1, 1, 9, 9]"),
    (["bench", "builtin:digits-cnn", "--engines", "tvm"], "unknown engine 'tvm'"),
])
def test_bad_input_is_one_line_exit_2(args: list[str], message: str) -> None:
    result = run_cli(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [f"error: {result.stderr.strip()[7:]}"]
    assert message in result.stderr
    assert result.stdout == ""


def test_corrupt_onnx_file(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\xff\x00not an onnx model" * 20)
    result = run_cli("bench", str(corrupt))
    assert result.returncode == 2
    assert "corrupt.onnx" in result.stderr and "Traceback" not in result.stderr


def test_missing_optional_engine(monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    from turboinfer import engines

    real = importlib.util.find_spec
    monkeypatch.setattr(engines.importlib.util, "find_spec",
                        lambda name, *a: None if name == "openvino" else real(name, *a))
    code = main(["bench", "builtin:digits-cnn", "--engines", "openvino", "--json"])
    assert code == 2
    captured = capsys.readouterr()
    assert "turboinfer[openvino]" in captured.err and captured.out == ""
