"""``turboinfer bench`` on a user's own ONNX file: engines that cannot run it are skipped
with their reason while the others report; shape flags are checked against the model
and mean the same as in ``turboinfer load``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from turboinfer.bench.inputs import random_feeds
from turboinfer.cli import build_parser, main
from turboinfer.commands._args import shape_flags
from turboinfer.load.inputs import ModelInfo, TensorInfo, random_inputs
from turboinfer.models.onnx_file import check_onnx, input_specs

QUICK = ["--min-runs", "3", "--min-seconds", "0", "--warmup", "0"]


def _save(path: Path, nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
          outputs: list[onnx.ValueInfoProto],
          initializers: list[onnx.TensorProto] | None = None) -> Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def tokens_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``ids`` [batch, seq] int64 and ``mask`` [batch, seq] float: a dynamic inner axis."""
    path = tmp_path_factory.mktemp("tokens") / "tokens.onnx"
    nodes = [helper.make_node("Cast", ["ids"], ["ids_f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["ids_f", "mask"], ["out"])]
    return _save(path, nodes,
                 [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
                  helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "seq"])],
                 [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "seq"])])


@pytest.fixture(scope="module")
def pinned_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Declares a dynamic batch but reshapes to a fixed [1, 16]: only batch 1 runs."""
    path = tmp_path_factory.mktemp("pinned") / "pinned.onnx"
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1, 16])
    return _save(path, [helper.make_node("Reshape", ["input", "shape"], ["out"])],
                 [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 16])],
                 [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 16])], [shape])


@pytest.fixture(scope="module")
def fixed_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """No batch axis at all: the input is [1, 4]."""
    path = tmp_path_factory.mktemp("fixed") / "fixed.onnx"
    return _save(path, [helper.make_node("Relu", ["input"], ["out"])],
                 [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 4])],
                 [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4])])


def _bench_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["bench", *args, *QUICK, "--json"]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def test_torch_without_a_module_is_skipped_and_onnxruntime_reports(
        linear_onnx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", str(linear_onnx), "--engines", "onnxruntime,torch",
                 "--batch-sizes", "1,4", *QUICK]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("onnxruntime")]
    assert [row[1] for row in rows] == ["1", "4"]
    skipped = [line for line in out.splitlines() if line.startswith("skipped")]
    assert len(skipped) == 1
    assert skipped[0].startswith("skipped torch: ") and "only an ONNX file" in skipped[0]


def test_json_lists_the_skipped_engine_with_its_reason(
        linear_onnx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = _bench_json(capsys, str(linear_onnx), "--engines", "torch,onnxruntime")
    assert [(r["engine"], r["batch_size"]) for r in report["results"]] == [("onnxruntime", 1)]
    [skipped] = report["skipped"]
    assert skipped["engine"] == "torch" and skipped["batch_size"] is None
    assert "only an ONNX file" in skipped["reason"]


def test_no_engine_that_can_run_is_exit_2_in_one_line(
        linear_onnx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", str(linear_onnx), "--engines", "torch", *QUICK, "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = [x for x in captured.err.splitlines() if x.startswith("error:")]
    assert line.startswith("error: no engine could run linear: torch: ")


def test_an_axis_the_graph_pins_skips_that_batch_size_only(
        pinned_onnx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = _bench_json(capsys, str(pinned_onnx), "--batch-sizes", "1,4")
    assert [r["batch_size"] for r in report["results"]] == [1]
    [skipped] = report["skipped"]
    assert (skipped["engine"], skipped["batch_size"]) == ("onnxruntime", 4)
    assert "Reshape" in skipped["reason"] and "/onnxruntime_src/" not in skipped["reason"]
    assert "batch size 1 ran, so the graph fixes the batch axis" in skipped["reason"]


def test_a_model_without_batch_axis_runs_its_own_batch_size_only(
        fixed_onnx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = _bench_json(capsys, str(fixed_onnx), "--batch-sizes", "1,8")
    assert [r["batch_size"] for r in report["results"]] == [1]
    [skipped] = report["skipped"]
    assert skipped["batch_size"] == 8 and "batch size 1 only" in skipped["reason"]


def test_shapes_fill_the_dynamic_inner_axis(
        tokens_onnx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = _bench_json(capsys, str(tokens_onnx), "--shape", "ids=7", "--shape", "mask=7",
                         "--batch-sizes", "2")
    assert [r["batch_size"] for r in report["results"]] == [2]


@pytest.mark.parametrize(("flag", "problem"), [
    ("idz=7", "no input is named 'idz'"),
    ("ids=2x7", "input 'ids' has 1 axis besides the batch axis, 2 given"),
    ("ids=0", "sizes of input 'ids' must be >= 1"),
    ("ids=-3", "sizes of input 'ids' must be >= 1"),
])
def test_a_bad_shape_flag_is_one_line_exit_2(
        tokens_onnx: Path, flag: str, problem: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", str(tokens_onnx), "--shape", flag, *QUICK]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = [x for x in captured.err.splitlines() if x.startswith("error:")]
    assert line == (f"error: --shape {flag}: {problem}; model 'tokens' takes "
                    f"'ids' [batch, ?], 'mask' [batch, ?] (shapes exclude the batch axis)")


def test_an_input_named_twice_is_an_error(
        tokens_onnx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", str(tokens_onnx), "--shape", "ids=7", "--input-shape", "ids=8",
                 *QUICK]) == 2
    assert "error: --shape names input 'ids' twice" in capsys.readouterr().err


def test_bench_and_load_read_a_shape_flag_the_same_way(tokens_onnx: Path) -> None:
    """The same flag, given to bench and to load, makes tensors of the same shape."""
    parser = build_parser()
    flags = ["--shape", "ids=7", "--input-shape", "mask=7"]
    bench_args = parser.parse_args(["bench", str(tokens_onnx), *flags])
    load_args = parser.parse_args(["load", "http://127.0.0.1:1", "--model", "tokens", *flags])
    assert shape_flags(bench_args) == shape_flags(load_args) == (("ids", (7,)), ("mask", (7,)))

    specs = input_specs(check_onnx(tokens_onnx))
    bench_feeds = random_feeds(specs, 3, shapes=dict(shape_flags(bench_args)))
    # The same model as an OIP server describes it: -1 marks a dynamic axis.
    info = ModelInfo("tokens", "1", (TensorInfo("ids", "INT64", (-1, -1)),
                                     TensorInfo("mask", "FP32", (-1, -1))), ())
    load_feeds = random_inputs(info, batch_size=3, shapes=dict(shape_flags(load_args)))
    assert {k: v.shape for k, v in bench_feeds.items()} == {k: v.shape for k, v in
                                                             load_feeds.items()}
    assert load_feeds["ids"].shape == (3, 7) and load_feeds["ids"].dtype == np.int64
