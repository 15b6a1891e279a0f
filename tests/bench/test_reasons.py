"""Skip reasons are one line that keeps the model part and drops library noise."""

from __future__ import annotations

from turboinfer.bench.reasons import MAX_REASON, one_line, pinned_axis_hint
from turboinfer.errors import InvalidInputError

# Messages as OpenVINO 2026.4 and ONNX Runtime 1.32 raise them for a graph that reshapes
# a [4, 16] input to a fixed [1, 16].
OPENVINO = (
    "openvino could not run the inputs: Exception from src/inference/src/cpp/infer_request"
    ".cpp:224:\nException from src/plugins/intel_cpu/src/node.cpp:794:\n[CPU] Reshape node "
    "with name 'out' Check 'minusOneCount <= 1 && inputProduct == outputProduct' failed at "
    "src/plugins/intel_cpu/src/shape_inference/custom/reshape.cpp:77:\n[cpu]reshape: the "
    "shape of input data (4.16) conflicts with the reshape pattern (1.16)\n\n\n"
)
ONNXRUNTIME = (
    "onnxruntime could not run the inputs: [ONNXRuntimeError] : 1 : FAIL : Non-zero status "
    "code returned while running Reshape node. Name:'' Status Message: /onnxruntime_src/"
    "onnxruntime/core/providers/cpu/tensor/reshape_helper.h:91 onnxruntime::ReshapeHelper::"
    "ReshapeHelper(const onnxruntime::TensorShape&, onnxruntime::TensorShapeVector&, bool) "
    "input_shape_size == requested_shape_size was false. The input tensor cannot be "
    "reshaped to the requested shape. Input shape:{4,16}, requested shape:{1,16}"
)


def test_openvino_noise_is_dropped() -> None:
    assert one_line(InvalidInputError(OPENVINO)) == (
        "openvino could not run the inputs: [CPU] Reshape node with name 'out' [cpu]reshape: "
        "the shape of input data (4.16) conflicts with the reshape pattern (1.16)")


def test_onnxruntime_noise_is_dropped() -> None:
    line = one_line(InvalidInputError(ONNXRUNTIME))
    assert line.startswith("onnxruntime could not run the inputs: Non-zero status code "
                           "returned while running Reshape node.")
    assert "/onnxruntime_src/" not in line and "[ONNXRuntimeError]" not in line
    assert line.endswith("Input shape:{4,16}, requested shape:{1,16}")


def test_other_errors_keep_their_type_and_stay_short() -> None:
    assert one_line(RuntimeError("bad\nthing")) == "RuntimeError: bad thing"
    assert one_line(KeyError()) == "KeyError"
    assert len(one_line(ValueError("x" * 1000))) == MAX_REASON


def test_the_pinned_axis_hint_needs_a_smaller_batch_that_ran() -> None:
    assert pinned_axis_hint(4, []) == "" and pinned_axis_hint(1, [1]) == ""
    assert "batch size 1 ran" in pinned_axis_hint(8, [1, 4])
