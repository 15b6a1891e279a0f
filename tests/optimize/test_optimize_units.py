"""Pure parts: budgets, settings, batching plans, the mixed-precision search, data checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from turboinfer.engines.base import TensorSpec
from turboinfer.errors import ConfigError, InvalidInputError
from turboinfer.optimize.builders.mixed import float_order, search
from turboinfer.optimize.data.calibration import conform, read_user_data, uniform_chunks
from turboinfer.optimize.search.batching import CurvePoint, plan_batching
from turboinfer.optimize.settings import (
    BATCH_SIZES,
    TUNE_MEASURE,
    AccuracyBudget,
    OptimizeSettings,
    PruneRequest,
    Variant,
    check_tune_budget,
    parse_calibrations,
    parse_variants,
    tune_optimize_settings,
    tune_settings_from,
)

SPECS = [TensorSpec("input", np.dtype("float32"), ("batch", 1, 8, 8))]


def test_budget_absolute_and_relative() -> None:
    assert AccuracyBudget.parse("1").meets(99.0, 98.0, higher_is_better=True)
    assert not AccuracyBudget.parse("1").meets(99.0, 97.9, higher_is_better=True)
    assert AccuracyBudget.parse("1%").allowed_drop(50.0) == pytest.approx(0.5)
    assert AccuracyBudget.parse("0").meets(1.0, 1.0, higher_is_better=True)
    assert not AccuracyBudget.parse("-1").meets(1.0, 1.0, higher_is_better=True)
    assert AccuracyBudget.parse("0.1").meets(2.0, 2.05, higher_is_better=False)
    with pytest.raises(ConfigError, match="budget"):
        AccuracyBudget.parse("one")


def test_variant_and_calibration_names() -> None:
    assert parse_variants(["int8-static", "INT4"]) == (Variant.INT8_STATIC, Variant.INT4)
    with pytest.raises(ConfigError, match="int9"):
        parse_variants(["int9"])
    with pytest.raises(ConfigError, match="mixed"):
        parse_variants(["mixed"])
    with pytest.raises(ConfigError, match="kl"):
        parse_calibrations(["kl"])
    with pytest.raises(ConfigError, match="percentile"):
        OptimizeSettings(percentile=20.0)


def curve(*points: tuple[int, float]) -> list[CurvePoint]:
    return [CurvePoint(b, p99 * 0.8, p99, b * 1000.0 / p99) for b, p99 in points]


def test_tune_settings_are_parsed_once_into_what_builds_and_what_searches(
        tmp_path: Path) -> None:
    built = tune_optimize_settings(max_accuracy_drop="1%", variants=["int8-static"],
                                   calib_data=tmp_path, calib_count=64)
    search = tune_settings_from(slo_p99_ms=5, threads=[2], prune=0.3, prune_epochs=1)
    assert built.variants == (Variant.INT8_STATIC,)
    assert built.calib_data == tmp_path and built.calib_count == 64
    assert built.budget == AccuracyBudget(1.0, relative=True)
    assert built.measure == TUNE_MEASURE
    assert search.slo_p99_ms == 5.0
    assert search.batch_sizes == BATCH_SIZES and search.threads == (2,)
    assert search.engines == () and search.prune == PruneRequest(0.3, 1)


def test_tune_settings_need_a_budget_a_positive_slo_and_known_engines() -> None:
    with pytest.raises(ConfigError, match="budget"):
        check_tune_budget(OptimizeSettings())
    with pytest.raises(ConfigError, match="SLO"):
        tune_settings_from(slo_p99_ms=0)
    with pytest.raises(ConfigError, match="tpu"):
        tune_settings_from(slo_p99_ms=5, engines=["tpu"])
    with pytest.raises(ConfigError, match="batch sizes"):
        tune_settings_from(slo_p99_ms=5, batch_sizes=[])


def test_batching_picks_highest_throughput_inside_the_slo() -> None:
    plan = plan_batching(curve((1, 1.0), (4, 2.0), (16, 4.0), (32, 9.0)), slo_ms=10.0)
    assert plan.max_batch_size == 16  # 2 x 4 ms fits 10 ms; 2 x 9 ms does not
    assert plan.max_queue_delay_ms == pytest.approx(2.0)
    assert plan.meets_slo


def test_batching_off_when_only_single_requests_fit() -> None:
    plan = plan_batching(curve((1, 3.0), (4, 6.0)), slo_ms=8.0)
    assert (plan.max_batch_size, plan.max_queue_delay_ms, plan.meets_slo) == (0, 0.0, True)
    assert not plan_batching(curve((1, 9.0)), slo_ms=8.0).meets_slo


def test_float_order_starts_with_first_and_last() -> None:
    layers = ("a", "b", "c", "d", "e")
    assert float_order(layers, ["c", "a", "d"]) == ["a", "e", "c", "d", "b"]


def test_search_is_bisection_and_finds_the_fewest_float_layers() -> None:
    calls: list[int] = []

    def evaluate(k: int) -> float:
        calls.append(k)
        return 90.0 + k  # each float layer gives back one point

    k, steps = search([f"l{i}" for i in range(64)], evaluate, 90.0, lambda v: v >= 127.0)
    assert k == 37
    assert len(calls) <= 2 + 7  # first+last, the upper bound, then log2(64) probes
    assert steps[0].meets is False


def test_search_says_none_when_nothing_meets() -> None:
    k, steps = search(["a", "b", "c", "d"], lambda k: 0.0, 0.0, lambda v: v > 1.0)
    assert k is None
    assert {s.float_layers for s in steps} == {0, 2, 3}


def test_conform_names_the_input() -> None:
    good = np.zeros((3, 1, 8, 8), np.float64)
    assert conform({"input": good}, SPECS)["input"].dtype == np.float32
    with pytest.raises(InvalidInputError, match="'pixels'"):
        conform({"pixels": good}, SPECS)
    with pytest.raises(InvalidInputError, match=r"'input' has shape \[3, 1, 9, 9\]"):
        conform({"input": np.zeros((3, 1, 9, 9), np.float32)}, SPECS)
    with pytest.raises(InvalidInputError, match="'input' is int64"):
        conform({"input": np.zeros((3, 1, 8, 8), np.int64)}, SPECS)


def test_user_data_from_npz_and_folder(tmp_path: Path) -> None:
    array = np.ones((2, 1, 8, 8), np.float32)
    np.savez(tmp_path / "calib.npz", input=array)
    (tmp_path / "folder").mkdir()
    np.save(tmp_path / "folder" / "input.npy", array)
    for source in (tmp_path / "calib.npz", tmp_path / "folder"):
        assert read_user_data(source)["input"].shape == (2, 1, 8, 8)
    with pytest.raises(ConfigError, match=r"expected an \.npz"):
        read_user_data(tmp_path / "missing.npz")


def test_uniform_chunks_keep_run_sizes_equal_within_a_call() -> None:
    chunks = list(uniform_chunks(70, 16))
    assert chunks == [(0, 64), (64, 70)]
    assert list(uniform_chunks(5, 1)) == [(0, 5)]
