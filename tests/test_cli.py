"""The command line as a user meets it: JSON on stdout, one-line errors, exit code 2."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from turboinfer import __version__
from turboinfer.cli import build_parser, format_default, main
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
     "input 'input' has a fixed size 8 where 9 is given"),
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


def _parsers(parser: argparse.ArgumentParser, name: str) -> Iterator[tuple[str, Any]]:
    """Every parser of the command line, nested subcommands included."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def _has_default(action: argparse.Action) -> bool:
    default = action.default
    return (bool(action.option_strings) and action.nargs != 0 and default is not None
            and default is not argparse.SUPPRESS and default != [] and default != ())


def _option_block(help_text: str, option: str) -> str:
    """The help of one option: its line, and the next when argparse moved the text there."""
    lines = help_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith(option))
    def indent(line: str) -> int:
        return len(line) - len(line.lstrip())

    rest = [line for line in lines[start + 1:start + 2] if indent(line) > indent(lines[start])]
    return " ".join([lines[start], *rest])


def test_every_help_shows_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option: no wrapped defaults
    parsers = dict(_parsers(build_parser(), "turboinfer"))
    assert {"turboinfer llm generate", "turboinfer llm bench", "turboinfer repo add"} <= set(
        parsers)
    for name, parser in parsers.items():
        text = parser.format_help()
        for action in filter(_has_default, parser._actions):
            shown = f"(default: {format_default(action.default)})"
            block = _option_block(text, action.option_strings[0])
            assert shown in block, f"{name} {action.option_strings[0]}: {block!r}"
            assert block.count("default") == 1 or "own default" in block, block


def test_llm_bench_help_shows_defaults() -> None:
    result = run_cli("llm", "bench", "--help")
    assert result.returncode == 0
    assert "(default: 1,4,16)" in result.stdout and "(default: auto)" in result.stdout


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([flag])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"turboinfer {__version__}"


def test_help_does_not_load_torch_or_onnxruntime() -> None:
    code = ("import sys; from turboinfer.cli import build_parser; build_parser(); "
            "print(sorted({'torch', 'onnxruntime', 'onnx'} & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, check=True)
    assert result.stdout.strip() == "[]"


def test_progress_goes_to_a_log_and_stdout_stays_json(tmp_path: Path) -> None:
    log = tmp_path / "log"
    # Progress lines from the first 0.2 s on; each measurement takes at least 0.3 s.
    env = dict(os.environ, TURBOINFER_PROGRESS_SECONDS="0.2")
    with log.open("w") as stderr:
        result = subprocess.run(
            [sys.executable, "-m", "turboinfer", "bench", "builtin:digits-cnn",
             "--batch-sizes", "1,2", "--min-runs", "3", "--min-seconds", "0.3", "--json"],
            stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=300, env=env)
    assert result.returncode == 0
    assert len(json.loads(result.stdout)["results"]) == 2
    lines = log.read_text().splitlines()
    assert any("[1/2] onnxruntime batch 1" in line for line in lines), lines
    assert any("[2/2] onnxruntime batch 2" in line for line in lines), lines
    assert all("\r" not in line and "\033" not in line for line in lines)


def test_defaults_repeated_from_settings_objects_agree() -> None:
    """Where importing the settings would make --help load torch, the CLI repeats them."""
    from turboinfer.commands import llm, optimize, prune
    from turboinfer.llm import EngineConfig, SamplingParams
    from turboinfer.llm.bench import BenchSettings
    from turboinfer.optimize.settings import OptimizeSettings
    from turboinfer.prune.measure import LatencySettings
    from turboinfer.prune.settings import DistillSettings, PruneSettings

    for key, value in llm.ENGINE_DEFAULTS.items():
        assert getattr(EngineConfig, key) == value, key
    for key, value in llm.SAMPLING_DEFAULTS.items():
        assert getattr(SamplingParams, key) == value, key
    for key, value in llm.BENCH_DEFAULTS.items():
        assert getattr(BenchSettings, key) == value, key
    assert tuple(v.value for v in OptimizeSettings.variants) == optimize.VARIANTS
    assert tuple(c.value for c in OptimizeSettings.calibrations) == optimize.CALIBRATIONS
    assert OptimizeSettings.calib_count == optimize.CALIB_COUNT
    expected = {"target_sparsity": PruneSettings.target_sparsity,
                "steps_per_phase": PruneSettings.steps_per_phase,
                "temperature": DistillSettings.temperature, "seed": PruneSettings.seed,
                "latency_batch": LatencySettings.batch_size,
                "latency_seconds": LatencySettings.rounds * LatencySettings.seconds_per_round}
    assert expected == prune.DEFAULTS
    assert LatencySettings.rounds == prune.LATENCY_ROUNDS
