"""Graph passes: clean-up with onnxslim, transformer fusions, ORT's offline optimizer.

The ORT pass stops at the extended level on purpose: the ``all`` level adds NCHWc layout
rewrites tied to this CPU's vector width, and a file that only runs well where it was
written is not a portable artifact. Sessions still apply their own level at load time.
"""

from __future__ import annotations

import collections
import contextlib
import io
import logging
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnxruntime as ort
import onnxslim

from turboinfer.optimize.builders.logs import quiet

log = logging.getLogger(__name__)

PORTABLE_LEVEL = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
# A graph with attention: Softmax between MatMuls, and enough of them to be a transformer.
_TRANSFORMER_MIN_MATMULS = 4


@dataclass(frozen=True)
class GraphResult:
    before: dict[str, int]
    after: dict[str, int]
    passes: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        return {"ops_before": self.before, "ops_after": self.after, "passes": list(self.passes),
                "nodes_before": sum(self.before.values()),
                "nodes_after": sum(self.after.values())}


def op_counts(model: onnx.ModelProto | Path) -> dict[str, int]:
    """Nodes per operator type, most frequent first."""
    proto = onnx.load(str(model), load_external_data=False) if isinstance(model, Path) else model
    counts = collections.Counter(node.op_type for node in proto.graph.node)
    return dict(counts.most_common())


def slim(src: Path, dst: Path) -> Path:
    """Constant folding, dead-node elimination and pattern fusions with onnxslim."""
    with contextlib.redirect_stdout(io.StringIO()):  # onnxslim prints a summary table
        model = onnxslim.slim(str(src))
    onnx.save(model, str(dst))
    return dst


def is_transformer(model: onnx.ModelProto) -> bool:
    counts = op_counts(model)
    return "Softmax" in counts and counts.get("MatMul", 0) >= _TRANSFORMER_MIN_MATMULS


def fuse_transformer(src: Path, dst: Path) -> bool:
    """Attention, GELU, LayerNorm and bias fusions from ORT's transformer optimizer.

    Heads and hidden size are detected from the graph; a graph it does not recognise is
    left alone (False), which is not an error: the other passes still apply.
    """
    # why: ORT's transformer optimizer pulls in its fusion modules (slow); only this pass needs it.
    from onnxruntime.transformers.optimizer import optimize_model

    try:
        with quiet():
            fused = optimize_model(str(src), model_type="bert", num_heads=0, hidden_size=0,
                                   opt_level=0, use_gpu=False)
    except Exception as exc:  # the optimizer raises bare errors on graphs it cannot parse
        log.info("transformer fusion skipped: %s", exc)
        return False
    fused.save_model_to_file(str(dst))
    return True


def ort_offline(src: Path, dst: Path) -> Path:
    """Run ORT's optimizer at the portable level and keep the optimized graph."""
    options = ort.SessionOptions()
    options.graph_optimization_level = PORTABLE_LEVEL
    options.optimized_model_filepath = str(dst)
    options.log_severity_level = 3
    ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
    return dst


def optimize_graph(src: Path, dst: Path, workdir: Path) -> GraphResult:
    """onnxslim, then transformer fusions where they apply, then ORT extended; to ``dst``."""
    before = op_counts(src)
    passes = ["onnxslim"]
    current = slim(src, workdir / "graph-slim.onnx")
    if is_transformer(onnx.load(str(current), load_external_data=False)):
        fused = workdir / "graph-fused.onnx"
        if fuse_transformer(current, fused):
            current = fused
            passes.append("transformer-fusion")
    ort_offline(current, dst)
    passes.append("onnxruntime-extended")
    return GraphResult(before, op_counts(dst), tuple(passes))
