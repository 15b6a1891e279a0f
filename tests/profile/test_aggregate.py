"""Aggregation is arithmetic on the measured runs: means per run, shares of operator
time, overhead as wall minus operators, QDQ share from the quantize/dequantize types."""

from __future__ import annotations

import pytest

from turboinfer.errors import ConfigError
from turboinfer.profile import OpTime, ProfileSettings, RunSample, aggregate

RUNS = [
    RunSample(10.0, (OpTime("conv", "QLinearConv", 6.0), OpTime("q", "QuantizeLinear", 2.0))),
    RunSample(14.0, (OpTime("conv", "QLinearConv", 8.0), OpTime("q", "QuantizeLinear", 2.0),
                     OpTime("dq", "DequantizeLinear", 2.0))),
]


def test_means_shares_and_overhead() -> None:
    agg = aggregate(RUNS)
    assert (agg.runs, agg.session_ms, agg.kernels_ms) == (2, 12.0, 10.0)
    assert agg.overhead_ms == 2.0 and agg.overhead_share == pytest.approx(2 / 12)
    assert [(n.node, n.ms, n.share) for n in agg.nodes] == [
        ("conv", 7.0, 0.7), ("q", 2.0, 0.2), ("dq", 1.0, 0.1)]
    assert agg.qdq_share == pytest.approx(0.3)


def test_no_runs_is_all_zero() -> None:
    agg = aggregate([])
    assert (agg.session_ms, agg.overhead_share, agg.qdq_share) == (0.0, 0.0, 0.0)


def test_openvino_layers_sit_end_to_end_inside_their_run() -> None:
    pytest.importorskip("openvino", reason="the openvino extra is not installed")
    from turboinfer.profile.openvino_profiler import trace_events

    events = trace_events(RUNS)
    runs = [e for e in events if e["name"] == "run"]
    assert [r["ts"] for r in runs] == [0.0, 10_000.0]
    layers = [e for e in events if e["cat"] == "Node" and e["ts"] >= 10_000.0]
    assert [e["ts"] for e in layers] == [10_000.0, 18_000.0, 20_000.0]


@pytest.mark.parametrize("field", ["batch_size", "runs"])
def test_settings_refuse_nonpositive_counts(field: str) -> None:
    with pytest.raises(ConfigError):
        ProfileSettings(**{field: 0})
