"""``turboinfer load --shape`` means what ``bench --shape`` means: the batch axis comes
from ``--batch-size``, and a flag that does not fit the server's model is exit 2."""

from __future__ import annotations

import orjson
import pytest
from load_helpers import OipServer

from turboinfer.cli import main

QUICK = ["--duration", "0.3", "--window", "0.15", "--warmup", "0", "--timeout", "5",
         "--min-requests", "1", "--min-duration", "0.1", "--quiet", "--no-metrics"]


def test_shape_excludes_the_batch_axis(oip_server: OipServer,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    args = ["load", oip_server.url, "--model", "linear", *QUICK, "--json",
            "--shape", "input=16", "--batch-size", "3", "--max-requests", "5"]
    assert main(args) == 0
    doc = orjson.loads(capsys.readouterr().out)
    assert doc["settings"]["inputs"]["input"] == {"shape": [3, 16], "dtype": "float32"}


@pytest.mark.parametrize(("flag", "problem"), [
    ("inputs=16", "no input is named 'inputs'"),
    ("input=1x16", "input 'input' has 1 axis besides the batch axis, 2 given"),
    ("input=0", "sizes of input 'input' must be >= 1"),
])
def test_a_bad_shape_is_one_line_exit_2(oip_server: OipServer, flag: str, problem: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["load", oip_server.url, "--model", "linear", *QUICK, "--shape", flag]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"error: --shape {flag}: {problem}; model 'linear' takes 'input' [batch, 16] "
        f"(shapes exclude the batch axis)"]


def test_shape_and_input_data_together_are_an_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    args = ["load", "http://127.0.0.1:1", "--model", "linear", "--input-data", "in.npz",
            "--shape", "input=16", "--quiet"]
    assert main(args) == 2
    assert capsys.readouterr().err.startswith("error: --shape shapes the random inputs")
