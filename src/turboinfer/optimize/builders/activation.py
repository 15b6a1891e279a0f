"""Which activation type static INT8 uses: the hardware profile proposes, timing decides.

The profile knows the rule (x86 without VNNI wants uint8 activations); the rule is only
as good as the kernels of the installed engine, so both types are quantized once and
timed side by side, and the profile's choice is kept unless the other is clearly faster.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from turboinfer.hardware import has_fast_fp16, int8_activation_type, profile
from turboinfer.optimize.builders.context import Context
from turboinfer.optimize.judge.measure import interleaved_p50
from turboinfer.optimize.report import ActivationDecision
from turboinfer.optimize.settings import ActivationType

# The other type must beat the profile's choice by this much to replace it: below it,
# the difference is within run-to-run noise on a shared machine.
MARGIN = 0.05


@dataclass(frozen=True)
class MachineFacts:
    activation: ActivationType
    fast_fp16: bool
    summary: dict[str, Any]


def machine_facts() -> MachineFacts:
    hw = profile()
    return MachineFacts(ActivationType(int8_activation_type(hw)), has_fast_fp16(hw),
                        dict(hw.summary()))


def decide_activation(ctx: Context, proposed: ActivationType) -> ActivationDecision:
    """Keep ``proposed`` (the profile's type) unless timing shows the other is faster."""
    if ctx.settings.activation_type is not None:
        return ActivationDecision(proposed, ctx.settings.activation_type,
                                  reason="set by the caller")
    method = ctx.settings.calibrations[0]
    paths = {}
    for kind in ActivationType:
        trial = replace(ctx, activation=ActivationDecision(kind, kind))
        paths[kind.value] = trial.static(method, ctx.work / f"activation-{kind.value}.onnx")
    p50 = interleaved_p50(paths, ctx.judge)
    other = next(k for k in ActivationType if k is not proposed)
    if p50[other.value] < p50[proposed.value] * (1 - MARGIN):
        reason = (f"measured: {other.value} is faster than the profile's {proposed.value} "
                  f"on this engine")
        return ActivationDecision(proposed, other, p50, reason)
    reason = f"profile's choice confirmed by timing ({method.value} ranges, batch 1)"
    return ActivationDecision(proposed, proposed, p50, reason)
