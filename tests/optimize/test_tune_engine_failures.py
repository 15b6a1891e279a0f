"""An engine that cannot run a candidate at some batch size must cost that candidate (or
those batch sizes), never the whole tune: the reason is recorded, the rest is measured."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from turboinfer import tune


def _pinned_batch_model(path: Path) -> Path:
    """A dynamic batch axis on the input that a Reshape inside pins to 1."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1, 16])
    weight = helper.make_tensor("w", TensorProto.FLOAT, [16, 16],
                                [0.01 * (i % 7) for i in range(256)])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]),
         helper.make_node("Reshape", ["h", "shape"], ["y"])],
        "pinned", [x], [y], [shape, weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_a_batch_size_the_graph_pins_drops_those_batches_with_the_reason(
        tmp_path: Path) -> None:
    model = _pinned_batch_model(tmp_path / "pinned.onnx")
    report = tune(str(model), tmp_path / "repo", slo_p99_ms=50.0, max_accuracy_drop=1,
                  engines=["onnxruntime"], variants=["graph"], batch_sizes=[1, 8],
                  threads=[1], calib_count=64, synthetic_calib=True)
    data = json.loads((report.work / "report.json").read_text())
    chosen = data["chosen"]
    assert chosen is not None and chosen["error"] is None
    assert [p["batch_size"] for p in chosen["curve"]] == [1]
    note = " ".join(chosen["notes"])
    assert "batch 8 and larger dropped" in note and "batch size 1 ran" in note
    assert report.entry is not None and report.entry.exists()
