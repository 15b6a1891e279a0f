"""``turboinfer load`` end to end: output files, exit codes, one-line errors, partial results."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest
from load_helpers import OipServer

from turboinfer.cli import main

QUICK = ["--duration", "0.3", "--window", "0.15", "--warmup", "0", "--timeout", "5",
         "--min-requests", "10", "--min-duration", "0.1", "--quiet"]


def _load(url: str, *args: str) -> list[str]:
    return ["load", url, "--model", "linear", *QUICK, *args]


def test_table_json_and_html(oip_server: OipServer, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    out, page = tmp_path / "a.json", tmp_path / "a.html"
    assert main(_load(oip_server.url, "--output", str(out), "--html", str(page))) == 0
    text = capsys.readouterr().out
    assert "single" in text and "p99_ms" in text and "valid: yes" in text
    doc = orjson.loads(out.read_bytes())
    assert doc["complete"] and doc["valid"] and doc["runs"][0]["ok"] > 10
    assert doc["settings"]["inputs"] == {"input": {"shape": [1, 16], "dtype": "float32"}}
    html = page.read_text()
    assert 'id="latency-over-time"' in html and 'id="latency-by-percentile"' in html
    assert "<script src=" not in html and 'src="http' not in html


def test_json_on_stdout_is_the_only_output(oip_server: OipServer,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_load(oip_server.url, "--json", "--json-tensors")) == 0
    doc = orjson.loads(capsys.readouterr().out)
    assert doc["encoding"] == "json" and doc["scenario"] == "single"


def test_unreachable_server(dead_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_load(dead_url)) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == f"error: cannot reach {dead_url}: Connection refused"


def test_unknown_model(oip_server: OipServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["load", oip_server.url, "--model", "nope", *QUICK]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: model 'nope' not found") and "\n" not in err


def test_server_answering_errors(oip_server: OipServer,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    oip_server.state.fail_status = 500
    assert main(_load(oip_server.url)) == 1
    assert capsys.readouterr().err.strip() == (
        "error: the server answered HTTP 500 to a request: model exploded")


def test_server_failing_mid_run_keeps_partial_results(oip_server: OipServer, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    oip_server.state.fail_status, oip_server.state.fail_after = 503, 300
    out = tmp_path / "partial.json"
    code = main(_load(oip_server.url, "--scenario", "concurrency", "--concurrency", "1,2",
                      "--max-windows", "40", "--output", str(out)))
    captured = capsys.readouterr()
    assert code == 1
    assert "http_503" in captured.err and captured.err.count("\n") == 1
    assert "concurrency 1" in captured.out
    doc = orjson.loads(out.read_bytes())
    assert not doc["complete"] and not doc["valid"] and doc["runs"]
    assert doc["runs"][0]["ok"] > 0 and doc["runs"][-1]["errors"]["http_503"] >= 20
    assert doc["error_messages"]["http_503"] == "model exploded"


def test_some_errors_fail_the_run_but_print_it(oip_server: OipServer,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    oip_server.state.fail_status, oip_server.state.fail_after = 400, 30
    # Failures after the 30th request: the run ends early or counts errors, never exit 0.
    assert main(_load(oip_server.url)) == 1
    captured = capsys.readouterr()
    assert "single" in captured.out and "http_400" in captured.err


def test_input_file_of_wrong_shape(oip_server: OipServer, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, input=np.zeros((1, 15), np.float32))
    assert main(_load(oip_server.url, "--input-data", str(path))) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: {path}: input 'input' has shape [1, 15], "
                   "model 'input' expects [-1, 16] (-1: any size)")


def test_input_file_that_fits(oip_server: OipServer, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "good.npz"
    np.savez(path, input=np.ones((4, 16), np.float64))
    assert main(_load(oip_server.url, "--input-data", str(path), "--json")) == 0
    doc = orjson.loads(capsys.readouterr().out)
    assert doc["settings"]["inputs"]["input"] == {"shape": [4, 16], "dtype": "float32"}


@pytest.mark.parametrize(("args", "message"), [
    (["load", "http://127.0.0.1:1"], "--model is required"),
    (["load", "http://127.0.0.1:1", "extra", "--model", "m"], "unexpected arguments"),
    (["load", "http://127.0.0.1:1", "--model", "m", "--scenario", "poisson"], "--rate"),
    (["load", "compare", "only-one.json"], "usage: turboinfer load compare"),
])
def test_usage_errors(args: list[str], message: str,
                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_compare_two_runs(oip_server: OipServer, tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    fast, slow = tmp_path / "fast.json", tmp_path / "slow.json"
    assert main(_load(oip_server.url, "--output", str(fast))) == 0
    oip_server.state.delay_s = 0.004
    assert main(_load(oip_server.url, "--output", str(slow))) == 0
    capsys.readouterr()
    assert main(["load", "compare", str(fast), str(slow), "--json"]) == 0
    (point,) = orjson.loads(capsys.readouterr().out)["points"]
    assert point["label"] == "single"
    assert point["ratios"]["qps"] < 0.5 and point["ratios"]["p50_ms"] > 2
    assert main(["load", "compare", str(fast), str(slow)]) == 0
    table = capsys.readouterr().out
    assert "candidate / baseline" in table and "x-" in table


def test_compare_rejects_other_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other.json"
    other.write_text('{"results": []}')
    assert main(["load", "compare", str(other), str(other)]) == 2
    assert "is not a 'turboinfer load --output' report" in capsys.readouterr().err
