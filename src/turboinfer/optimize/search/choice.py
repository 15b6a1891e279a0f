"""Which measured candidate ``tune`` picks, decided on differences beyond the noise.

Among the eligible candidates (servable, within the accuracy budget, within the SLO as
``batching.plan_batching`` judges it), the one with the highest median throughput sets
the bar. Every candidate whose throughput is not clearly below it (compared round by
round, since all candidates are timed in the same interleaved rounds: the per-round
ratio's interval reaches 1, or its median is under ``1 + batching.NOISE_FLOOR``) is as
fast as far as this machine can tell, and of those the simplest wins: fewer threads,
then a smaller batch, then the plainer variant or precision (FP32, then graph or TF32,
then FP16 or BF16, then any quantized one), then the engine order of ``ENGINE_VARIANTS``,
then the device (the CPU before a GPU); between equally simple ones
(two int8 variants on one engine) the higher median throughput. When the top two by median
were within noise the decision records it, so a rerun that picks the other one is
explained by the report rather than a surprise.

With no eligible candidate, the servable one inside the budget with the lowest p99
is written, and the report says the SLO is not met.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from turboinfer.bench.stats import Spread
from turboinfer.engines import Precision
from turboinfer.optimize.search.batching import NOISE_FLOOR, BatchingPlan
from turboinfer.optimize.search.candidates import Measured
from turboinfer.optimize.search.devices import DEVICE_ORDER
from turboinfer.optimize.settings import ENGINE_VARIANTS, Variant

# How plain a variant is; every quantized variant (int8, int4, mixed, NNCF) ranks alike.
_PLAINNESS = {Variant.FP32: 0, Variant.GRAPH: 1, Variant.FP16: 2}
_QUANTIZED = len(_PLAINNESS)
# A form's precision ranks as the variant that rounds alike: TF32 beside the graph pass
# (FP32 tensors), FP16 and BF16 beside the FP16 file.
_PRECISION_PLAINNESS = {Precision.FP32: 0, Precision.TF32: 1, Precision.FP16: 2,
                        Precision.BF16: 2}
_ENGINE_ORDER = {engine: index for index, engine in enumerate(ENGINE_VARIANTS)}
_DEVICE_ORDER = {device: index for index, device in enumerate(DEVICE_ORDER)}


@dataclass(frozen=True)
class Decision:
    chosen: int
    rule: str
    fastest: int  # highest median throughput
    within_noise: tuple[int, ...]  # not clearly slower than the fastest
    runner_up: int | None  # second-highest median throughput
    top_two_within_noise: bool
    floor: float = NOISE_FLOOR

    def to_dict(self, measured: Sequence[Measured]) -> dict[str, Any]:
        def summary(index: int) -> dict[str, Any]:
            m = measured[index]
            qps = _plan(m).throughput
            # The per-round values let a reader redo the paired comparison the rule made.
            return {"label": m.candidate.label, "max_batch_size": _plan(m).max_batch_size,
                    **_prefixed("qps", qps), "qps_per_round": list(qps.values)}

        return {"rule": self.rule, "noise_floor": self.floor,
                "fastest": summary(self.fastest),
                "runner_up": None if self.runner_up is None else summary(self.runner_up),
                "top_two_within_noise": self.top_two_within_noise,
                "within_noise_of_fastest": [measured[i].candidate.label
                                            for i in self.within_noise]}


def choose(measured: Sequence[Measured], floor: float = NOISE_FLOOR) -> Decision | None:
    eligible = [i for i, m in enumerate(measured) if m.eligible]
    if not eligible:
        return _fallback(measured)
    ranked = sorted(eligible, key=lambda i: -_plan(measured[i]).qps)
    fastest, best = ranked[0], _plan(measured[ranked[0]]).throughput
    near = tuple(i for i in ranked if not best.clearly_above(_plan(measured[i]).throughput,
                                                             floor))
    chosen = min(near, key=lambda i: simplicity(measured[i]))
    runner_up = ranked[1] if len(ranked) > 1 else None
    top_two = runner_up is not None and runner_up in near
    if len(near) == 1:
        rule = "highest throughput; every other candidate is clearly slower"
    else:
        rule = (f"simplest of the {len(near)} candidates within noise of the highest "
                "throughput (fewer threads, smaller batch, plainer variant, engine order)")
    return Decision(chosen, rule, fastest, near, runner_up, top_two, floor)


def simplicity(m: Measured) -> tuple[int, int, int, int, int, float, str]:
    """Sort key: the simpler configuration first, the faster between equally simple."""
    c = m.candidate
    plainness = max(_PLAINNESS.get(c.variant, _QUANTIZED),
                    _PRECISION_PLAINNESS[c.placement.precision])
    return (c.threads, _plan(m).max_batch_size, plainness,
            _ENGINE_ORDER.get(c.engine, len(_ENGINE_ORDER)),
            _DEVICE_ORDER.get(c.device, len(_DEVICE_ORDER)), -_plan(m).qps, c.label)


def annotate(measured: list[Measured], decision: Decision | None) -> list[Measured]:
    """The chosen candidate carries the decision and, when the top two were within noise,
    a note saying so."""
    if decision is None:
        return measured
    chosen = measured[decision.chosen]
    notes = chosen.notes
    if decision.top_two_within_noise and decision.runner_up is not None:
        first, second = (measured[decision.fastest], measured[decision.runner_up])
        notes = (*notes, f"the top two by throughput were within noise: "
                 f"{_describe(first)} vs {_describe(second)}; a rerun may pick either")
    result = list(measured)
    result[decision.chosen] = replace(chosen, notes=notes,
                                      decision=decision.to_dict(measured))
    return result


def _fallback(measured: Sequence[Measured]) -> Decision | None:
    fallback = [i for i, m in enumerate(measured)
                if m.error is None and m.servable and m.plan is not None
                and m.candidate.within_budget is not False]
    if not fallback:
        return None
    chosen = min(fallback, key=lambda i: _plan(measured[i]).p99_ms)
    return Decision(chosen, "no candidate meets the SLO: the lowest median p99", chosen, (),
                    None, False)


def _plan(m: Measured) -> BatchingPlan:
    assert m.plan is not None  # eligible and fallback candidates have a plan
    return m.plan


def _prefixed(name: str, value: Spread) -> dict[str, float]:
    return {name: value.median, f"{name}_low": value.low, f"{name}_high": value.high}


def _describe(m: Measured) -> str:
    q = _plan(m).throughput
    return (f"{m.candidate.label} batch {_plan(m).max_batch_size or 1} "
            f"{q.median:.5g} samples/s [{q.low:.5g}, {q.high:.5g}]")
