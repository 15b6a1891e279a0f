"""The model itself: time outside operators, unfused QDQ, INT8 that is not faster, and
accuracy lost to quantization."""

from __future__ import annotations

from typing import Any

from turboinfer.doctor.findings import Finding, Outcome, Rule, Severity, Skip
from turboinfer.doctor.inputs import Inputs
from turboinfer.hardware import int8_activation_type

OVERHEAD_SHARE = 0.30      # of session time spent outside operators
QDQ_SHARE = 0.15           # of operator time in QuantizeLinear / DequantizeLinear
NOT_FASTER = 0.95          # an INT8 variant slower than this share of FP32's p50
QUANTIZED = ("int8-dynamic", "int8-static", "int4", "mixed", "nncf-int8", "nncf-accuracy")
TOP_LAYERS = 3


def framework_overhead(inputs: Inputs) -> Outcome:
    report = inputs.profile
    assert report is not None
    share = float(report.get("overhead_share") or 0.0)
    if share < OVERHEAD_SHARE:
        return None
    model = report.get("model", "MODEL")
    return Finding(
        rule="framework_overhead", severity=Severity.WARNING,
        symptom=f"{share:.0%} of the session time is outside operators",
        cause="many small operators: scheduling and copies outweigh the arithmetic",
        evidence=f"overhead_share {share:.2f} (profile of {model})",
        fix=f"config.yaml: engine_settings: {{graph_optimization: all}}; compare engines: "
            f"turboinfer bench {model} --engines onnxruntime,openvino")


def qdq_share(inputs: Inputs) -> Outcome:
    report = inputs.profile
    assert report is not None
    share = report.get("qdq_share")
    if share is None:
        return None
    if float(share) < QDQ_SHARE:
        return None
    model = report.get("model", "MODEL")
    activation = _activation(inputs)
    return Finding(
        rule="qdq_share", severity=Severity.WARNING,
        symptom=f"{float(share):.0%} of operator time in QuantizeLinear/DequantizeLinear",
        cause="QDQ pairs are not fused into integer kernels",
        evidence=f"qdq_share {float(share):.2f}; this CPU wants {activation} activations",
        fix=f"turboinfer optimize {model} -o out --variants int8-static "
            f"(activations {activation}), or keep FP32")


def _activation(inputs: Inputs) -> str:
    return int8_activation_type(inputs.hardware) if inputs.hardware else "uint8"


def _p50(variant: dict[str, Any]) -> float | None:
    latency = variant.get("latency") or {}
    value = latency.get("p50_ms")
    return float(value) if value else None


def quantized_not_faster(inputs: Inputs) -> Outcome:
    report = inputs.tune
    assert report is not None
    variants = report.get("variants", [])
    fp32 = next((v for v in variants if v.get("variant") == "fp32" and _p50(v)), None)
    if fp32 is None:
        return Skip("quantized_not_faster", "the report has no timed FP32 variant")
    base = _p50(fp32) or 0.0
    slow = [v for v in variants if v.get("variant") in QUANTIZED and (p := _p50(v))
            and p >= NOT_FASTER * base]
    if not slow:
        return None
    worst = max(slow, key=lambda v: _p50(v) or 0.0)
    chosen = (report.get("activation_type") or {}).get("chosen", "unknown")
    wanted = _activation(inputs)
    return Finding(
        rule="quantized_not_faster", severity=Severity.WARNING,
        symptom=f"{worst['name']} p50 {_p50(worst):.3f} ms vs FP32 {base:.3f} ms",
        cause="the quantized model runs no integer fast path here",
        evidence=f"activation type {chosen}, this CPU's fast path wants {wanted}; "
                 f"{len(slow)} quantized variant(s) not faster than FP32",
        fix=f"turboinfer optimize {report.get('model', 'MODEL')} -o out --variants "
            f"int8-static (uint8 activations on x86), or serve FP32")


def accuracy_drop(inputs: Inputs) -> Outcome:
    report = inputs.tune
    assert report is not None
    over = [v for v in report.get("variants", [])
            if v.get("variant") in QUANTIZED and v.get("within_budget") is False]
    if not over:
        return None
    worst = min(over, key=lambda v: float(v.get("delta") or 0.0))
    budget = (report.get("budget") or {}).get("text", "the budget")
    count = (report.get("calibration") or {}).get("count")
    ranked = sorted((s for s in report.get("sensitivity", []) if s.get("loss_db") is not None),
                    key=lambda s: -s["loss_db"])[:TOP_LAYERS]
    layers = ", ".join(f"{s['node']} ({s['loss_db']:.1f} dB)" for s in ranked)
    model = report.get("model", "MODEL")
    return Finding(
        rule="accuracy_drop",
        severity=Severity.CRITICAL if len(over) == len(_quantized(report)) else
        Severity.WARNING,
        symptom=f"{worst['name']}: metric {worst.get('metric')} ({worst.get('delta'):+.3g}) "
                f"outside {budget}",
        cause="quantization loses accuracy in a few sensitive layers or on thin calibration",
        evidence=f"{len(over)} quantized variant(s) over budget; calibrated on "
                 f"{count if count is not None else 'an unknown number of'} samples; "
                 + (f"most sensitive: {layers}" if layers else "no sensitivity ranking"),
        fix=f"turboinfer optimize {model} -o out --sensitivity --max-accuracy-drop "
            f"{(report.get('budget') or {}).get('value', 1)} --calib-count "
            f"{max(512, 4 * (count or 0))}")


def _quantized(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for v in report.get("variants", []) if v.get("variant") in QUANTIZED
            and v.get("within_budget") is not None]


RULES = (
    Rule("framework_overhead", frozenset({"profile"}), framework_overhead, "model"),
    Rule("qdq_share", frozenset({"profile"}), qdq_share, "model"),
    Rule("quantized_not_faster", frozenset({"tune"}), quantized_not_faster, "model"),
    Rule("accuracy_drop", frozenset({"tune"}), accuracy_drop, "model"),
)
