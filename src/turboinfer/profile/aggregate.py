"""Many profiled runs -> one picture: mean time per node and per op type with their share
of kernel time, and the time the session spent outside any operator.

Means over runs, so that ``kernels_ms + overhead_ms == session_ms`` holds exactly: the
overhead is each run's wall time minus its operators' time, averaged.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from turboinfer.profile.samples import QDQ_OP_TYPES, RunSample


@dataclass(frozen=True)
class NodeTime:
    node: str
    op_type: str
    ms: float  # mean per run
    share: float  # of kernel time, 0..1

    def to_dict(self) -> dict[str, object]:
        return {"node": self.node, "op_type": self.op_type, "ms": self.ms, "share": self.share}


@dataclass(frozen=True)
class OpTypeTime:
    op_type: str
    nodes: int  # distinct nodes of this type
    ms: float  # mean per run, all its nodes together
    share: float

    def to_dict(self) -> dict[str, object]:
        return {"op_type": self.op_type, "nodes": self.nodes, "ms": self.ms, "share": self.share}


@dataclass(frozen=True)
class Aggregate:
    runs: int
    session_ms: float  # mean wall time of a profiled run, as the caller measured it
    kernels_ms: float  # mean of the operators' time per run
    nodes: list[NodeTime]  # slowest first
    op_types: list[OpTypeTime]  # slowest first

    @property
    def overhead_ms(self) -> float:
        return self.session_ms - self.kernels_ms

    @property
    def overhead_share(self) -> float:
        return self.overhead_ms / self.session_ms if self.session_ms > 0 else 0.0

    @property
    def qdq_share(self) -> float:
        """Share of kernel time in quantize/dequantize ops (0 for a float model)."""
        return sum((t.share for t in self.op_types if t.op_type in QDQ_OP_TYPES), 0.0)


def aggregate(samples: list[RunSample]) -> Aggregate:
    runs = len(samples)
    if runs == 0:
        return Aggregate(0, 0.0, 0.0, [], [])
    node_ms: dict[str, float] = defaultdict(float)
    node_type: dict[str, str] = {}
    for sample in samples:
        for op in sample.ops:
            node_ms[op.node] += op.ms
            node_type[op.node] = op.op_type
    kernels = sum(node_ms.values()) / runs
    nodes = sorted((NodeTime(name, node_type[name], total / runs, _share(total / runs, kernels))
                    for name, total in node_ms.items()), key=lambda n: -n.ms)
    return Aggregate(runs, sum(s.wall_ms for s in samples) / runs, kernels, nodes,
                     _by_type(nodes, kernels))


def _by_type(nodes: list[NodeTime], kernels_ms: float) -> list[OpTypeTime]:
    ms: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for node in nodes:
        ms[node.op_type] += node.ms
        count[node.op_type] += 1
    return sorted((OpTypeTime(op, count[op], total, _share(total, kernels_ms))
                   for op, total in ms.items()), key=lambda t: -t.ms)


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0
