"""A tune decision that survives noise: spreads over rounds, SLO and throughput compared
beyond the noise, the simpler candidate between equals, and the same choice twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from turboinfer.bench.stats import Spread, spread
from turboinfer.optimize import tune
from turboinfer.optimize.search.batching import NOISE_FLOOR, CurvePoint, plan_batching
from turboinfer.optimize.search.candidates import Candidate, Measured
from turboinfer.optimize.search.choice import annotate, choose
from turboinfer.optimize.settings import Variant


def point(batch: int, p99: tuple[float, float, float], qps: tuple[float, float, float]
          ) -> CurvePoint:
    """A curve point with (median, low, high) for p99 and throughput."""
    return CurvePoint(batch, p99[0] * 0.5, p99[0], qps[0], Spread(*p99, 5), Spread(*qps, 5))


def measured(variant: Variant, engine: str, threads: int, curve: list[CurvePoint],
             slo: float = 10.0) -> Measured:
    name = variant.value
    candidate = Candidate(name, variant, Path(f"/m/{name}.onnx"), engine, threads, 1.0, True)
    return Measured(candidate, tuple(curve), plan_batching(curve, slo))


def test_spread_is_the_median_with_the_inner_rounds_and_repeats_exactly() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 100.0]
    s = spread(values)
    assert (s.median, s.low, s.high, s.rounds) == (3.0, 2.0, 4.0, 5)
    assert spread(values) == s  # seeded: the same rounds give the same interval
    assert spread([7.0]) == Spread(7.0, 7.0, 7.0, 1)
    with pytest.raises(ValueError):
        spread([])


def test_clearly_above_needs_separate_intervals_and_more_than_the_floor() -> None:
    base = Spread(100.0, 95.0, 105.0, 5)
    assert Spread(120.0, 110.0, 130.0, 5).clearly_above(base, NOISE_FLOOR)
    assert not Spread(120.0, 104.0, 130.0, 5).clearly_above(base, NOISE_FLOOR)  # overlap
    tight = Spread(100.0, 100.0, 100.0, 5)
    assert not Spread(104.0, 104.0, 104.0, 5).clearly_above(tight, NOISE_FLOOR)  # 4% < 5%


def test_rounds_timed_together_compare_round_by_round() -> None:
    """Under background load every candidate's rounds swing together: the intervals of
    each overlap, yet the faster one wins every round by 2x. Paired per round it is
    clearly faster; a steady 3% lead is not, and neither is a lead in only some rounds."""
    load = [1.0, 0.2, 0.9, 0.25, 0.95]  # the machine's share left to us in each round
    fast = spread([40.0 * f for f in load])
    slow = spread([20.0 * f for f in load])
    unpaired = Spread(slow.median, slow.low, slow.high, slow.rounds)
    assert not fast.clearly_above(unpaired, NOISE_FLOOR)  # alone, the intervals overlap
    assert fast.clearly_above(slow, NOISE_FLOOR)
    assert not slow.clearly_above(fast, NOISE_FLOOR)
    slight = spread([40.0 * 1.03 * f for f in load])
    assert not slight.clearly_above(fast, NOISE_FLOOR)  # 3% < the 5% floor
    mixed = spread([40.0 * f * r for f, r in zip(load, [1.5, 0.7, 1.5, 0.7, 1.5],
                                                  strict=True)])
    assert not mixed.clearly_above(fast, NOISE_FLOOR)  # ahead in 3 rounds of 5 only


def test_a_size_misses_the_slo_only_beyond_the_noise() -> None:
    # Median p99 over the limit, but the low end of its interval under it: not a miss.
    noisy = plan_batching([point(1, (12.0, 9.0, 14.0), (100.0, 95.0, 105.0))], slo_ms=10.0)
    assert noisy.meets_slo and noisy.max_batch_size == 0
    clear = plan_batching([point(1, (12.0, 11.0, 14.0), (100.0, 95.0, 105.0))], slo_ms=10.0)
    assert not clear.meets_slo


def test_batching_prefers_the_smaller_size_within_noise() -> None:
    curve = [point(1, (1.0, 0.9, 1.1), (1000.0, 950.0, 1050.0)),
             point(8, (3.0, 2.8, 3.2), (2600.0, 2500.0, 2800.0)),
             point(16, (4.0, 3.8, 4.4), (2700.0, 2550.0, 2900.0))]
    plan = plan_batching(curve, slo_ms=10.0)
    assert plan.max_batch_size == 8 and "within noise of batch 16" in plan.reason
    flat = [curve[0], point(8, (3.0, 2.8, 3.2), (1040.0, 900.0, 1200.0))]
    assert plan_batching(flat, slo_ms=10.0).max_batch_size == 0  # no clear gain: no batching


def test_the_simplest_candidate_wins_between_equals_and_the_report_says_so() -> None:
    curve_fast = [point(1, (1.0, 0.9, 1.1), (1030.0, 990.0, 1080.0))]
    curve_same = [point(1, (1.0, 0.9, 1.1), (1000.0, 960.0, 1040.0))]
    curve_slow = [point(1, (2.0, 1.9, 2.1), (500.0, 480.0, 520.0))]
    candidates = [measured(Variant.INT8_STATIC, "openvino", 1, curve_fast),
                  measured(Variant.FP32, "onnxruntime", 1, curve_same),
                  measured(Variant.FP32, "onnxruntime", 2, curve_same),
                  measured(Variant.GRAPH, "onnxruntime", 1, curve_slow)]
    decision = choose(candidates)
    assert decision is not None
    assert candidates[decision.chosen].candidate.label == "fp32/onnxruntime/t1"
    assert decision.fastest == 0 and decision.top_two_within_noise
    assert 3 not in decision.within_noise  # clearly slower
    chosen = annotate(candidates, decision)[decision.chosen]
    data = chosen.to_dict()["decision"]
    assert data["fastest"]["label"] == "int8-static/openvino/t1"
    assert data["top_two_within_noise"] and "simplest" in data["rule"]
    assert any("within noise" in note for note in chosen.notes)


def test_between_equally_simple_candidates_the_faster_median_wins() -> None:
    slower = [point(1, (1.0, 0.9, 1.1), (1000.0, 960.0, 1040.0))]
    faster = [point(1, (1.0, 0.9, 1.1), (1030.0, 990.0, 1080.0))]
    candidates = [measured(Variant.INT8_STATIC, "openvino", 2, slower),
                  measured(Variant.NNCF_INT8, "openvino", 2, faster),
                  measured(Variant.NNCF_INT8, "openvino", 1, slower)]
    decision = choose(candidates)
    assert decision is not None and decision.within_noise == (1, 0, 2)
    assert decision.chosen == 2  # fewer threads first
    decision = choose(candidates[:2])
    assert decision is not None and decision.chosen == 1  # same threads, engine: faster


def test_a_clear_winner_is_chosen_whatever_its_complexity() -> None:
    fast = [point(1, (1.0, 0.9, 1.1), (2000.0, 1900.0, 2100.0))]
    slow = [point(1, (2.0, 1.9, 2.1), (1000.0, 950.0, 1050.0))]
    candidates = [measured(Variant.FP32, "onnxruntime", 1, slow),
                  measured(Variant.INT8_STATIC, "onnxruntime", 2, fast)]
    decision = choose(candidates)
    assert decision is not None and decision.chosen == 1
    assert not decision.top_two_within_noise and decision.rule.startswith("highest")


FAST: dict[str, Any] = {"engines": ["onnxruntime"], "batch_sizes": [1, 8], "threads": [1],
                        "variants": ["int8-static"], "calib_count": 100}


def _decided(report: Any) -> tuple[dict[str, Any], tuple[str, int]]:
    data = json.loads((report.work / "report.json").read_text())
    chosen = data["chosen"]
    return chosen, (chosen["label"], chosen["plan"]["max_batch_size"])


def _throughput(summary: dict[str, Any]) -> Spread:
    values = tuple(summary["qps_per_round"])
    return Spread(summary["qps"], summary["qps_low"], summary["qps_high"], len(values),
                  values)


def test_tune_twice_picks_the_same_configuration_or_says_why(digits_model: Any,
                                                              tmp_path: Path) -> None:
    runs = [tune(digits_model, tmp_path / f"run{i}", slo_p99_ms=50.0, max_accuracy_drop=1,
                 **FAST) for i in range(2)]
    (first, config1), (second, config2) = (_decided(r) for r in runs)
    for chosen in (first, second):
        assert chosen["plan"]["qps_low"] <= chosen["plan"]["qps"] <= chosen["plan"]["qps_high"]
        assert all(p["rounds"] >= 1 for p in chosen["curve"])
        assert chosen["decision"]["rule"]
    if config1 == config2:
        return
    # A different pick is only acceptable when a report shows the top two within noise,
    # and its numbers bear that out: overlapping intervals or medians within the floor.
    explained = [c for c in (first, second) if c["decision"]["top_two_within_noise"]]
    assert explained, f"{config1} then {config2}, and neither report says within noise"
    for chosen in explained:
        top, runner = (_throughput(chosen["decision"][k]) for k in ("fastest", "runner_up"))
        # The same rule the decision used (round by round when timed in the same rounds):
        # the fastest is not clearly above the runner-up.
        assert not top.clearly_above(runner, chosen["decision"]["noise_floor"])
        assert any("within noise" in note for note in chosen["notes"])
